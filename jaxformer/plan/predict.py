"""Step time of a strategy: compute from the contractions and the memory-bound bytes, communication from the
collectives (alpha-beta), the pipeline bubble, and the overlap assumed per strategy.

    step = layers + heads + embedding + optimizer + exposed communication

* layers: per layer pass (one microbatch through one layer), its GEMMs at the GEMM cost, flash attention's
  matmuls at `FLASH_EFFICIENCY` of that rate (its measured speed), its memory-bound bytes (`layer_bytes`) at the
  copy rate (under the XLA kernels also arithmetic-bound time, `layer_alu_seconds`); forward once, backward as two
  GEMMs per forward GEMM and the backward bytes, full remat adding a forward. The plain stack runs L passes on the
  local batch; a pipeline runs r m + p - 1 ticks of L/(p r) layers on one microbatch, its p - 1 bubble ticks on
  filler data (jaxformer/pipeline.py), so the bubble is part of the layer time (a Megatron-style stage idles there
  instead: the same time). jaxformer's tick loop also moves its stacked residuals and its float32 gradient
  accumulator through memory on every tick (`tick_loop_bytes`), and its inner layer scan copies each layer's
  weights and writes its gradient on every layer pass (`scan_weight_bytes`), both counted from the compiled program
  (`pipeline_overhead`).
* launching: inside while loops (the pipeline's tick loops and layer scans, the remat scan) XLA launches each
  kernel from the host, and the GPU waits for each launch: every kernel launched in a loop adds the measured time
  per launch (`Hardware.launch_time`; the pipeline run's profile: 20.2 ms of idle GPU over 6,669 loop launches,
  perfmodel.md). The straight line outside loops runs as CUDA graphs, where launching hides behind the kernels; a
  step never takes less than launching all its operators one after another.
* overlap (assumptions): nothing hides by default. The data-parallel gradient all-reduce was measured not
  overlapped in this XLA (benchmarks/results/distributed-2xh200.md, "Data parallelism: where the remaining time
  goes": the async pair is made synchronous), and fsdp=2 ran as fast as data=2 with the same bytes on the wire ("The
  meshes now": 42.22 against 42.40 ms), so its gathers and reduce-scatters are counted exposed too; pipeline
  shifts and tensor parallelism's forward all-reduces sit on the critical path by construction. Tensor
  parallelism's backward all-reduces are assumed to overlap: each block's (attention, FFN) input-gradient sum
  depends on its first GEMM's input gradient, not on that GEMM's weight gradient (checked in XLA's compiled CPU
  step, tests/test_plan.py), so it runs beside the weight-gradient GEMM and only its excess over that GEMM is
  charged. `overlap_grads=True` assumes that the batch axes' gradient and weight traffic hides behind the layers'
  compute (as PyTorch DDP/FSDP bucketing achieves), exposed only beyond it.
"""

from __future__ import annotations

import dataclasses
import math

from . import comm as _comm
from . import memory as _memory
from .hardware import Hardware
from .workload import Backend, GPU, Strategy, Workload, attention_in_kernel, head_gemms, layer_gemms, local_params

# Flash attention runs its matmuls (forward + backward, 3.5 times the forward's 4 B S^2 D flop) at 158 TFLOP/s at
# S=128 and 200 at S=512 on an H200 (kernels-h200.md, "Attention": not bound by its bytes), 22% and 28% of the GEMM
# rate; log-linear in S between, and its time is that alone (its bytes are inside it).
FLASH_EFFICIENCY = {128: 0.22, 512: 0.28}


def flash_efficiency(seq: int) -> float:
    (s0, e0), (s1, e1) = sorted(FLASH_EFFICIENCY.items())
    x = min(max((math.log2(seq) - math.log2(s0)) / (math.log2(s1) - math.log2(s0)), -1.0), 1.0)
    return e0 + x * (e1 - e0)
OPTIMIZER_BYTES = 36.0  # per parameter: AdamW, clip norm, the non-finite guard, fused (datamovement-h200.md: 9.7 GB
# of element-wise work outside the layers for BERT-large's 335M parameters, ~29 B, plus the gradients' cast)

# The XLA kernels' memory-bound layer work, per token and layer (forward + backward): bytes at the copy rate plus
# arithmetic-bound time (threefry dropout bits, softmax, erf), in multiples of D (whole), D/tp, F/tp and (N/tp) S.
# Fitted to BERT-large's one-GPU steps with --kernels xla on an H200 and an H100 (train-h200.md "The step now",
# kernels-h100.md "Train step, BERT-large"): the H100 (30% less bandwidth, the same SMs) is only 5-7 ms slower, so
# about 34 GB of the step's element-wise work is bandwidth-bound and the rest is not (S=128 -> 512 adds ~14 ms on
# both GPUs).
# Gradient compression's own work at the copy bandwidth, fitted to H200 measurements (BERT-large;
# benchmarks/results/compression.md): the sampled selection, 2.46 ms over 336 M sparse entries at density 0.01 on one
# GPU (bytes per sparse entry; the former compaction, selection.select_reference, took 20.4-20.6 ms: 264 bytes), and
# the rest of the transform (accumulate into the residual, pack, unpack, keep), the exact-selection transform's 126.8
# ms less its selection's 118.8 on data=2 (bytes per gradient entry), measured before the transform stopped copying
# the sparse leaves into one flat vector: not measured since (it needs two GPUs), so an upper bound.
SELECTION_BYTES = 31.5
COMPRESSION_BYTES = 103.0
XLA_BYTES = dict(d=70.0, d_tp=30.0, f=17.0)
XLA_ALU_PS = dict(d=40.0, d_tp=15.0, nt=11.3)  # picoseconds per element on an H100/H200 (Hardware.alu_scale)


def layer_bytes(w: Workload, s: Strategy, e: int) -> tuple[float, float]:
    """(forward, backward) memory-bound bytes per token of one layer pass (each operator reads its inputs and writes
    its outputs once). Pallas: each BDRLN reads its row input and residual and writes its output and statistics
    (backward: the gradient, two saved rows, writes two gradients); bias+GELU reads and writes F values (backward:
    three); the residual gradients are added by XLA (read two, write one); at S > 128 XLA adds the Q/K/V bias
    (jaxformer/ops.py). Flash attention is timed by its flop (`FLASH_EFFICIENCY`)."""
    cfg = w.model
    D, Dt, Ft = cfg.hidden_size, cfg.hidden_size / s.tp, cfg.intermediate_size / s.tp
    if s.kernels == "xla":
        total = XLA_BYTES["d"] * D + XLA_BYTES["d_tp"] * Dt + XLA_BYTES["f"] * Ft
        return total / 3, 2 * total / 3
    bias = 2 * 3 * Dt * e if w.seq_len > 128 else 0.0
    fwd = 2 * (3 * D * e + 8) + 2 * Ft * e + bias
    bwd = 2 * (5 * D * e + 8) + 2 * 3 * D * e + 3 * Ft * e + bias
    return fwd, bwd


# jaxformer/pipeline.py's tick loop moves more bytes than the plain layer loop, counted from its compiled program
# (the tick loop's own operators in XLA's CPU HLO, tests/test_plan.py): every stacked residual passes four more
# times through memory (forward: copied out of the inner layer scan's stack, written into the tick loop's stack;
# backward: sliced out of it, copied into the inner scan's layout), read and written each time; every tick
# zero-fills the stage's float32 layer gradient and adds it into the accumulator (write 4, read 8, write 4 bytes per
# parameter); the state and buffer slices move six microbatch activations per tick. Outside the loops the stacks
# are zero-filled and partly copied between the forward and the backward loop: about one byte moved per stacked
# byte (1.09-1.16 in the CPU HLO, its bf16-to-float32 converts of whole stacks aside).
TICK_RESIDUAL_PASSES = 4
TICK_GRAD_BYTES = 16
TICK_STACK_OUTSIDE = 1.0


def tick_loop_bytes(w: Workload, s: Strategy, backend: Backend = GPU) -> float:
    """Bytes per step the tick loop moves beyond its layers' own work (0 outside jaxformer's pipeline)."""
    if not s.pipelined or s.megatron:
        return 0.0
    cfg = w.model
    bm = w.global_batch // (s.dp * s.fsdp) // s.microbatches
    residuals = _memory.tick_residuals(w, s, backend)
    grads = local_params(cfg, s, "layer") * TICK_GRAD_BYTES * s.ticks
    state = s.ticks * 6 * bm * w.seq_len * cfg.hidden_size * backend.compute_bytes
    return (2 * TICK_RESIDUAL_PASSES + TICK_STACK_OUTSIDE) * residuals + grads + state


# Inside a tick, the inner layer scan moves each layer weight through memory three more times per layer pass (the
# operators XLA runs once per layer and tick on weight-shaped buffers, tests/test_plan.py): its compute-dtype copy
# is made forward and again backward (read float32, write the compute dtype), and its float32 gradient is written
# into the chunk's stacked gradient (read, write). The plain layer loop fuses the slices into the GEMMs and reads the
# compute copy that the previous step's update wrote (steps.Steps.carries_copy).
SCAN_WEIGHT_COPIES = 2
SCAN_WEIGHT_GRAD_BYTES = 8


def scan_weight_bytes(w: Workload, s: Strategy, backend: Backend = GPU) -> float:
    """Bytes per step the pipeline's inner layer scan moves on the layer weights (0 outside jaxformer's pipeline)."""
    if not s.pipelined or s.megatron:
        return 0.0
    per_element = SCAN_WEIGHT_COPIES * (4 + backend.compute_bytes) + SCAN_WEIGHT_GRAD_BYTES
    return s.ticks * local_params(w.model, s, "layer") * per_element  # ticks x k passes of W_stage / k each


def tick_loop_bytes_inside(w: Workload, s: Strategy, backend: Backend = GPU) -> float:
    """The part of `tick_loop_bytes` moved inside the tick loops (what runs once per tick)."""
    return tick_loop_bytes(w, s, backend) - TICK_STACK_OUTSIDE * _memory.tick_residuals(w, s, backend)


# Operators that launch work per step (`jaxformer.hlo_analysis.Report.launches`: not the instructions that only name
# buffers, nor the waits of asynchronous ones), from compiled GPU programs of BERT-large with the Pallas kernels
# (jax 0.11.2, 2026-11-28): the plain layer loop launches 839 (~31 per layer, ~95 outside the layers); jaxformer's
# pipeline (pp=2, 4 microbatches) 6,881: 100 per layer pass in its inner layer scans, 105 per tick in its tick loops,
# 12 per stage layer in loops over the stage's layers, 212 outside loops. No GPU program of the XLA kernels or of
# full remat (its layers in the remat scan's loop) was counted: they are taken to launch as many per layer.
LAUNCHES_PER_LAYER = 31
LAUNCHES_OUTSIDE = 95
PIPELINE_LAUNCHES = dict(layer_pass=100, tick=105, stage_layer=12, outside=212)


def launched_ops(w: Workload, s: Strategy) -> tuple[float, float]:
    """(operators launched inside while loops, in the straight line) per step."""
    cfg = w.model
    if not s.pipelined:
        layers = LAUNCHES_PER_LAYER * cfg.num_hidden_layers
        return (layers, LAUNCHES_OUTSIDE) if s.remat != "none" else (0.0, LAUNCHES_OUTSIDE + layers)
    if s.megatron:  # each stage runs its layers once per microbatch
        return 0.0, LAUNCHES_OUTSIDE + LAUNCHES_PER_LAYER * cfg.num_hidden_layers // s.pp * s.microbatches
    k = cfg.num_hidden_layers // (s.pp * s.repeats)
    p = PIPELINE_LAUNCHES
    loop = s.ticks * (k * p["layer_pass"] + p["tick"]) + p["stage_layer"] * cfg.num_hidden_layers // s.pp
    return loop, p["outside"]


def layer_alu_seconds(w: Workload, s: Strategy, hw: Hardware) -> float:
    """Arithmetic-bound seconds per token of one layer pass under the XLA kernels (forward + backward)."""
    if s.kernels != "xla":
        return 0.0
    cfg = w.model
    ps = (XLA_ALU_PS["d"] * cfg.hidden_size + XLA_ALU_PS["d_tp"] * cfg.hidden_size / s.tp
          + XLA_ALU_PS["nt"] * cfg.num_attention_heads / s.tp * w.seq_len)
    return ps * 1e-12 * hw.profile.alu_scale


@dataclasses.dataclass
class Prediction:
    workload: Workload
    strategy: Strategy
    feasible: bool
    reason: str
    step_time_s: float = 0.0
    compute_s: float = 0.0  # layers (bubble included), heads, embedding, optimizer
    comm_s: float = 0.0  # exposed communication
    bubble_s: float = 0.0  # the part of compute_s spent on bubble ticks
    comm_bytes: float = 0.0  # bytes each device sends per step
    memory: _memory.Memory | None = None
    collectives: list = dataclasses.field(default_factory=list)
    breakdown: dict = dataclasses.field(default_factory=dict)
    notes: list = dataclasses.field(default_factory=list)

    @property
    def seq_per_s(self) -> float:
        return self.workload.global_batch / self.step_time_s if self.step_time_s else 0.0

    @property
    def bubble(self) -> float:
        return self.strategy.bubble

    def to_dict(self) -> dict:
        s = self.strategy
        mem = self.memory.to_dict() if self.memory else None
        return dict(s.to_dict(), gpus=s.gpus, label=s.label(), feasible=self.feasible, reason=self.reason,
                    step_time_s=self.step_time_s, seq_per_s=self.seq_per_s, compute_s=self.compute_s,
                    comm_s=self.comm_s, bubble_s=self.bubble_s, bubble=self.bubble, comm_bytes=self.comm_bytes,
                    comm_by_kind=_comm.by_kind(self.collectives) if self.collectives else {},
                    memory_bytes=mem, breakdown=self.breakdown, notes=self.notes)


def _span(axis: str, s: Strategy) -> int:
    """Consecutive device indices a group of `axis` spans (mesh order pipeline, data, fsdp, tensor)."""
    inner = {"tensor": s.tp, "fsdp": s.tp * s.fsdp, "data": s.tp * s.fsdp * s.dp,
             "data+fsdp": s.tp * s.fsdp * s.dp, "pipeline": s.gpus}
    return inner[axis]


def comm_times(colls, s: Strategy, hw: Hardware, layers: int) -> list[tuple]:
    """(collective, seconds per step) pairs. Bandwidth is paid per byte; latency per message, where XLA's
    combiner sends a step's parameter traffic of one kind as one message per layer trip (the stacked layer
    tensors, L trips in the plain loop) plus one for the rest (distributed-2xh200.md, "Data parallelism: where the
    remaining time goes": one all-reduce per layer trip for the layer's weights)."""
    out, charged = [], set()
    for c in colls:
        span = _span(c.axis, s)
        full = hw.collective_time(c.kind, c.bytes, c.group, span)
        if not c.overlap:
            out.append((c, c.count * full))
            continue
        alpha = hw.collective_time(c.kind, 0.0, c.group, span)
        key = (c.kind, c.axis, c.count, c.layer)
        messages = 0.0 if key in charged else c.count * (layers if c.layer and not s.pipelined else 1)
        charged.add(key)
        out.append((c, c.count * (full - alpha) + messages * alpha))
    return out


def predict(w: Workload, s: Strategy, hw: Hardware, backend: Backend = GPU, overlap_grads: bool = False
            ) -> Prediction:
    """The step time and memory of `s` (assumed feasible: see `search.check`)."""
    cfg, e = w.model, backend.compute_bytes
    b = w.global_batch // (s.dp * s.fsdp)
    bm = b // s.microbatches
    k = cfg.num_hidden_layers // (s.pp * s.repeats)
    passes = s.ticks * k if s.pipelined else cfg.num_hidden_layers
    tokens = (bm if s.pipelined else b) * w.seq_len
    batch = bm if s.pipelined else b

    # -- one layer pass
    fwd_gemm = bwd_gemm = 0.0
    weight_grad = {}  # one weight-gradient GEMM of each layer contraction, seconds
    for g in layer_gemms(cfg, tokens, batch, w.seq_len, s):
        if attention_in_kernel(g, s):
            t = g.flop / (hw.gemm_rate * flash_efficiency(w.seq_len))
            fwd_gemm, bwd_gemm = fwd_gemm + t, bwd_gemm + 2.5 * t  # flash backward: 5 matmuls for the forward's 2
        else:
            weight_grad[g.name] = hw.gemm_time(g.flop, width=cfg.hidden_size)
            fwd_gemm += weight_grad[g.name]
            bwd_gemm += 2 * weight_grad[g.name]
    fb, bb = layer_bytes(w, s, e)
    alu = layer_alu_seconds(w, s, hw) * tokens
    fwd = fwd_gemm + hw.memory_time(fb * tokens) + alu / 3
    bwd = bwd_gemm + hw.memory_time(bb * tokens) + 2 * alu / 3
    recompute = fwd if s.remat == "full" else 0.0
    layer_pass = fwd + bwd + recompute
    layers = passes * layer_pass
    pipeline_overhead = hw.memory_time(tick_loop_bytes(w, s, backend) + scan_weight_bytes(w, s, backend))
    bubble_s = layers * (s.pp - 1) / s.ticks if s.pipelined else 0.0

    # -- heads, embedding, optimizer (heads and embeddings replicated over pipeline stages)
    rows = b * w.masked
    vocab = cfg.padded_vocab_size // s.tp
    heads = sum(3 * hw.gemm_time(g.flop, width=cfg.hidden_size) for g in head_gemms(cfg, b, w.masked, s))
    if s.kernels == "pallas" and s.tp == 1:  # fused loss: the decoder GEMM again in the backward, bf16 d_logits
        heads += (hw.gemm_time(2.0 * rows * vocab * cfg.hidden_size, width=cfg.hidden_size)
                  + hw.memory_time(3 * rows * vocab * e))
    else:  # float32 logits: written, read by logsumexp, label pick, argmax, softmax gradient, two GEMMs
        heads += hw.memory_time(7 * rows * vocab * 4)
    table = vocab * cfg.hidden_size * 4 / s.fsdp
    embedding = hw.memory_time(b * w.seq_len * cfg.hidden_size * (3 * 4 + 2 * e) + 2 * table)
    optimizer = hw.memory_time(local_params(cfg, s) * OPTIMIZER_BYTES)
    compression = 0.0
    if s.density is not None and s.dp > 1:
        layout = _comm.exchange_layout(w, s)
        compression = hw.memory_time(SELECTION_BYTES * layout.n_sparse
                                     + COMPRESSION_BYTES * (layout.n_sparse + layout.n_dense))
    compute = layers + pipeline_overhead + heads + embedding + optimizer + compression

    # -- communication
    colls = _comm.collectives(w, s, backend)
    hidden = exposed = beside = 0.0
    for c, t in comm_times(colls, s, hw, cfg.num_hidden_layers):
        if c.behind:  # runs beside its block's weight-gradient GEMM: only the excess is exposed
            excess = c.count * max(0.0, t / c.count - weight_grad.get(c.behind, 0.0))
            exposed, beside = exposed + excess, beside + t - excess
        elif c.overlap and overlap_grads:
            hidden += t
        else:
            exposed += t
    exposed += max(0.0, hidden - layers)  # fsdp's traffic beyond what the layers' compute can hide
    loop_ops, straight_ops = launched_ops(w, s)
    launch = hw.launch_time(loop_ops, straight_ops)
    loop_idle = hw.launch_time(loop_ops, 0.0)  # a loop's kernels each wait for their launch (measured: perfmodel.md)
    step = max(compute + exposed + loop_idle, launch)
    notes = []
    if s.fsdp > 1 and (s.pp > 1 or (s.dp > 1 and s.tp > 1)):
        notes.append("fsdp with pipeline or data+tensor: XLA adds resharding the model does not count")
    pred = Prediction(w, s, True, "", step_time_s=step, compute_s=compute, comm_s=exposed, bubble_s=bubble_s,
                      comm_bytes=sum(c.wire_bytes for c in colls), memory=_memory.memory(w, s, backend),
                      collectives=colls, notes=notes,
                      breakdown=dict(layers_s=layers, pipeline_overhead_s=pipeline_overhead, heads_s=heads,
                                     embedding_s=embedding, optimizer_s=optimizer, compression_s=compression,
                                     comm_hidden_s=hidden, comm_beside_gemm_s=beside, launch_s=launch,
                                     loop_idle_s=loop_idle,
                                     launched_ops=loop_ops + straight_ops,
                                     layer_pass_s=layer_pass, layer_passes=passes))
    return pred
