"""Memory per device of one train step: parameters, gradients, optimizer state, activations, temporaries.

The step's peak is at one of two moments (steps.Steps._train_step):

* the start of the backward pass: parameters, AdamW moments, the layers' compute-dtype weight copy (or, under fsdp,
  every gathered weight: XLA keeps them from the forward to the backward), every saved activation, and the MLM
  head's working set (its logits and their gradient, the tied embedding's gradient);
* the optimizer update: parameters, moments and float32 gradients (the activations are gone).

Saved activations per token and layer (`Activations`) are counted from what the step keeps for the backward:
inside a pipeline (a `lax.scan` over ticks, jaxformer/pipeline.py) exactly the residuals JAX saves (its jaxpr:
tests/test_plan.py compares with `jax.ad_checkpoint`'s list), one set per tick, bubble ticks included; in the plain
layer loop what XLA keeps after fusing (it recomputes cheap element-wise values), fitted per backend to compiled
memory (benchmarks/results/perfmodel.md, "Against the compiled train step"). Under `remat="full"` only the layer
inputs are kept, plus one layer's set while it is recomputed; `"dots"` keeps the contraction outputs (the model
runs its layers in a scan under remat). Where the layers run in a compiled loop (the remat scan, the pipeline's
ticks) the backward's peak is the larger of the heads' moment and the loop's first trip, which carries its stacked
gradients (`scan_backward`, `tick_loop_backward`). A Megatron-style pipeline's stages: `stage_memories`.
"""

from __future__ import annotations

import dataclasses

from .workload import Backend, GPU, Strategy, Workload, local_params, parameters, local_shape

F32 = 4


@dataclasses.dataclass(frozen=True)
class Activations:
    """Bytes kept per token per layer: `d` x D (whole under tensor parallelism) + `d_tp` x D/tp + `f` x F/tp +
    `nt` x (N/tp) S (attention scores) + `n` x N/tp + `const`. Coefficients in units of the compute dtype where
    `scaled` (they double where the backend stores bf16 as float32), else bytes."""

    d: float
    d_tp: float
    f: float
    nt: float
    n: float
    const: float

    def per_token(self, cfg, seq: int, tp: int) -> float:
        return (self.d * cfg.hidden_size + self.d_tp * cfg.hidden_size / tp + self.f * cfg.intermediate_size / tp
                + self.nt * cfg.num_attention_heads / tp * seq + self.n * cfg.num_attention_heads / tp + self.const)


def _jaxpr_xla(e: int) -> Activations:
    """The XLA-kernel layer's residuals as JAX saves them (jaxformer/layer.py with pallas_kernels/*/reference.py):
    q, k, v and the context (e each), per score the padding mask, the masked scores, their exponentials, the dropout
    mask, the dropped probabilities (1 + 4 + 4 + 1 + 4 bytes) and the probabilities in the compute dtype; per block
    the dropout mask, the dropped output, the centred and normalised values (1 + 4 + 4 + 4) and the output (e); in the
    feed-forward block GELU's three float32 intermediates and its output (e); the layernorm and softmax statistics."""
    return Activations(d=2 * (13 + e), d_tp=4 * e, f=12 + e, nt=14 + e, n=8, const=16)


def _jaxpr_pallas(e: int) -> Activations:
    """The fused kernels' residuals (pallas_kernels/*/__init__.py custom_vjp): the packed q/k/v projection and the
    context (e), flash attention's float32 log-sum-exp per head, per BDRLN its two row inputs (e) and float32 mean
    and rstd, the first block's output (e), bias+GELU's input and output (e), the padding mask (int32 per token)."""
    return Activations(d=5 * e, d_tp=4 * e, f=2 * e, nt=0.0, n=4, const=20)


@dataclasses.dataclass(frozen=True)
class Compiler:
    """What XLA makes of the step's memory on a backend, where the program alone does not say:

    * `loop`: activations the plain layer loop keeps per token and layer under the XLA kernels (after fusion);
    * `tp_extra`: bytes x D more per token and layer under tensor parallelism (the all-reduced block outputs);
    * `embedding`: bytes x D per token the XLA embedding block keeps (the Pallas kernel keeps only statistics);
    * `logit_copies`: logits-sized float32 values alive at the MLM head's softmax gradient and at its decoder GEMMs;
    * `table_copies`: layout copies of the word table the backward GEMMs use.

    Rematerialisation needs nothing here: under `remat` the model runs its layers in a scan (jaxformer/model.py),
    which keeps what the policy says.
    """

    loop: Activations
    tp_extra: float
    embedding: float
    logit_copies: tuple[int, int]
    table_copies: int


# CPU: fitted to XLA's CPU memory analysis of 2- and 4-layer steps at D=256 (per-layer differences give the loop's
# coefficients) and of the tiny preset on one device (perfmodel.md, "Against the compiled train step"); tested on other
# presets and meshes.
# GPU xla: fitted to the one-H200 peaks of BERT-large with the XLA kernels (17.0 GiB at S=128 B=64, 24.8 GiB at
# S=512 B=16: ~7 bytes per score; benchmarks/results/train-h200.md, "The step now"); the rest is assumed (bf16 halves
# the CPU's float32 copies, cuBLAS reads transposed tables in place) until the runs in perfmodel.md confirm it.
COMPILER = {
    "cpu": Compiler(loop=Activations(d=37.0, d_tp=16.0, f=14.0, nt=8.5, n=8, const=16), tp_extra=12.0,
                    embedding=21.0, logit_copies=(4, 2), table_copies=2),
    "gpu": Compiler(loop=Activations(d=12.0, d_tp=8.0, f=8.0, nt=7.0, n=8, const=16), tp_extra=6.0,
                    embedding=8.0, logit_copies=(2, 1), table_copies=0),
}


# The compressed exchange's transform keeps about two float32 copies of a device's gradient shards alive at once
# (the accumulated gradient, which the residual's scatters update in place, and the summed update, both in each
# leaf's own array; jaxformer/compression/transform.py), and two more where it runs inside its shard_map over the
# tensor or fsdp axis: fitted to XLA's CPU memory analysis (test_plan's compression cases, data=4 and
# data=2,tensor=2).
COMPRESSION_COPIES = 2
COMPRESSION_MANUAL_COPIES = 2


def activation_table(backend: Backend, kernels: str, pipelined: bool) -> Activations:
    e = backend.compute_bytes
    if kernels == "pallas":
        return _jaxpr_pallas(e)
    return _jaxpr_xla(e) if pipelined else COMPILER[backend.name].loop


@dataclasses.dataclass(frozen=True)
class Memory:
    """Bytes per device. `temporaries` covers what is neither state nor saved activations at the peak (the MLM head's
    working set, the layers' compute-dtype or gathered weights, pipeline buffers, the batch). `phase` says where the
    peak is: "backward" (start of the backward pass) or "update" (the optimizer step)."""

    params: float
    grads: float
    optimizer: float
    activations: float
    temporaries: float
    phase: str

    @property
    def total(self) -> float:
        return self.params + self.grads + self.optimizer + self.activations + self.temporaries

    def to_dict(self) -> dict:
        return dict(params=self.params, grads=self.grads, optimizer=self.optimizer, activations=self.activations,
                    temporaries=self.temporaries, total=self.total, phase=self.phase)


def batch_bytes(w: Workload, s: Strategy) -> float:
    """The synthetic batch's int32/float32 arrays on one device (jaxformer/data.py synthetic_batch)."""
    b = w.global_batch // (s.dp * s.fsdp)
    return b * (3 * 4 * w.seq_len + 3 * 4 * w.masked + 4)


def saved_activations(w: Workload, s: Strategy, backend: Backend = GPU, with_embedding: bool = True) -> float:
    """Activations kept for the backward pass on one device: the layers' (per `activation_table`) and, unless
    `with_embedding` is False, the embedding block's output."""
    cfg, e = w.model, backend.compute_bytes
    c = COMPILER[backend.name]
    b = w.global_batch // (s.dp * s.fsdp)
    bm = b // s.microbatches
    table = activation_table(backend, s.kernels, s.pipelined)
    per_token = table.per_token(cfg, w.seq_len, s.tp)
    if s.tp > 1 and not s.pipelined and s.kernels == "xla":
        per_token += c.tp_extra * cfg.hidden_size
    if s.sequence_parallel:
        per_token -= (table.d - e) * cfg.hidden_size * (1 - 1 / s.tp)  # the residual stream's values split on S
    embedding = b * w.seq_len * (16 + (c.embedding * cfg.hidden_size if s.kernels == "xla" or s.tp > 1
                                       or s.fsdp > 1 else 0)) if with_embedding else 0.0
    layer_input = cfg.hidden_size * e
    if s.pipelined:
        # one residual set per tick for each layer of the stage's chunk (bubble ticks too: they run on filler)
        sets = s.ticks * cfg.num_hidden_layers // (s.pp * s.repeats)
        tokens = bm * w.seq_len
    else:
        sets, tokens = cfg.num_hidden_layers, b * w.seq_len
    remat = s.remat
    if remat == "full":
        return embedding + tokens * (sets * layer_input + per_token)  # inputs kept, one layer's set rebuilt
    if remat == "dots":  # the contraction outputs: q/k/v, scores, context, the two block outputs, the FFN input
        h, n = cfg.hidden_size, cfg.num_attention_heads / s.tp
        dots = (4 * h / s.tp + 2 * h + cfg.intermediate_size / s.tp) * e + 4 * n * w.seq_len
        return embedding + tokens * sets * dots
    return embedding + tokens * sets * per_token


def head_workspace(w: Workload, s: Strategy, backend: Backend = GPU) -> float:
    """The MLM head's working set in the backward pass, the larger of two moments (from the live buffers of XLA's
    schedule on the CPU, perfmodel.md "Against the compiled train step"):

    * the softmax gradient: the float32 logits (B P V/tp) `logit_copies[0]` times over (logits, probabilities,
      their gradient, a transposed copy), the table's layout copies (`table_copies`), under fsdp the table
      re-gathered for the backward GEMMs;
    * the decoder's weight gradient: `logit_copies[1]` logits-sized values (d_logits and its transpose; none
      left under data parallelism, whose two gradient pieces wait for their all-reduces) with every table-sized
      value: the layout copies, the gradient (its two pieces under data parallelism; whole under fsdp, before its
      reduce-scatter, with the gathered table).

    Under the fused Pallas loss (GPU, tp = 1) the logits never exist: d_logits in the compute dtype instead."""
    cfg = w.model
    b = w.global_batch // (s.dp * s.fsdp)
    rows = b * w.masked
    vocab = cfg.padded_vocab_size // s.tp
    table = vocab * cfg.hidden_size * F32
    c = COMPILER[backend.name]
    copies = c.table_copies * table / s.fsdp
    gathered = table if s.fsdp > 1 else 0.0
    lookup = table if (s.dp > 1 and s.fsdp == 1) else 0.0  # the lookup's gradient piece (data parallelism)
    if s.kernels == "pallas" and s.tp == 1 and backend.name == "gpu":
        return rows * vocab * backend.compute_bytes + copies + gathered + table + lookup
    logits = rows * vocab * F32
    second = 0 if lookup else c.logit_copies[1]
    return max(c.logit_copies[0] * logits + copies + gathered,
               second * logits + copies + gathered + table + lookup)


def weight_copies(w: Workload, s: Strategy, backend: Backend = GPU) -> float:
    """Weights alive besides the float32 parameters at the backward pass: the compute-dtype copy of the stacked
    layer weights (plain loop, steps.Steps._compute_copy), or under fsdp every weight gathered whole and kept from
    the forward to the backward (those gathered twice, the word table and the layernorm scales, are not kept)."""
    e = backend.compute_bytes
    if s.fsdp > 1:
        full = dataclasses.replace(s, fsdp=1)
        return sum(local_elems(t, full) * (e if (t.stacked_weight and not s.pipelined) else F32)
                   for t in parameters(w.model) if "D" in t.letters and t.name != "embeddings/word"
                   and not t.name.endswith("layer_norm/scale"))
    if s.pipelined:
        return 0.0
    return sum(local_elems(t, s) for t in parameters(w.model) if t.stacked_weight) * e


def local_elems(t, s: Strategy) -> int:
    n = 1
    for d in local_shape(t, s):
        n *= d
    return n


def pipeline_buffers(w: Workload, s: Strategy, backend: Backend = GPU) -> float:
    """jaxformer/pipeline.py's state (one microbatch), its input/output buffer (the local batch) and the broadcast
    output (the local batch), in the compute dtype."""
    if not s.pipelined:
        return 0.0
    b = w.global_batch // (s.dp * s.fsdp)
    bm = b // s.microbatches
    return (bm + 2 * b) * w.seq_len * w.model.hidden_size * backend.compute_bytes


def rebuilt_layer(w: Workload, s: Strategy, backend: Backend = GPU) -> float:
    """Under `remat="full"`: the one layer's residual set the backward rebuilds (part of `saved_activations`)."""
    if s.remat != "full":
        return 0.0
    cfg = w.model
    rows = w.global_batch // (s.dp * s.fsdp) // (s.microbatches if s.pipelined else 1)
    per_token = activation_table(backend, s.kernels, s.pipelined).per_token(cfg, w.seq_len, s.tp)
    if s.sequence_parallel:
        per_token -= (activation_table(backend, s.kernels, s.pipelined).d - backend.compute_bytes) \
            * cfg.hidden_size * (1 - 1 / s.tp)
    return rows * w.seq_len * per_token


def layer_grad_stack(w: Workload, s: Strategy, backend: Backend = GPU) -> float:
    """The stacked layer gradient a scan's backward loop carries from its first trip (`[L, ...]` per parameter):
    the compute dtype for the weights differentiated through their compute-dtype copy, float32 for the rest."""
    return sum(local_elems(t, s) * (backend.compute_bytes if t.stacked_weight else F32)
               for t in parameters(w.model) if t.part == "layer")


def scan_backward(w: Workload, s: Strategy, backend: Backend = GPU) -> float:
    """The backward pass's peak when the layers run in a scan (`remat`): the larger of two moments.

    * the heads' backward: the kept activations (layer inputs or contraction outputs), the MLM head's working set
      and the weights' compute-dtype copy; no layer is rebuilt yet;
    * the layer loop's first trip: the kept activations, the rebuilt layer's residuals, the weights' copy, the
      stacked layer gradient the loop carries (allocated whole before its first trip) and the heads' float32
      gradients (the tied word table's among them).

    The unrolled loop (no remat) has no such stack: its layer gradients appear as its activations are freed."""
    acts = saved_activations(w, s, backend)
    copies = weight_copies(w, s, backend)
    table = w.model.padded_vocab_size // s.tp * w.model.hidden_size * F32 / s.fsdp
    heads = acts - rebuilt_layer(w, s, backend) + head_workspace(w, s, backend) + copies
    loop = acts + copies + layer_grad_stack(w, s, backend) + local_params(w.model, s, "head") * F32 + table
    return max(heads, loop)


def tick_residuals(w: Workload, s: Strategy, backend: Backend = GPU) -> float:
    """What jaxformer/pipeline.py's tick loop stacks for the backward: every tick's layer residuals (bubble ticks
    included), without the embedding's and without the layer `remat="full"` rebuilds."""
    return saved_activations(w, s, backend, with_embedding=False) - rebuilt_layer(w, s, backend)


def tick_loop_backward(w: Workload, s: Strategy, backend: Backend = GPU) -> float:
    """The backward pass's peak under jaxformer/pipeline.py, the larger of two moments (its state and buffers in
    both):

    * the heads' backward: every tick's residuals and the MLM head's working set;
    * the tick loop's first backward trip: every tick's residuals, the tick's residuals sliced out of the stack
      (a copy: the inner layer scan takes them in its own layout), the layer `remat` rebuilds, the stage's float32
      layer gradient accumulator with the tick's own stacked gradient, and the heads' float32 gradients."""
    acts = saved_activations(w, s, backend)
    buffers = pipeline_buffers(w, s, backend)
    table = w.model.padded_vocab_size // s.tp * w.model.hidden_size * F32 / s.fsdp
    heads = acts - rebuilt_layer(w, s, backend) + head_workspace(w, s, backend) + weight_copies(w, s, backend)
    loop = (acts + tick_residuals(w, s, backend) / s.ticks + 2 * local_params(w.model, s, "layer") * F32
            + local_params(w.model, s, "head") * F32 + table + weight_copies(w, s, backend))
    return max(heads, loop) + buffers


def memory(w: Workload, s: Strategy, backend: Backend = GPU) -> Memory:
    """The peak memory of one device (of the fullest stage, for a Megatron-style pipeline)."""
    if s.megatron:
        return max(stage_memories(w, s, backend), key=lambda m: m.total)
    n = local_params(w.model, s)
    acts = saved_activations(w, s, backend)
    backward = (acts + head_workspace(w, s, backend) + weight_copies(w, s, backend)
                + pipeline_buffers(w, s, backend))
    if s.remat != "none" and not s.pipelined:
        backward = scan_backward(w, s, backend)
    elif s.pipelined:
        backward = tick_loop_backward(w, s, backend)
    table = w.model.padded_vocab_size // s.tp * w.model.hidden_size * F32 / s.fsdp
    # the update: every float32 gradient (the global-norm clip needs all of them), the word table's second
    # gradient piece under data parallelism, one table-sized temporary of the update
    update_extra = table * (2 if (s.dp > 1 and s.fsdp == 1) else 1)
    compressed = s.density is not None and s.dp > 1
    if compressed:  # the transform's float32 vectors (fitted on the CPU: test_plan's compression cases)
        update_extra += (COMPRESSION_COPIES + (COMPRESSION_MANUAL_COPIES if s.tp > 1 or s.fsdp > 1 else 0)) * n * F32
    # with compression the optimizer state holds the exchange's residual too: one float32 per parameter shard
    return _peak(n, acts, backward, update_extra, batch_bytes(w, s), 3 if compressed else 2)


def _peak(n: float, acts: float, backward: float, update_extra: float, other: float, state: int = 2) -> Memory:
    params, optimizer, grads = n * F32, state * n * F32, n * F32
    if backward >= grads + update_extra:
        return Memory(params, 0.0, optimizer, acts, backward - acts + other, "backward")
    return Memory(params, grads, optimizer, 0.0, update_extra + other, "update")


def stage_memories(w: Workload, s: Strategy, backend: Backend = GPU, layers: list[int] | None = None
                   ) -> list[Memory]:
    """Memory of each stage of a Megatron-style pipeline whose stage i holds `layers[i]` layers (default: L/p
    each): the first stage also holds the embeddings, the last the heads and a copy of the tied word table; under
    1F1B stage i keeps the activations of min(m, p - i) microbatches, the last stage the MLM head's working set."""
    cfg, e, p = w.model, backend.compute_bytes, s.pp
    layers = layers or [cfg.num_hidden_layers // p] * p
    if len(layers) != p or sum(layers) != cfg.num_hidden_layers:
        raise ValueError(f"layers={layers} must give each of the {p} stages its layers ({cfg.num_hidden_layers})")
    flat = dataclasses.replace(s, pp=1, microbatches=1, repeats=1, pipeline_style="jaxformer")
    per_layer = local_params(cfg, flat, "layer") / cfg.num_hidden_layers
    embed, head = local_params(cfg, flat, "embed"), local_params(cfg, flat, "head")
    table = cfg.padded_vocab_size // s.tp * cfg.hidden_size // s.fsdp
    micro = Workload(cfg, w.seq_len, w.global_batch // s.microbatches)  # one microbatch's rows
    tokens = micro.global_batch // (s.dp * s.fsdp) * w.seq_len
    act = activation_table(backend, s.kernels, True).per_token(cfg, w.seq_len, s.tp)
    emb_act = (COMPILER[backend.name].embedding * cfg.hidden_size if s.kernels == "xla" else 0) + 16
    copies_per_layer = sum(local_elems(t, flat) for t in parameters(cfg) if t.stacked_weight) / cfg.num_hidden_layers
    out = []
    for i, k in enumerate(layers):
        n = k * per_layer + (embed if i == 0 else 0) + (head + table if i == p - 1 else 0)
        inflight = min(s.microbatches, p - i)
        if s.remat == "full":
            acts = tokens * (inflight * k * cfg.hidden_size * e + act)
        else:
            acts = tokens * inflight * k * act
        if i == 0:
            acts += tokens * inflight * emb_act
        work = head_workspace(micro, flat, backend) if i == p - 1 else 0.0
        backward = acts + work + copies_per_layer * k * e + 2 * tokens * cfg.hidden_size * e
        out.append(_peak(n, acts, backward, 0.0, batch_bytes(micro, flat)))
    return out
