"""Session 27: lower the Mosaic GPU attention backward (S = 128, H = 64; the default on Hopper) for CUDA on any machine
at several batch and head counts, unpacked and packed (with and without the folded Q/K/V bias), p = 0 and 0.1, and
print each failure: the check `lower_sweep.py` makes for the row kernels.

    PYTHONPATH=.:benchmarks/gpu_scripts/session27 python benchmarks/gpu_scripts/session27/attn_lower_sweep.py
"""
import jax
import jax.numpy as jnp

from lower_sweep import lower_all
from pallas_kernels.attention import kernel_mgpu

sd = jax.ShapeDtypeStruct


def case(b, n, packed, rate, bias):
    """(function, arguments) of the backward for B = b, N = n at S = T = 128, H = 64."""
    x = sd((b, 128, 3, n, 64) if packed else (b, 128, n, 64), jnp.bfloat16)
    o = sd((b, 128, n, 64), jnp.bfloat16)

    def f(q, code, seed, o, lse, do, bb):
        return kernel_mgpu.backward(q, q, q, code, seed if rate else None, o, lse, do, rate=rate, interpret=False,
                                    packed=packed, bias=bb, bias_grad=bias)

    return f, (x, sd((b, 128), jnp.int32), sd((4,), jnp.uint32), o, sd((b, n, 128), jnp.float32), o,
               sd((3, n, 64), jnp.float32) if bias else None)


def main():
    def cases():
        for b in (1, 2, 3, 5, 8, 24, 64, 96):
            for n in (12, 16):
                for packed, bias in ((False, False), (True, False), (True, True)):
                    for rate in (0.0, 0.1):
                        yield (f"B{b} N{n} packed={packed} bias={bias} p={rate}", *case(b, n, packed, rate, bias))
            yield f"B {b}", None, None

    lower_all(cases())


if __name__ == "__main__":
    main()
