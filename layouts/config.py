"""`LayoutConfig`: the stored order of each named activation of the encoder layer, and its JSON file format.

    {"x": "BSD", "qkv": "CBSNH", "scores": "BNST", "ctx": "BSNH", "h": "BSF", "meta": {...}}

Fields (logical letters; any permutation is a legal stored order unless noted):

* `x`      BSD    the layer's input/output (the scan carry) and every BSD tensor of the layer (the projections'
                  outputs and the residual stream). D must be last: the layernorms run over rows of D.
* `qkv`    CBSNH  the fused Q/K/V projection's output.
* `scores` BNST   the attention scores and probabilities (XLA attention path; softmax runs over T).
* `ctx`    BSNH   the attention context, input of the output projection.
* `h`      BSF    the feed-forward intermediate. F must be last: bias + GELU runs over rows of F.

Missing fields take the default (today's model, exactly); `meta` is free-form (the search records what it
measured there). `BertConfig.layouts` takes a built-in name (`"default"`, or the stem of a file in
`layouts/configs/`), a path to such a JSON file, or a `LayoutConfig`.
"""

from __future__ import annotations

import dataclasses
import json
import os
from pathlib import Path

# Logical letters of each activation, in today's (default) stored order.
LOGICAL = {"x": "BSD", "qkv": "CBSNH", "scores": "BNST", "ctx": "BSNH", "h": "BSF"}
# The letter that must stay last: memory-bound kernels work on rows of the last axis.
LAST = {"x": "D", "h": "F"}

# What the search tries (jaxformer/layout_search.py). H and T last everywhere (rows of the head width / of the keys are
# what the batched matmuls and the softmax stream over); the orders below are the ones with a reason to win:
# qkv  CBSNH (today), CBNSH (q, k, v already in batched-matmul order), BSCNH/SBCNH (the projection as one
#      [BS, 3D] / [SB, 3D] GEMM output);
# scores BNST (today), NBST, BSNT;  ctx BSNH (the output projection's plain GEMM), BNSH (the context matmul's
#      natural output), SBNH;  x and h: batch-major or sequence-major rows.
# 2 x 4 x 3 x 3 x 2 = 144 layer configurations, 73 operator configurations to time (XLA path).
CANDIDATES = {
    "x": ("BSD", "SBD"),
    "qkv": ("CBSNH", "CBNSH", "BSCNH", "SBCNH"),
    "scores": ("BNST", "NBST", "BSNT"),
    "ctx": ("BSNH", "BNSH", "SBNH"),
    "h": ("BSF", "SBF"),
}

CONFIG_DIR = Path(__file__).parent / "configs"


def _check(field: str, value) -> None:
    logical = LOGICAL[field]
    if not (isinstance(value, str) and len(value) == len(logical) and sorted(value) == sorted(logical)):
        raise ValueError(f"layouts: {field}={value!r} is not a permutation of {field}'s letters {logical!r}")
    last = LAST.get(field)
    if last and value[-1] != last:
        raise ValueError(f"layouts: {field}={value!r} must end in {last!r} (the fused kernels work on rows of {last})")


@dataclasses.dataclass(frozen=True)
class LayoutConfig:
    """Stored orders of the encoder layer's activations (see the module docstring). Default: today's model."""

    x: str = LOGICAL["x"]
    qkv: str = LOGICAL["qkv"]
    scores: str = LOGICAL["scores"]
    ctx: str = LOGICAL["ctx"]
    h: str = LOGICAL["h"]

    def __post_init__(self):
        for field in LOGICAL:
            _check(field, getattr(self, field))

    def to_dict(self) -> dict[str, str]:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, d, *, source: str = "layouts") -> "LayoutConfig":
        if not isinstance(d, dict):
            raise ValueError(f"{source}: expected a JSON object of tensor name -> letters, got {type(d).__name__}")
        unknown = sorted(set(d) - set(LOGICAL) - {"meta"})
        if unknown:
            raise ValueError(f"{source}: unknown tensor name(s) {unknown}; known: {sorted(LOGICAL)}")
        return cls(**{k: v for k, v in d.items() if k in LOGICAL})

    @property
    def is_default(self) -> bool:
        return self == LayoutConfig()


def builtin_names() -> tuple[str, ...]:
    files = sorted(p.stem for p in CONFIG_DIR.glob("*.json")) if CONFIG_DIR.is_dir() else []
    return ("default", *files)


def load(spec) -> LayoutConfig:
    """A LayoutConfig from a built-in name, a JSON file path, a dict or a LayoutConfig (ValueError names the field)."""
    if isinstance(spec, LayoutConfig):
        return spec
    if isinstance(spec, dict):
        return LayoutConfig.from_dict(spec)
    if not isinstance(spec, str) or not spec:
        raise ValueError(f"layouts={spec!r} must be a built-in name {builtin_names()}, a JSON file path "
                         f"or a LayoutConfig")
    if spec == "default":
        return LayoutConfig()
    path = Path(spec)
    if not (path.suffix == ".json" or os.sep in spec or "/" in spec):
        if spec not in builtin_names():
            raise ValueError(f"layouts={spec!r} is neither a built-in name {builtin_names()} nor a .json path")
        path = CONFIG_DIR / f"{spec}.json"
    try:
        text = path.read_text()
    except OSError as e:
        raise ValueError(f"layouts={spec!r}: cannot read the file ({e.strerror})") from None
    try:
        d = json.loads(text)
    except json.JSONDecodeError as e:
        raise ValueError(f"layouts={spec!r}: bad JSON ({e})") from None
    return LayoutConfig.from_dict(d, source=f"layouts={spec!r}")


def save(config: LayoutConfig, path, meta: dict | None = None) -> None:
    d = config.to_dict()
    if meta:
        d["meta"] = meta
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    Path(path).write_text(json.dumps(d, indent=1) + "\n")
