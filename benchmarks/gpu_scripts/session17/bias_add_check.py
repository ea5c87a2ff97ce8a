"""Session 17: does XLA on the GPU round the Q/K/V bias to qkv's dtype before the unfolded add (`_add_bias`)?

Hypothesis: with `xla_allow_excess_precision` (XLA's default), the GPU compiler upcasts the bf16 add to float32 and
then drops the convert pair float32 -> bf16 -> float32 on the bias, so the bias is added unrounded (not the documented
qkv + round(bias)). Compares each form against numpy's qkv + round(bias) rounded once, and says whether the form still
goes into the cuBLAS(Lt) bias epilogue of the projection GEMM (xla_gpu_enable_triton_gemm=false)."""
import re

import jax
import jax.numpy as jnp
import ml_dtypes
import numpy as np
from jax import lax


def shipped(qkv, bias):  # _add_bias of 77f93b0..b5090cb
    b, s, c, n, h = qkv.shape
    return (qkv.reshape(b * s, c * n * h) + bias.astype(qkv.dtype).reshape(c * n * h)).reshape(qkv.shape)


def tree(qkv, bias):  # _add_bias of the tree this runs on
    from pallas_kernels.attention import _add_bias
    return _add_bias(qkv, bias)


def f32_form(qkv, bias):  # the form before 77f93b0
    return (qkv.astype(jnp.float32) + bias.astype(qkv.dtype).astype(jnp.float32)).astype(qkv.dtype)


def reduce_precision_form(qkv, bias):
    b, s, c, n, h = qkv.shape
    fi = jnp.finfo(qkv.dtype)
    row = lax.reduce_precision(bias.astype(jnp.float32), exponent_bits=fi.nexp, mantissa_bits=fi.nmant)
    return (qkv.reshape(b * s, c * n * h) + row.astype(qkv.dtype).reshape(c * n * h)).reshape(qkv.shape)


FORMS = {"2-D bf16 (b5090cb)": shipped, "this tree's _add_bias": tree, "f32 form (before 77f93b0)": f32_form,
         "reduce_precision": reduce_precision_form}

k = jax.random.split(jax.random.key(21), 3)
qkv = (jax.random.normal(k[0], (2, 16, 3, 2, 8)) * jnp.exp(3 * jax.random.normal(k[1], (2, 16, 3, 2, 8))))
qkv = qkv.astype(jnp.bfloat16)
bias = 10 * jax.random.normal(k[2], (3, 2, 8))
q32 = np.asarray(qkv.astype(jnp.float32))
want = (q32 + np.asarray(bias).astype(ml_dtypes.bfloat16).astype(np.float32)).astype(ml_dtypes.bfloat16)
unrounded = (q32 + np.asarray(bias)).astype(ml_dtypes.bfloat16)
print(jax.__version__, jax.devices()[0].device_kind)
for name, fn in FORMS.items():
    got = np.asarray(jax.jit(fn)(qkv, bias))
    print(f"| {name} | differs from qkv + round(bias): {int(np.sum(got != want))} of {got.size} | "
          f"from qkv + bias unrounded: {int(np.sum(got != unrounded))} |")

# Into the GEMM's epilogue? x [B*S, K] @ w [K, 3NH] in bf16, reshaped to qkv, plus the bias in each form.
B, S, K, N, H = 16, 512, 1024, 16, 64
x = jnp.ones((B * S, K), jnp.bfloat16)
w = jnp.ones((K, 3 * N * H), jnp.bfloat16)
b3 = jnp.ones((3, N, H), jnp.float32)
for name, fn in FORMS.items():
    f = jax.jit(lambda x, w, b: fn((x @ w).reshape(B, S, 3, N, H), b))
    hlo = f.lower(x, w, b3).compile({"xla_gpu_enable_triton_gemm": False}).as_text()
    calls = re.findall(r'custom_call_target="([^"]+)"', hlo)
    epilogue = re.findall(r'"epilogue":"([A-Z_]+)"', hlo)
    fusions = len(re.findall(r"^\s*\S+ = \S+ fusion\(", hlo, flags=re.M))
    print(f"| {name} | custom calls {calls} | epilogues {epilogue} | fusions {fusions} |")
