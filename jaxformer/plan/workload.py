"""What one train step must do: the workload (a BERT encoder, sequence length, global batch), a parallel strategy,
the parameters each device holds, and the contractions of a step with their shapes.

Everything here is counted from the model's definition (jaxformer/model.py, jaxformer/layer.py) and the sharding
rules (jaxformer/sharding.py), not measured: the letters are DESIGN.md's (B batch, S positions, D width, N heads,
H head width, F ffn width, V padded vocabulary, L layers, P masked positions per sequence).
"""

from __future__ import annotations

import dataclasses
import functools
import math
import types

from .. import sharding
from ..config import KERNELS, REMAT_POLICIES, BertConfig, MeshConfig

PIPELINE_STYLES = ("jaxformer", "megatron")
MASKED_FRACTION = 0.15  # benchmarks/train_step.py scores round(0.15 S) masked positions per sequence


@dataclasses.dataclass(frozen=True)
class Backend:
    """What the compiler does with the program, where it matters to bytes: `compute_bytes` is the size of a
    compute-dtype (bf16) value as the compiled step stores and sends it (XLA's CPU backend computes and moves bf16
    values as float32), `reduce_scatter` whether XLA turns a gradient all-reduce followed by a slice into a
    reduce-scatter (its GPU pipeline does; its CPU pipeline keeps the all-reduce)."""

    name: str
    compute_bytes: int
    reduce_scatter: bool


GPU = Backend("gpu", 2, True)
CPU = Backend("cpu", 4, False)


@dataclasses.dataclass(frozen=True)
class Workload:
    """One train step of `model` on `global_batch` sequences of `seq_len` tokens (MLM at `masked` positions)."""

    model: BertConfig
    seq_len: int
    global_batch: int

    @property
    def masked(self) -> int:
        return max(1, round(MASKED_FRACTION * self.seq_len))

    @property
    def params(self) -> int:
        return sum(math.prod(t.shape) for t in parameters(self.model))


@dataclasses.dataclass(frozen=True)
class Strategy:
    """A parallel strategy: mesh sizes (data, fsdp, tensor, pipeline), the pipeline schedule (`microbatches`,
    `repeats` > 1 for the circular schedule), `remat`, `kernels` ("xla" or "pallas"), Megatron's sequence
    parallelism, and `density`: top-k gradient compression keeping this fraction of each gradient (None: dense)."""

    dp: int = 1
    fsdp: int = 1
    tp: int = 1
    pp: int = 1
    microbatches: int = 1
    repeats: int = 1
    remat: str = "none"
    kernels: str = "pallas"
    sequence_parallel: bool = False
    density: float | None = None
    pipeline_style: str = "jaxformer"

    def __post_init__(self):
        for f in ("dp", "fsdp", "tp", "pp", "microbatches", "repeats"):
            v = getattr(self, f)
            if isinstance(v, bool) or not isinstance(v, int) or v < 1:
                raise ValueError(f"{f}={v!r} must be a positive integer")
        if self.remat not in REMAT_POLICIES:
            raise ValueError(f"remat={self.remat!r} must be one of {REMAT_POLICIES}")
        if self.kernels not in KERNELS[1:]:
            raise ValueError(f"kernels={self.kernels!r} must be one of {KERNELS[1:]}")
        if self.density is not None and not 0.0 < self.density <= 1.0:
            raise ValueError(f"density={self.density!r} must be in (0, 1]")
        if self.pipeline_style not in PIPELINE_STYLES:
            raise ValueError(f"pipeline_style={self.pipeline_style!r} must be one of {PIPELINE_STYLES}")

    @property
    def gpus(self) -> int:
        return self.dp * self.fsdp * self.tp * self.pp

    @property
    def pipelined(self) -> bool:
        """True when the layers run through jaxformer/pipeline.py (stages, microbatches or repeats)."""
        return (self.pp, self.microbatches, self.repeats) != (1, 1, 1)

    @property
    def megatron(self) -> bool:
        """A Megatron-style pipeline (`pipeline_style="megatron"`): embeddings on the first stage, heads and a
        copy of the tied word table on the last, the 1F1B schedule (a stage keeps at most p - i microbatches), idle
        bubbles, gradients summed once per step. What jaxformer/pipeline.py does differently ("jaxformer"): the
        embeddings and heads run on every stage, the encoder output is broadcast to them, bubble ticks compute on
        filler, every tick's residuals are kept, and the batch axes sum the layer gradients on every tick."""
        return self.pipeline_style == "megatron" and self.pp > 1

    @property
    def schedule(self) -> str:
        return "circular" if self.repeats > 1 else "gpipe"

    @property
    def ticks(self) -> int:
        """Pipeline ticks per step, r m + p - 1 (jaxformer/pipeline.py)."""
        return self.repeats * self.microbatches + self.pp - 1

    @property
    def bubble(self) -> float:
        """The idle fraction of a stage: (p - 1) / (r m + p - 1)."""
        return (self.pp - 1) / self.ticks

    def mesh(self) -> MeshConfig:
        return MeshConfig(data=self.dp, fsdp=self.fsdp, tensor=self.tp, pipeline=self.pp)

    def label(self) -> str:
        parts = [f"{k}={v}" for k, v in (("dp", self.dp), ("fsdp", self.fsdp), ("tp", self.tp), ("pp", self.pp))
                 if v > 1] or ["1 GPU"]
        if self.pipelined:
            parts.append(f"m={self.microbatches}" + (f",r={self.repeats}" if self.repeats > 1 else ""))
        if self.sequence_parallel:
            parts.append("sp")
        if self.remat != "none":
            parts.append(f"remat={self.remat}")
        if self.density is not None:
            parts.append(f"topk={self.density:g}")
        if self.megatron:
            parts.append("megatron")
        return " ".join(parts + [self.kernels])

    def to_dict(self) -> dict:
        return dict(dp=self.dp, fsdp=self.fsdp, tp=self.tp, pp=self.pp, microbatches=self.microbatches,
                    repeats=self.repeats, schedule=self.schedule, remat=self.remat, kernels=self.kernels,
                    sequence_parallel=self.sequence_parallel, density=self.density,
                    pipeline_style=self.pipeline_style)


# ----------------------------------------------------------------------------------------------- parameters
@dataclasses.dataclass(frozen=True)
class Tensor:
    """One parameter array: `letters` are its logical axis names (model.py's `out_sharding`, "_" unsplit), `part`
    says where it lives: "embed" (embeddings), "layer" (the stacked encoder layers, leading L) or "head"."""

    name: str
    letters: str
    shape: tuple[int, ...]
    part: str

    @property
    def stacked_weight(self) -> bool:
        """A stacked layer tensor of 3 or more axes: the train step differentiates a compute-dtype copy of these
        (steps.Steps._compute_copy), so their gradients leave the layers in bf16 when nothing is pipelined."""
        return self.part == "layer" and len(self.shape) >= 3


@functools.lru_cache(maxsize=64)
def parameters(cfg: BertConfig) -> tuple[Tensor, ...]:
    """Every parameter of BertForPreTraining with its logical names (jaxformer/model.py, jaxformer/layer.py)."""
    L, D, N, H, F, V = (cfg.num_hidden_layers, cfg.hidden_size, cfg.num_attention_heads, cfg.head_dim,
                        cfg.intermediate_size, cfg.padded_vocab_size)
    emb = [("embeddings/word", "VD", (V, D)), ("embeddings/position", "_D", (cfg.max_position_embeddings, D)),
           ("embeddings/token_type", "_D", (cfg.type_vocab_size, D)),
           ("embeddings/layer_norm/scale", "D", (D,)), ("embeddings/layer_norm/bias", "D", (D,))]
    layer = [("attention/qkv_kernel", "LDCNH", (L, D, 3, N, H)), ("attention/qkv_bias", "LCNH", (L, 3, N, H)),
             ("attention/out_kernel", "LNHD", (L, N, H, D)), ("attention/out_bias", "LD", (L, D)),
             ("attention/layer_norm/scale", "LD", (L, D)), ("attention/layer_norm/bias", "LD", (L, D)),
             ("feed_forward/in_kernel", "LDF", (L, D, F)), ("feed_forward/in_bias", "LF", (L, F)),
             ("feed_forward/out_kernel", "LFD", (L, F, D)), ("feed_forward/out_bias", "LD", (L, D)),
             ("feed_forward/layer_norm/scale", "LD", (L, D)), ("feed_forward/layer_norm/bias", "LD", (L, D))]
    head = [("pooler/kernel", "D_", (D, D)), ("pooler/bias", "D", (D,)),
            ("mlm_head/kernel", "D_", (D, D)), ("mlm_head/bias", "D", (D,)),
            ("mlm_head/layer_norm/scale", "D", (D,)), ("mlm_head/layer_norm/bias", "D", (D,)),
            ("mlm_head/output_bias", "V", (V,)), ("nsp_head/kernel", "D_", (D, 2)), ("nsp_head/bias", "_", (2,))]
    return tuple([Tensor(n, letters, s, "embed") for n, letters, s in emb]
                 + [Tensor("encoder/layers/" + n, letters, s, "layer") for n, letters, s in layer]
                 + [Tensor(n, letters, s, "head") for n, letters, s in head])


def local_shape(t: Tensor, s: Strategy) -> tuple[int, ...]:
    """The shard of `t` one device holds under `s`: sharding.PARAM_RULES applied by sharding.logical_to_spec (an
    axis stays whole where the mesh axis does not divide it)."""
    return _local_shape(t, s.dp, s.fsdp, s.tp, s.pp)


@functools.lru_cache(maxsize=65536)
def _local_shape(t: Tensor, dp: int, fsdp: int, tp: int, pp: int) -> tuple[int, ...]:
    mesh = types.SimpleNamespace(shape={"data": dp, "fsdp": fsdp, "tensor": tp, "pipeline": pp})
    names = tuple(None if c == "_" else c for c in t.letters)
    spec = sharding.logical_to_spec(names, sharding.PARAM_RULES, mesh, t.shape)
    out = []
    for dim, axes in zip(t.shape, tuple(spec) + (None,) * (len(t.shape) - len(spec))):
        axes = () if axes is None else (axes,) if isinstance(axes, str) else axes
        out.append(dim // math.prod(mesh.shape[a] for a in axes))
    return tuple(out)


def local_params(cfg: BertConfig, s: Strategy, part: str | None = None) -> int:
    """Parameters one device holds (of one `part`, or all)."""
    return sum(math.prod(local_shape(t, s)) for t in parameters(cfg) if part in (None, t.part))


def pipeline_local_params(cfg: BertConfig, s: Strategy, part: str | None = None) -> int:
    """Parameters one device holds before the fsdp split (what fsdp gathers): the tensor and pipeline shards."""
    return local_params(cfg, dataclasses.replace(s, fsdp=1, dp=1), part)


# ----------------------------------------------------------------------------------------------- contractions
@dataclasses.dataclass(frozen=True)
class Gemm:
    """`count` contractions of an (m x k) by (k x n) matrix, per device per step (batched ones as a count)."""

    name: str
    m: int
    n: int
    k: int
    count: float = 1.0

    @property
    def flop(self) -> float:
        return 2.0 * self.m * self.n * self.k * self.count


def layer_gemms(cfg: BertConfig, tokens: int, batch: int, seq: int, s: Strategy) -> list[Gemm]:
    """The forward contractions of one encoder layer on `tokens` = `batch` x `seq` rows of one device (tensor
    parallelism splits N and F; sequence parallelism gathers S back before each GEMM, so the shapes are these)."""
    D, F, N, H = cfg.hidden_size, cfg.intermediate_size // s.tp, cfg.num_attention_heads // s.tp, cfg.head_dim
    return [Gemm("qkv", tokens, 3 * N * H, D), Gemm("scores", seq, seq, H, batch * N),
            Gemm("context", seq, H, seq, batch * N), Gemm("attention_out", tokens, D, N * H),
            Gemm("ffn_in", tokens, F, D), Gemm("ffn_out", tokens, D, F)]


def head_gemms(cfg: BertConfig, batch: int, masked: int, s: Strategy) -> list[Gemm]:
    """The forward contractions outside the layer stack on `batch` local sequences: the MLM transform and tied
    decoder at the masked positions (V split over tensor), the pooler and the NSP classifier."""
    D, V = cfg.hidden_size, cfg.padded_vocab_size // s.tp
    rows = batch * masked
    return [Gemm("mlm_transform", rows, D, D), Gemm("mlm_decoder", rows, V, D), Gemm("pooler", batch, D, D),
            Gemm("nsp", batch, 2, D)]


def step_gemms(w: Workload, s: Strategy) -> list[Gemm]:
    """Every contraction one device runs per step, forward and backward (each forward GEMM has two backward ones
    of the same size: the input and the weight gradient), with full remat recomputing the layers' forward.

    Pipelines run every tick on all stages (bubble ticks on filler data, jaxformer/pipeline.py), so a stage's
    layer work is ticks x (its layers per chunk) on one microbatch; the heads run on every stage (replicated over
    `pipeline`). Under `pallas` the attention contractions (scores, context) live inside the flash kernels."""
    cfg = w.model
    b = w.global_batch // (s.dp * s.fsdp)
    bm = b // s.microbatches
    layers_per_chunk = cfg.num_hidden_layers // (s.pp * s.repeats)
    # layer forward passes per device per step: every tick runs one chunk on one microbatch (a Megatron-style
    # stage idles in the bubble instead)
    if s.megatron:
        passes = s.repeats * s.microbatches * layers_per_chunk
    else:
        passes = s.ticks * layers_per_chunk if s.pipelined else cfg.num_hidden_layers
    fwd_mult = 2 if s.remat == "full" else 1  # the forward again inside the backward
    out = []
    for g in layer_gemms(cfg, bm * w.seq_len, bm, w.seq_len, s):
        out.append(dataclasses.replace(g, count=g.count * passes * (fwd_mult + 2)))
    for g in head_gemms(cfg, b, w.masked, s):
        out.append(dataclasses.replace(g, count=g.count * 3))
    return out


def attention_in_kernel(g: Gemm, s: Strategy) -> bool:
    """Under the Pallas kernels the attention matmuls run inside flash attention (not XLA contractions)."""
    return s.kernels == "pallas" and g.name in ("scores", "context")


def hlo_counts(hlo_text: str) -> dict:
    """Class totals, collective bytes and launches (in loops, in the straight line) of a compiled step
    (jaxformer.hlo_analysis)."""
    from ..hlo_analysis import analyze
    rep = analyze(hlo_text)
    return dict(classes=rep.classes(), collectives={k: v for k, v in rep.collectives().items() if v["count"]},
                launches=dict(loop=rep.launches(in_loops=True), straight=rep.launches(in_loops=False)))
