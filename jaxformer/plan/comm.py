"""The collectives of one train step per strategy: which, how large, over which mesh axis, how often.

Counted from what XLA's SPMD partitioner makes of the sharding rules (read off the compiled steps' HLO and tested
against `jaxformer.hlo_analysis` on 8 CPU devices, tests/test_plan.py):

* data / fsdp: every gradient is summed over the batch axes once per step. The tied word embedding's gradient is
  summed as two pieces (its gather's scatter-add and the MLM decoder's GEMM, added after the sum), the position
  table's as its first S rows. Inside a pipeline the layer gradients are summed on every tick, per layer of the
  chunk (the sum sits in the backward tick loop), in float32.
* fsdp (ZeRO-3 on D): each weight is all-gathered once per step (the word embedding and the layernorm scales twice:
  forward and backward), its gradient reduce-scattered (XLA's GPU pipeline; the CPU keeps an all-reduce of the whole
  gradient); the embedding lookup moves its rows by two all-to-alls of B S D/fsdp per device and the token ids by an
  all-gather; the [CLS] rows of the pooler and NSP head by four small all-to-alls and two all-gathers (whose
  weight gradients then need no sum). Not modelled: fsdp combined with pipeline, or with data and tensor together,
  where the partitioner adds permutes of whole embedding shards and all-reduces of the MLM logits (tiny config:
  +47 MB of permutes on fsdp=2,pipeline=2; benchmarks/results/perfmodel.md, "Against the compiled train step").
* tensor (Megatron): per layer two all-reduces of the B S D activations forward and two backward (the input
  gradients of the attention and FFN blocks, each independent of its block's first weight-gradient GEMM); the embedding
  lookup on the V-split table one forward; the vocabulary-parallel MLM loss three all-reduces and two all-gathers of
  one number per masked position and one all-reduce of the decoder's input gradient (B P D).
* pipeline: per tick one collective-permute of a microbatch's B S D forward and two backward (the shift's
  transpose is a split and a pad), plus the final shift; the encoder output's broadcast to every stage (float32:
  jnp.sum adds bf16 in float32) and its gradient's sum (compute dtype), one all-reduce of B S D each; with the
  circular schedule, one all-to-all of the stage's layer weights forward and of their gradients backward
  (jaxformer/pipeline.py).
* gradient compression (`Strategy.density`, jaxformer/compression): the gradients' sum over `data` becomes the
  balanced top-k exchange, one all-to-all and one all-gather per step (`compressed_exchange`).
* sequence parallelism (GPU pattern, benchmarks/results/distributed-2xh200.md, "Sequence parallelism"): per layer
  the four all-reduces become reduce-scatters, with seven all-gathers and two all-to-alls.

`Collective.bytes` is the per-device buffer (all-reduce, permute, all-to-all: the buffer; all-gather: the gathered
result; reduce-scatter: the full operand); `hlo_bytes` is what hlo_analysis counts (operands + results).
"""

from __future__ import annotations

import dataclasses
import math

from .workload import Backend, GPU, Strategy, Workload, local_shape, parameters

F32, I32 = 4, 4
# Under fsdp the pooler's and the NSP head's weight gradients are computed from all-gathered activations of the
# whole fsdp group's batch (XLA's choice for these small [CLS] GEMMs), so they are not summed afterwards.
FULL_BATCH_UNDER_FSDP = ("pooler/kernel", "nsp_head/kernel")


@dataclasses.dataclass(frozen=True)
class Collective:
    what: str
    kind: str  # all-reduce, all-gather, reduce-scatter, all-to-all, collective-permute
    bytes: float  # per-device buffer (see the module docstring)
    axis: str  # mesh axis (or "data+fsdp")
    group: int  # devices in the group
    count: float = 1.0  # per step
    overlap: bool = False  # may hide behind the layers' compute (gradient and weight traffic of the batch axes)
    dtype_bytes: int = F32  # bytes per element
    layer: bool = False  # a stacked layer tensor's traffic (XLA sends it per layer trip)
    behind: str = ""  # the layer GEMM whose weight gradient it runs beside (independent of it), if any

    @property
    def hlo_bytes(self) -> float:
        """Operands + results per step, as jaxformer.hlo_analysis counts a collective."""
        n = self.group
        per = {"all-gather": self.bytes / n + self.bytes, "reduce-scatter": self.bytes + self.bytes / n}.get(
            self.kind, 2 * self.bytes)
        return per * self.count

    @property
    def wire_bytes(self) -> float:
        """Bytes each device sends per step (ring algorithms; a permute sends its buffer once)."""
        n = self.group
        frac = {"all-reduce": 2 * (n - 1) / n, "collective-permute": 1.0}.get(self.kind, (n - 1) / n)
        return frac * self.bytes * self.count


def _grad_bytes(t, s: Strategy, backend: Backend) -> int:
    """Bytes of a parameter's gradient where it is summed: compute-dtype copies of the stacked layer weights leave
    their gradients in bf16 (steps.Steps._compute_copy, not inside pipelines), everything else float32."""
    return backend.compute_bytes if (t.stacked_weight and (s.megatron or not s.pipelined)) else F32


def _full_local(t, s: Strategy, w: Workload) -> tuple[int, ...]:
    """`t`'s shard before the fsdp split (tensor and pipeline applied), the position table cut to the S rows used."""
    shape = local_shape(t, dataclasses.replace(s, fsdp=1))
    if t.name == "embeddings/position":
        shape = (w.seq_len,) + shape[1:]
    return shape


def collectives(w: Workload, s: Strategy, backend: Backend = GPU) -> list[Collective]:
    cfg, e = w.model, backend.compute_bytes
    S, D, P = w.seq_len, cfg.hidden_size, w.masked
    b = w.global_batch // (s.dp * s.fsdp)
    bm = b // s.microbatches
    L = cfg.num_hidden_layers
    k = L // (s.pp * s.repeats)  # layers per chunk
    out: list[Collective] = []
    add = out.append
    batch_group, batch_axis = s.dp * s.fsdp, ("data+fsdp" if s.dp > 1 and s.fsdp > 1 else
                                               "fsdp" if s.fsdp > 1 else "data")
    passes = 2 if s.remat == "full" else 1  # forward runs again in the backward

    # -- gradients over the batch axes, and fsdp's gathers
    if batch_group > 1:
        for t in parameters(cfg):
            full = _full_local(t, s, w)
            gdt = _grad_bytes(t, s, backend)
            layer = t.part == "layer"
            nbytes = math.prod(full) * gdt
            sharded = s.fsdp > 1 and "D" in t.letters
            if s.megatron and t.part == "embed" and t.name != "embeddings/word":
                continue  # on the first stage; the last one (heads and the tied table's copy) sends more
            if t.part == "layer" and s.pipelined and not s.megatron:
                # summed per tick and per layer inside the backward loop, one layer at a time
                per_layer = nbytes // full[0]
                add(Collective(f"grad {t.name} (per tick)", "all-reduce", per_layer, batch_axis, batch_group,
                               s.ticks * k, True, gdt, True))
                continue
            if s.fsdp > 1 and t.name in FULL_BATCH_UNDER_FSDP:
                pass  # its gradient is formed from gathered [CLS] activations (the gathers below): no sum
            elif sharded and backend.reduce_scatter:
                add(Collective(f"grad {t.name}", "reduce-scatter", nbytes, "fsdp", s.fsdp, 1, True, gdt, layer))
                if s.dp > 1:
                    add(Collective(f"grad {t.name} (data)", "all-reduce", nbytes / s.fsdp, "data", s.dp, 1, True, gdt,
                                   layer))
            else:
                add(Collective(f"grad {t.name}", "all-reduce", nbytes, batch_axis, batch_group, 1, True, gdt, layer))
            if t.name == "embeddings/word" and s.fsdp == 1 and not s.megatron:
                # the lookup's part too (summed apart from the decoder's); with fsdp it arrives by all-to-all
                add(Collective("grad embeddings/word (lookup)", "all-reduce", nbytes, batch_axis, batch_group, 1,
                               True, gdt))
            if sharded:
                gb = e if (t.stacked_weight and not s.pipelined) else F32
                twice = t.name == "embeddings/word" or t.name.endswith("layer_norm/scale")
                add(Collective(f"gather {t.name}", "all-gather", math.prod(full) * gb, "fsdp", s.fsdp,
                               2 if twice else 1, True, gb, layer))
        if s.fsdp > 1:
            f, bf = s.fsdp, b * s.fsdp  # the fsdp group's batch
            add(Collective("token ids", "all-gather", bf * S * I32, "fsdp", f))
            add(Collective("embedding rows", "all-to-all", b * S * D * F32, "fsdp", f, 2))
            add(Collective("[CLS] rows", "all-to-all", b * D * F32, "fsdp", f, 4))
            add(Collective("pooler gradient", "all-gather", bf * D * F32, "fsdp", f))
            add(Collective("NSP gradient", "all-gather", bf * 2 * F32, "fsdp", f))

    # -- tensor parallelism
    if s.tp > 1:
        layer_passes = (s.repeats * s.microbatches * k if s.megatron else s.ticks * k) if s.pipelined else L
        act = bm * S * D * e
        if s.sequence_parallel:
            add(Collective("layer outputs (reduce-scatter)", "reduce-scatter", act, "tensor", s.tp,
                           layer_passes * (2 * passes + 2)))
            add(Collective("layer inputs (all-gather)", "all-gather", act, "tensor", s.tp,
                           layer_passes * (2 * passes + 5)))
            add(Collective("attention layouts", "all-to-all", act, "tensor", s.tp, layer_passes * 2))
        else:
            add(Collective("layer activations", "all-reduce", act, "tensor", s.tp, layer_passes * 2 * passes))
            # backward: each block's input-gradient sum waits for its first GEMM's input gradient only, so the
            # same GEMM's weight gradient may run beside it (predict.py: only the excess is charged)
            add(Collective("attention input gradient", "all-reduce", act, "tensor", s.tp, layer_passes,
                           behind="qkv"))
            add(Collective("FFN input gradient", "all-reduce", act, "tensor", s.tp, layer_passes, behind="ffn_in"))
        add(Collective("embedding lookup", "all-reduce", b * S * D * F32, "tensor", s.tp))
        add(Collective("MLM decoder input gradient", "all-reduce", b * P * D * F32, "tensor", s.tp))
        add(Collective("vocab-parallel loss", "all-reduce", b * P * F32, "tensor", s.tp, 3))
        add(Collective("vocab-parallel argmax", "all-gather", b * P * s.tp * F32, "tensor", s.tp, 2))

    # -- pipeline
    if s.megatron:
        micro = bm * S * D * e / (s.tp if s.sequence_parallel else 1)
        add(Collective("stage send/receive", "collective-permute", micro, "pipeline", s.pp,
                       2 * s.microbatches * s.repeats))
        table = cfg.padded_vocab_size // s.tp * D // s.fsdp * F32
        add(Collective("tied word table (first and last stage)", "all-reduce", table, "pipeline", 2))
    elif s.pp > 1:
        micro = bm * S * D * e
        add(Collective("stage shift", "collective-permute", micro, "pipeline", s.pp, 3 * (s.ticks + 1)))
        # jnp.sum adds bf16 in float32: the forward broadcast is a float32 all-reduce, its transpose (the input
        # gradient's sum over the stages' copies) stays in the compute dtype
        add(Collective("encoder output broadcast", "all-reduce", b * S * D * F32, "pipeline", s.pp, 1))
        add(Collective("encoder input gradient sum", "all-reduce", b * S * D * e, "pipeline", s.pp, 1))
        if s.repeats > 1:
            stage_layers = sum(math.prod(local_shape(t, s)) for t in parameters(cfg) if t.part == "layer")
            add(Collective("circular weights", "all-to-all", stage_layers * F32, "pipeline", s.pp, 2))

    if s.density is not None and s.dp > 1:
        out = [c for c in _without_data_sums(out, s)] + compressed_exchange(w, s)
    return out


def _without_data_sums(colls: list[Collective], s: Strategy):
    """The collectives left when the gradients' sum over `data` is the compressed exchange: the sums over data alone
    go, those over data and fsdp keep their fsdp part."""
    for c in colls:
        if not c.what.startswith("grad"):
            yield c
        elif c.axis == "data+fsdp":
            yield dataclasses.replace(c, axis="fsdp", group=s.fsdp)
        elif c.axis != "data":
            yield c


def exchange_layout(w: Workload, s: Strategy):
    """The compressed exchange's `Layout` (jaxformer/compression/exchange.py) of one device's gradient shards under
    `s`: every parameter, the stacked layer tensors selected per layer, `CompressionConfig`'s defaults."""
    from ..compression import CompressionConfig
    from ..compression import exchange as ex
    params = parameters(w.model)
    return ex.Layout.build([local_shape(t, s) for t in params], [t.part == "layer" for t in params], s.density,
                           CompressionConfig().min_size)


def compressed_exchange(w: Workload, s: Strategy) -> list[Collective]:
    """The balanced top-k exchange over `data` at `s.density` (jaxformer/compression, its defaults: bf16 values,
    16-bit block offsets): an all-to-all of each rank's fixed-size buffers to the regions' owners, then an all-gather
    of the reduced regions, the dense tensors' slices and the boundary quantiles. Sizes from the exchange's own
    buffers (`exchange.Capacities`), so they equal the compiled step's."""
    import jax.numpy as jnp

    from ..compression import CompressionConfig
    from ..compression.exchange import balanced_buffer_bytes
    cfg = CompressionConfig(density=s.density)
    send, gather = balanced_buffer_bytes(exchange_layout(w, s), s.dp, cfg.value_dtype, cfg.send_slack,
                                         cfg.gather_factor)
    vb, p = jnp.dtype(cfg.value_dtype).itemsize, s.dp
    return [Collective("loss sums and counts", "all-reduce", 6 * F32, "data", p),  # alone: no gradient to ride on
            Collective(f"grad top-k entries to their owners ({s.density:g})", "all-to-all", send, "data", p, 1,
                       False, vb),
            Collective(f"grad top-k reduced regions ({s.density:g})", "all-gather", gather, "data", p, 1, False, vb)]


def by_kind(colls: list[Collective]) -> dict[str, float]:
    """hlo_analysis-style bytes per collective kind per step."""
    out: dict[str, float] = {}
    for c in colls:
        out[c.kind] = out.get(c.kind, 0.0) + c.hlo_bytes
    return out
