"""Configuration dataclasses: `BertConfig` (the model), `MeshConfig` (the device mesh) and `TrainConfig` (a run).

`BertConfig` uses Hugging Face's field names and meanings (so a `config.json` maps onto it one to one) plus the
numeric and implementation choices of this project: compute `dtype`, `param_dtype`, which `kernels` implement the
memory-bound operators, `remat`, `layouts` and `scan_layers`.

`TrainConfig` is everything `python train.py` takes. Each of its fields is declared with `flag(...)`, which carries
the flag's group, help text and argparse extras as field metadata: `jaxformer.cli` builds train.py's command line
and the table in docs/cli.md from them, so a new option is one field here. Every check of a value lives in the
dataclasses' `__post_init__` and raises ValueError naming the field and the value.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any

import jax.numpy as jnp

from layouts import config as _layouts
from pallas_kernels.mesh import MESH_AXES

from .cli import flag

_FLOAT_DTYPES = ("float32", "bfloat16", "float16", "float64")
KERNELS = ("auto", "xla", "pallas")
REMAT_POLICIES = ("none", "full", "dots")

# name -> (num_hidden_layers, hidden_size, num_attention_heads, intermediate_size)
_PRESETS = {
    "tiny": (2, 128, 2, 512),
    "mini": (4, 256, 4, 1024),
    "base": (12, 768, 12, 3072),
    "large": (24, 1024, 16, 4096),
}


def _dtype_name(field: str, value: Any) -> str:
    """Normalise a dtype given as a string, numpy/jax dtype or scalar type to its canonical name."""
    try:
        name = jnp.dtype(value).name
    except TypeError:
        raise ValueError(f"{field}={value!r} is not a dtype; use one of {_FLOAT_DTYPES}") from None
    if name not in _FLOAT_DTYPES:
        raise ValueError(f"{field}={value!r} is not a floating dtype; use one of {_FLOAT_DTYPES}")
    return name


def _require_positive_ints(obj, fields) -> None:
    for field in fields:
        value = getattr(obj, field)
        if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
            raise ValueError(f"{field}={value!r} must be a positive integer")


@dataclasses.dataclass(frozen=True)
class BertConfig:
    """A BERT encoder and its pre-training heads (MLM + NSP).

    Field meanings follow Hugging Face's `BertConfig`. Extra fields:

    * `dtype`: compute dtype of the contractions and activations (default bfloat16). Layernorm statistics,
      softmax and losses are always computed in float32.
    * `param_dtype`: storage dtype of the parameters (default float32).
    * `kernels`: `"xla"` (plain jax.numpy, fused by XLA), `"pallas"` (fused Pallas kernels) or `"auto"` (pallas on a
      GPU, where it is measured faster, xla elsewhere: interpret mode on a CPU is for tests), see `jaxformer.ops`.
    * `layouts`: the stored order of each encoder-layer activation: `"default"` (today's BSD/CBSNH/BNST/BSNH/BSF),
      a built-in name, a JSON file path (as written by `python -m jaxformer.layout_search`) or a `layouts.LayoutConfig`.
    * `remat`: rematerialisation of each encoder layer in the backward pass: `"none"`, `"full"` (store only the
      layer inputs) or `"dots"` (store the contraction outputs, recompute the element-wise work). Either runs the
      layers in the scan (`scan_layers`): in the loop XLA keeps every activation whatever the policy.
    * `scan_layers`: `True` runs the encoder layers in one `jax.lax.scan` (compile time independent of depth),
      `False` (the default) in a Python loop over slices of the stacked parameters. The scan's stacked (L, ...)
      activation buffers make BERT-large's step 20-28% slower on one and two GPUs, for a compile ~4x faster
      (benchmarks/results/train-h200.md and distributed-2xh200.md, the encoder layers in a loop).

    Dtypes may be given as strings or dtypes (`dtype=jnp.float32`); they are stored as their names.
    """

    vocab_size: int = 30522
    hidden_size: int = 768
    num_hidden_layers: int = 12
    num_attention_heads: int = 12
    intermediate_size: int = 3072
    max_position_embeddings: int = 512
    type_vocab_size: int = 2
    layer_norm_eps: float = 1e-12
    hidden_dropout_prob: float = 0.1
    attention_probs_dropout_prob: float = 0.1
    initializer_range: float = 0.02
    dtype: Any = "bfloat16"
    param_dtype: Any = "float32"
    kernels: str = "auto"
    remat: str = "none"
    layouts: Any = "default"
    scan_layers: bool = False

    def __post_init__(self):
        _require_positive_ints(self, ("vocab_size", "hidden_size", "num_hidden_layers", "num_attention_heads",
                                      "intermediate_size", "max_position_embeddings", "type_vocab_size"))
        if self.hidden_size % self.num_attention_heads:
            raise ValueError(f"num_attention_heads={self.num_attention_heads} must divide "
                             f"hidden_size={self.hidden_size}")
        for field in ("hidden_dropout_prob", "attention_probs_dropout_prob"):
            value = getattr(self, field)
            if not isinstance(value, (int, float)) or not 0.0 <= value < 1.0:
                raise ValueError(f"{field}={value!r} must be a probability in [0, 1)")
        if not (isinstance(self.layer_norm_eps, (int, float)) and 0 < self.layer_norm_eps < 1):
            raise ValueError(f"layer_norm_eps={self.layer_norm_eps!r} must be in (0, 1)")
        if not (isinstance(self.initializer_range, (int, float)) and self.initializer_range > 0
                and math.isfinite(self.initializer_range)):
            raise ValueError(f"initializer_range={self.initializer_range!r} must be a positive number")
        object.__setattr__(self, "dtype", _dtype_name("dtype", self.dtype))
        object.__setattr__(self, "param_dtype", _dtype_name("param_dtype", self.param_dtype))
        if self.kernels not in KERNELS:
            raise ValueError(f"kernels={self.kernels!r} must be one of {KERNELS}")
        if self.remat not in REMAT_POLICIES:
            raise ValueError(f"remat={self.remat!r} must be one of {REMAT_POLICIES}")
        if not isinstance(self.scan_layers, bool):
            raise ValueError(f"scan_layers={self.scan_layers!r} must be True or False")
        # A name, a JSON path or a LayoutConfig; a dict (from `to_dict`) becomes a LayoutConfig. Checked here, before
        # any compile: the error names the field, the tensor and the bad letters.
        layouts = _layouts.load(self.layouts)
        if not isinstance(self.layouts, str):
            object.__setattr__(self, "layouts", layouts)

    # -- derived quantities, named with the DESIGN.md letters --------------------------------------------------
    @property
    def head_dim(self) -> int:
        """H: the width of one attention head (D / N)."""
        return self.hidden_size // self.num_attention_heads

    @property
    def padded_vocab_size(self) -> int:
        """V rounded up to a multiple of 128 (Megatron): the embedding rows and MLM logits the model stores, so that
        V splits evenly over any tensor-parallel size up to 128 and the tiles stay aligned. The padded logits are
        masked out; the public outputs keep `vocab_size`."""
        return -(-self.vocab_size // 128) * 128

    @property
    def layout_config(self) -> "_layouts.LayoutConfig":
        """The stored orders of the encoder layer's activations (`layouts`, resolved; see layouts/config.py)."""
        return _layouts.load(self.layouts)

    @property
    def compute_dtype(self) -> jnp.dtype:
        return jnp.dtype(self.dtype)

    @property
    def parameter_dtype(self) -> jnp.dtype:
        return jnp.dtype(self.param_dtype)

    @classmethod
    def preset(cls, name: str, **overrides) -> "BertConfig":
        """A named size (`tiny`, `mini`, `base`, `large`) with any field overridden by keyword."""
        if name not in _PRESETS:
            raise ValueError(f"preset name={name!r} is unknown; choose one of {sorted(_PRESETS)}")
        layers, hidden, heads, ff = _PRESETS[name]
        fields = dict(num_hidden_layers=layers, hidden_size=hidden, num_attention_heads=heads,
                      intermediate_size=ff)
        unknown = set(overrides) - {f.name for f in dataclasses.fields(cls)}
        if unknown:
            raise ValueError(f"unknown BertConfig field(s) {sorted(unknown)} in overrides")
        fields.update(overrides)
        return cls(**fields)

    @staticmethod
    def preset_names() -> tuple[str, ...]:
        return tuple(_PRESETS)

    def replace(self, **changes) -> "BertConfig":
        return dataclasses.replace(self, **changes)

    def to_dict(self) -> dict[str, Any]:
        """A JSON-serialisable dict of every field (dtypes as names)."""
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> "BertConfig":
        """The inverse of `to_dict`."""
        unknown = set(d) - {f.name for f in dataclasses.fields(cls)}
        if unknown:
            raise ValueError(f"unknown BertConfig field(s) {sorted(unknown)}")
        return cls(**d)


@dataclasses.dataclass(frozen=True)
class MeshConfig:
    """Sizes of the device-mesh axes (see README, "Distributed training", and `jaxformer.sharding`).

    `data`: the batch is split, parameters replicated; `fsdp`: the batch is split and parameters, gradients and
    optimizer state are sharded too (ZeRO-3); `tensor`: attention heads, feed-forward width and vocabulary are split
    (Megatron); `pipeline`: the layer stack is split into stages. One axis may be -1: it takes the devices left over.
    """

    data: int = 1
    fsdp: int = 1
    tensor: int = 1
    pipeline: int = 1

    def __post_init__(self):
        for axis in MESH_AXES:
            value = getattr(self, axis)
            if isinstance(value, bool) or not isinstance(value, int) or (value <= 0 and value != -1):
                raise ValueError(f"mesh axis {axis}={value!r} must be a positive integer or -1 (the rest)")
        if sum(getattr(self, a) == -1 for a in MESH_AXES) > 1:
            raise ValueError(f"mesh {self.spec()!r}: at most one axis may be -1")

    @classmethod
    def parse(cls, text: str) -> "MeshConfig":
        """`"data=2,tensor=2,pipeline=2"` -> MeshConfig; an axis left out has size 1."""
        sizes: dict[str, int] = {}
        for piece in (p.strip() for p in str(text).split(",")):
            if not piece:
                continue
            name, eq, value = piece.partition("=")
            name = name.strip()
            if not eq:
                raise ValueError(f"mesh piece {piece!r} in {text!r} must look like axis=size, e.g. data=2")
            if name not in MESH_AXES:
                raise ValueError(f"mesh axis {name!r} in {text!r} is unknown; axes are {MESH_AXES}")
            if name in sizes:
                raise ValueError(f"mesh axis {name!r} appears twice in {text!r}")
            try:
                sizes[name] = int(value.strip())
            except ValueError:
                raise ValueError(f"mesh size {piece!r} in {text!r} is not an integer") from None
        if not sizes:
            raise ValueError(f"mesh {text!r} names no axis; e.g. data=-1 or data=2,tensor=4")
        return cls(**sizes)

    def resolve(self, n_devices: int) -> "MeshConfig":
        """Concrete sizes for `n_devices` devices (-1 takes the rest); the product must equal the device count."""
        sizes = {a: getattr(self, a) for a in MESH_AXES}
        known = math.prod(v for v in sizes.values() if v != -1)
        for a, v in sizes.items():
            if v == -1:
                if n_devices % known:
                    raise ValueError(f"mesh {self.spec()!r}: the other axes' product {known} does not divide "
                                     f"the device count {n_devices}")
                sizes[a] = n_devices // known
        resolved = MeshConfig(**sizes)
        if resolved.size != n_devices:
            raise ValueError(f"mesh {self.spec()!r} has {resolved.size} devices (product of the axis sizes) "
                             f"but there are {n_devices} devices")
        return resolved

    @property
    def size(self) -> int:
        return math.prod(getattr(self, a) for a in MESH_AXES)

    def spec(self) -> str:
        """The `--mesh` text of this config, every axis named (e.g. "data=2,fsdp=1,tensor=4,pipeline=1")."""
        return ",".join(f"{a}={getattr(self, a)}" for a in MESH_AXES)


# ----------------------------------------------------------------------------------------------- a training run
OPTIMIZERS = ("adamw", "lamb")
SCHEDULES = ("linear", "polynomial")
DEFAULT_LR = {"tiny": 2e-3, "mini": 1e-3, "base": 1e-4, "large": 1e-4}
XLA_OPT_LEVELS = ("auto", "default", "O0", "O1", "O2", "O3")
XLA_GEMMS = ("auto", "xla", "cublas")  # TrainConfig.xla_gemm (steps.Steps.compiler_options)
TRAIN_DTYPES = ("bfloat16", "float32", "float16")  # float64 would need jax_enable_x64 and run in float32 without it
# TrainConfig.grad_compression -> CompressionConfig.exchange (None: the dense all-reduce).
GRAD_COMPRESSIONS = {"none": None, "topk-allgather": "allgather", "topk-balanced": "balanced"}
COMPRESSION_SELECTIONS = ("exact", "sampled", "reused")  # compression.config.SELECTIONS (that package imports this one)
# TrainConfig field -> the CompressionConfig option it sets.
COMPRESSION_FIELDS = {"density": "density", "compression_selection": "selection",
                      "compression_warmup_steps": "warmup_steps", "compression_min_size": "min_size",
                      "compression_freeze_variance_after": "freeze_variance_after"}
COMPRESSION_FLAGS = ("grad_compression", *COMPRESSION_FIELDS)  # the fields the tools that build a step share
DEFAULT_VOCAB_SIZE = 4096  # of a tokenizer trained on the corpus
DEFAULT_COMPILE_CACHE = "~/.cache/jaxformer/xla"  # TrainConfig.compile_cache when $JAX_COMPILATION_CACHE_DIR is unset
# jax.random.key takes 32 bits without x64 (2**32 would alias seed 0) and the dropout stream uses seed + 1.
MAX_SEED = 2**31 - 1


def parse_span(text: str) -> tuple[int, int]:
    """"A:B" -> (A, B): the `--profile-steps` form."""
    try:
        a, b = (int(x) for x in str(text).split(":"))
    except ValueError:
        raise ValueError(f"{text!r}: expected A:B, e.g. 10:15") from None
    return a, b


@dataclasses.dataclass(frozen=True, kw_only=True)
class TrainConfig:
    """Everything `python train.py` takes, with the command line's names and defaults (flags: docs/cli.md).

    `batch_size` is global (over all devices); `dropout` overrides both dropout probabilities of the model when
    set (0 makes a run deterministic); `out=None` means `runs/<timestamp>`. Each field's `on_resume` (field
    metadata, see `jaxformer.cli.flag`) says what `--resume` does with it: "fixed" fields define the run and must
    keep the values in its run.json, "kept" ones are taken from there unless given again, "launch" ones apply to
    this start only, and `steps` may extend the run (jaxformer/run.py, docs/training.md).
    """

    # -- model
    config: str = flag("tiny", "model", "model preset: " + ", ".join(_PRESETS), on_resume="fixed")
    dropout: float | None = flag(None, "model", "overrides both dropout probabilities (0 makes a run "
                                 "deterministic); default: the preset's 0.1", on_resume="fixed")
    dtype: str = flag("bfloat16", "model", "compute dtype (parameters stay float32)", choices=TRAIN_DTYPES,
                      on_resume="fixed")

    # -- data
    data: tuple[str, ...] | None = flag(None, "data", "a prepared directory (python -m jaxformer.prepare), or "
                                        "file(s), directory or glob of BERT-format text or .jsonl, prepared on the "
                                        "fly into the cache (docs/training.md, Data); default: built-in corpus",
                                        nargs="+", metavar="PATH", on_resume="fixed")
    vocab: str | None = flag(None, "data", "BERT vocab.txt or tokenizer.json; default: train a WordPiece tokenizer "
                             "on the corpus (saved as <out>/tokenizer.json)", metavar="FILE",
                             on_resume="fixed")
    vocab_size: int | None = flag(None, "data", f"size of the tokenizer to train (default {DEFAULT_VOCAB_SIZE}); "
                                  "with --vocab, must match it", on_resume="fixed")
    seq_len: int = flag(128, "data", "tokens per sequence", on_resume="fixed")
    max_predictions: int | None = flag(None, "data", "masked positions per row (default 15% of --seq-len; packed: "
                                       "enough for every sample of a row, docs/training.md, Packing)",
                                       on_resume="fixed")
    pack: bool = flag(False, "data", "pack several samples into each row (segment-masked attention, positions "
                      "restarting per sample, an NSP prediction per sample), as MLPerf BERT; the data is prepared "
                      "packed (docs/training.md, Packing)", on_resume="fixed")
    pack_samples: int | None = flag(None, "data", "with --pack: at most K samples per row (default --seq-len / 16: "
                                    "8 at 128, 32 at 512)", metavar="K", on_resume="fixed")
    data_workers: int = flag(2, "data", "worker processes that read and mask the batches (Grain); 0: threads of "
                             "the training process")

    # -- optimisation
    batch_size: int = flag(32, "optimisation", "global batch size (sequences per step)", on_resume="fixed")
    steps: int = flag(600, "optimisation", "total training steps; with --resume, a larger value extends the run "
                      "(the learning rate continues from where it is, docs/training.md)", on_resume="extend")
    lr: float | None = flag(None, "optimisation", "peak learning rate (default per preset: "
                            + ", ".join(f"{k} {v:.0e}".replace("e-0", "e-") for k, v in DEFAULT_LR.items()) + ")",
                            on_resume="fixed")
    # None: 10% of `steps`, resolved when the config is made (the optimizer reads an int).
    warmup_steps: int | None = flag(None, "optimisation", "linear warm-up steps, below --steps (default 10% of "
                                    "--steps)", on_resume="fixed")
    schedule: str = flag("linear", "optimisation", "decay after warm-up", choices=SCHEDULES, on_resume="fixed")
    optimizer: str = flag("adamw", "optimisation", "optimizer", choices=OPTIMIZERS, on_resume="fixed")
    weight_decay: float = flag(0.01, "optimisation", "decoupled weight decay (not on biases and layernorm "
                               "parameters)", on_resume="fixed")
    clip_norm: float = flag(1.0, "optimisation", "clip gradients to this global norm (0: off)", on_resume="fixed")

    # -- run
    seed: int = flag(0, "run", f"seed of initialisation, data order, masking and dropout (0 .. {MAX_SEED})",
                     on_resume="fixed")
    out: str | None = flag(None, "run", "output directory, one run's own (default runs/<timestamp>)", metavar="DIR",
                           on_resume="launch")
    resume: bool = flag(False, "run", "continue the run in --out (default: the most recent run under runs/) from "
                        "its newest good checkpoint, with the settings stored in its run.json", on_resume="launch")
    overwrite: bool = flag(False, "run", "start afresh in a --out that holds an earlier run: delete that run's "
                           "outputs first", on_resume="launch")
    eval_every: int = flag(200, "run", "evaluate on the held-out split every N steps")
    eval_batches: int = flag(20, "run", "held-out batches per evaluation")
    save_every: int = flag(200, "run", "checkpoint every N steps (and at the end)")
    log_every: int = flag(20, "run", "write metrics every N steps")
    progress: bool = flag(True, "run", "no progress bar (logs only)", flag="--no-progress")
    profile_steps: tuple[int, int] | None = flag(None, "run", "write a jax.profiler trace of steps A..B-1 to "
                                                 "<out>/profile", type=parse_span, metavar="A:B",
                                                 on_resume="launch")
    dump_hlo: bool = flag(False, "run", "write the optimized HLO of the train step to <out>", on_resume="launch")
    compile_cache: str | None = flag(None, "run", "keep compiled programs in DIR (JAX's persistent compilation "
                                     "cache: a resumed or repeated run skips most of its compile); 'none': off; "
                                     f"default $JAX_COMPILATION_CACHE_DIR, else {DEFAULT_COMPILE_CACHE}",
                                     metavar="DIR", on_resume="launch")

    # -- mesh and distributed
    mesh: str = flag("data=-1", "mesh", "device mesh, e.g. data=2,tensor=4: axes data, fsdp (ZeRO-3), tensor "
                     "(Megatron), pipeline; an axis left out has size 1, one may be -1 (the rest); see README, "
                     "Distributed training")
    microbatches: int = flag(1, "mesh", "microbatches per step (pipeline schedule)")
    pipeline_repeats: int = flag(1, "mesh", "layer chunks per pipeline stage (circular pipeline schedule)")
    sequence_parallel: bool = flag(False, "mesh", "with tensor > 1: split the residual stream's sequence axis over "
                                   "`tensor` between blocks (Megatron sequence parallelism; runs the XLA kernels)")
    # None falls back to $JAXFORMER_*, then a SLURM step, then one process (jaxformer.distributed).
    coordinator: str | None = flag(None, "mesh", "multi-process run: address of process 0's coordinator (default: "
                                   "$JAXFORMER_COORDINATOR; none and no SLURM step: one process); see README, "
                                   "Multi-host", metavar="HOST:PORT", on_resume="launch")
    num_processes: int | None = flag(None, "mesh", "multi-process run: number of processes (default: "
                                     "$JAXFORMER_NUM_PROCESSES)", on_resume="launch")
    process_id: int | None = flag(None, "mesh", "multi-process run: this process's index, 0 .. N-1 (default: "
                                  "$JAXFORMER_PROCESS_ID)", on_resume="launch")

    # -- performance (how a step runs, not what it computes: a resumed run may change these)
    kernels: str = flag("auto", "performance", "implementation of the fused operators: auto = pallas on a GPU, xla "
                        "elsewhere (see jaxformer/ops.py)", choices=KERNELS)
    remat: str = flag("none", "performance", "recompute layer activations in the backward pass to save memory",
                      choices=REMAT_POLICIES)
    scan_layers: bool = flag(False, "performance", "run the encoder layers in one lax.scan (compiles ~4x faster for "
                             "BERT-large, steps 20-28% slower) instead of a loop over them", negatable=True)
    layouts: str = flag("default", "performance", "stored order of the encoder layer's activations: a JSON file "
                        "written by `python -m jaxformer.layout_search`, or a built-in name (README, Layouts)",
                        metavar="FILE")
    xla_opt_level: str = flag("auto", "performance", "XLA's optimization level for the train step; auto: O2 with "
                              "data or fsdp > 1 (measured faster there), JAX's default otherwise",
                              choices=XLA_OPT_LEVELS)
    xla_gemm: str = flag("auto", "performance", "who runs the GEMMs on a GPU: xla (XLA's choice per GEMM, Triton or "
                         "cuBLAS), cublas (XLA's Triton GEMMs off); auto: cublas (measured faster with the "
                         "kernels on one device and on data and tensor meshes, equal elsewhere)", choices=XLA_GEMMS)

    # -- gradient compression (over the data axis; jaxformer/compression, docs/compression.md). On or off is fixed
    # for a run and so are `compression_min_size` and the mesh while it is on (the optimizer state's shapes follow
    # them: run.check_compression); the rest may change across a resume.
    grad_compression: str = flag("none", "compression", "exchange each data rank's largest gradient entries instead "
                                 "of all-reducing every gradient over the data axis (error feedback keeps the rest): "
                                 "topk-balanced = Ok-Topk's balanced sparse all-reduce, topk-allgather = every rank "
                                 "gathers every rank's entries; needs a data axis > 1; on or off is fixed for a run",
                                 choices=tuple(GRAD_COMPRESSIONS))
    density: float = flag(0.01, "compression", "fraction of each gradient tensor's entries a rank sends per step, "
                          "in (0, 1]")
    compression_selection: str = flag("sampled", "compression", "how the top-k threshold is found: sampled (a random "
                                      "sample's, DGC; the fastest at full recall), exact (lax.top_k), reused (last "
                                      "step's, adapted; Ok-Topk)",
                                      choices=COMPRESSION_SELECTIONS)
    compression_warmup_steps: int = flag(0, "compression", "density warm-up (DGC): steps from density 0.25, "
                                         "quartered level by level, down to --density (each level compiles its "
                                         "own step)")
    compression_min_size: int = flag(16384, "compression", "tensors (per layer for the encoder's) with fewer entries "
                                     "than this are sent whole; fixed for a run with compression")
    compression_freeze_variance_after: int = flag(0, "compression", "1-bit Adam: all-reduce the dense gradient for "
                                                  "this many steps, then freeze the optimizer's second moment and "
                                                  "compress; --clip-norm then clips each rank's gradient before the "
                                                  "exchange (0: off, the second moment stays adaptive)")

    def __post_init__(self):
        if isinstance(self.data, (list, str)):
            object.__setattr__(self, "data", (self.data,) if isinstance(self.data, str) else tuple(self.data))
        _require_positive_ints(self, ("seq_len", "batch_size", "steps", "eval_every", "save_every", "log_every",
                                      "eval_batches", "microbatches", "pipeline_repeats"))
        for field, choices in (("schedule", SCHEDULES), ("optimizer", OPTIMIZERS), ("dtype", TRAIN_DTYPES),
                               ("xla_opt_level", XLA_OPT_LEVELS), ("xla_gemm", XLA_GEMMS)):
            if getattr(self, field) not in choices:
                raise ValueError(f"{field}={getattr(self, field)!r} must be one of {choices}")
        MeshConfig.parse(self.mesh)  # syntax only: sizes against devices and model are `sharding.validate`'s job
        if self.seq_len < 8:
            raise ValueError(f"seq_len={self.seq_len} must be at least 8")
        from .data import max_predictions_ok, pack_ok  # DataConfig's rules, checked here before any data work
        if not max_predictions_ok(self.max_predictions, self.seq_len):
            raise ValueError(f"max_predictions={self.max_predictions!r} must be an integer in [1, seq_len - 3] "
                             f"(seq_len={self.seq_len}: [CLS] and two [SEP] are never masked)")
        if self.pack_samples is not None and not pack_ok(self.pack_samples, self.seq_len):
            raise ValueError(f"pack_samples={self.pack_samples!r} must be an integer in [1, seq_len // 5 = "
                             f"{self.seq_len // 5}] (a sample takes at least 5 tokens)")
        if self.pack_samples is not None and not self.pack:
            raise ValueError(f"pack_samples={self.pack_samples} is the most samples a packed row holds: it needs "
                             "pack=True (--pack)")
        if self.vocab_size is not None:
            _require_positive_ints(self, ("vocab_size",))
        if isinstance(self.data_workers, bool) or not isinstance(self.data_workers, int) or self.data_workers < 0:
            raise ValueError(f"data_workers={self.data_workers!r} must be an integer >= 0")
        if self.compile_cache is not None and (not isinstance(self.compile_cache, str) or not self.compile_cache):
            raise ValueError(f"compile_cache={self.compile_cache!r} must be a directory or 'none'")
        if self.warmup_steps is None:
            object.__setattr__(self, "warmup_steps", self.steps // 10)
        if isinstance(self.warmup_steps, bool) or not (isinstance(self.warmup_steps, int) and 0 <= self.warmup_steps):
            raise ValueError(f"warmup_steps={self.warmup_steps!r} must be a non-negative integer")
        if self.warmup_steps >= self.steps and not self.resume:  # a resumed run's schedule has its stored total
            raise ValueError(f"warmup_steps={self.warmup_steps} must be below steps={self.steps}")
        if self.lr is not None and not (self.lr > 0 and math.isfinite(self.lr)):
            raise ValueError(f"lr={self.lr!r} must be a positive number")
        if self.dropout is not None and not 0.0 <= self.dropout < 1.0:
            raise ValueError(f"dropout={self.dropout!r} must be a probability in [0, 1)")
        for field in ("weight_decay", "clip_norm"):
            value = getattr(self, field)
            if not (isinstance(value, (int, float)) and value >= 0 and math.isfinite(value)):
                raise ValueError(f"{field}={value!r} must be a finite number >= 0")
        if isinstance(self.seed, bool) or not isinstance(self.seed, int) or not 0 <= self.seed <= MAX_SEED:
            raise ValueError(f"seed={self.seed!r} must be an integer in [0, {MAX_SEED}]")
        if self.out is not None and not str(self.out).strip():
            raise ValueError(f"out={self.out!r} is empty: name a directory (or leave --out out for runs/<timestamp>)")
        if self.resume and self.overwrite:
            raise ValueError("resume=True and overwrite=True contradict each other: --resume continues the run in "
                             "--out, --overwrite deletes it")
        if self.profile_steps is not None:
            a, b = self.profile_steps
            if not 0 <= a < b:
                raise ValueError(f"profile_steps={a}:{b} must satisfy 0 <= A < B")
        from .distributed import check_fields  # each value alone; completeness (with the env) at train start
        check_fields(self.coordinator, self.num_processes, self.process_id)
        if self.grad_compression not in GRAD_COMPRESSIONS:
            raise ValueError(f"grad_compression={self.grad_compression!r} must be one of {tuple(GRAD_COMPRESSIONS)}")
        self.compression_config()  # every option, compression on or off; the mesh: sharding.validate
        # Model-side values are validated by BertConfig itself (before anything is compiled).
        self.model_config(vocab_size=self.vocab_size or DEFAULT_VOCAB_SIZE)

    @property
    def packing(self) -> int:
        """Samples per row of the run's data: 0 unpacked, else `pack_samples` (default `seq_len // 16`)."""
        if not self.pack:
            return 0
        from .packing import default_samples_per_row
        return self.pack_samples or default_samples_per_row(self.seq_len)

    @property
    def peak_lr(self) -> float:
        """`lr`, or the preset's default: small models tolerate (and need) larger steps than post-LN BERT-base."""
        return self.lr if self.lr is not None else DEFAULT_LR.get(self.config, 1e-4)

    def compression_config(self):
        """The `jaxformer.compression.CompressionConfig` of this run, or None without `grad_compression`. Its
        options are checked either way (ValueError naming this config's field and the value)."""
        from .compression.config import CompressionConfig  # the module alone: the package imports the steps
        exchange = GRAD_COMPRESSIONS[self.grad_compression]
        options = {}
        for field, option in COMPRESSION_FIELDS.items():
            value = getattr(self, field)
            try:
                CompressionConfig(**{option: value})
            except ValueError as e:  # its message starts "<option>=<value>": name this config's field instead
                raise ValueError(f"{field}={str(e)[len(option) + 1:]}") from None
            options[option] = value
        # With a frozen second moment the update is linear in the exchanged sum: the clip moves before the exchange.
        clip = (self.clip_norm or None) if options["freeze_variance_after"] else None
        config = CompressionConfig(exchange=exchange or "balanced", seed=self.seed, clip_norm=clip, **options)
        return config if exchange is not None else None

    def model_config(self, vocab_size: int) -> BertConfig:
        """The BertConfig of this run: the preset with the tokenizer's vocab size and the overrides."""
        overrides = dict(vocab_size=vocab_size, dtype=self.dtype, kernels=self.kernels, remat=self.remat,
                         layouts=self.layouts, scan_layers=self.scan_layers)
        if self.dropout is not None:
            overrides.update(hidden_dropout_prob=self.dropout, attention_probs_dropout_prob=self.dropout)
        cfg = BertConfig.preset(self.config, **overrides)
        if self.seq_len > cfg.max_position_embeddings:
            raise ValueError(f"seq_len={self.seq_len} exceeds the position table "
                             f"(max_position_embeddings={cfg.max_position_embeddings})")
        return cfg
