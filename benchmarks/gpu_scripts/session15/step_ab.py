"""Session 15: the train step with the Q/K/V bias added in qkv's dtype (an add XLA may put into the QKV GEMM's
cuBLASLt epilogue) instead of in float32 around the GEMM's rounded output, and optionally not folded into the flash
kernels at S <= 128. A diagnostic patch applied in-process, then benchmarks/train_step.py's main:

    PYTHONPATH=. python benchmarks/gpu_scripts/session15/step_ab.py VARIANT [train_step.py arguments]

VARIANT: base (as shipped), bf16add (the add in qkv's dtype), unfold (bf16add and fold_bias=False everywhere),
add2d (the bf16 add on the GEMM's 2-D [B*S, 3*N*H] shape: run 2 found bf16add's add on the 5-D bitcast not fused),
unfold2d (add2d and fold_bias=False), nofold (fold_bias=False only: with the code after 77f93b0, whose `_add_bias`
is add2d's).
"""
import dataclasses
import runpy
import sys

import pallas_kernels.attention as attn

variant = sys.argv.pop(1)
if variant not in ("base", "bf16add", "unfold", "add2d", "unfold2d", "nofold"):
    raise SystemExit(f"unknown variant {variant!r}")
if variant in ("bf16add", "unfold"):
    attn._add_bias = lambda qkv, bias: qkv + bias.astype(qkv.dtype)


def _add2d(qkv, bias):
    b, s, c, n, h = qkv.shape
    return (qkv.reshape(b * s, c * n * h) + bias.astype(qkv.dtype).reshape(c * n * h)).reshape(qkv.shape)


if variant in ("add2d", "unfold2d"):
    attn._add_bias = _add2d
if variant in ("unfold", "unfold2d", "nofold"):
    _default = attn.default_block_sizes
    attn.default_block_sizes = lambda *a, **k: dataclasses.replace(_default(*a, **k), fold_bias=False)
print(f"variant {variant}", file=sys.stderr)
sys.argv[0] = "benchmarks/train_step.py"
runpy.run_path("benchmarks/train_step.py", run_name="__main__")
