"""Session 21: what the Mosaic GPU BDRLN backward's SMEM accumulators (d_scale, d_shift, d_bias summed elementwise
over a program's tiles, a load and a store of a float32 (block_rows, D) tile each per step) cost. A probe, not a
kernel: variants of kernel_mgpu.py's source, patched as text and loaded as their own modules, whose partial sums are
wrong where accumulation is skipped; only their device time is read.

    PYTHONPATH=. python benchmarks/gpu_scripts/session21/probe_bwd_acc.py
"""
import importlib.util
import itertools
import os
import re
import sys

os.environ["XLA_FLAGS"] = os.environ.get("XLA_FLAGS", "") + " --xla_gpu_enable_command_buffer="

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402

from jaxformer.hlo_profile import profile_compiled  # noqa: E402
import pallas_kernels.bias_dropout_residual_layernorm.kernel_mgpu as km  # noqa: E402
from pallas_kernels import _pallas as pk  # noqa: E402
from pallas_kernels.dropout import seed_from_key  # noqa: E402

ACC = "            for k, v in enumerate((d * xhat, d, dx)[:n_acc]):\n"
VARIANTS = {"shipped (3 accumulators)": None,
            "1 accumulator (d_scale only)": "            for k, v in enumerate((d * xhat,)):\n",
            "no accumulation": "            for k, v in enumerate(()):\n"}


def load_variant(name, replacement):
    src = open(km.__file__).read()
    if replacement is not None:
        assert ACC in src
        src = src.replace(ACC, replacement)
    mod_name = "pallas_kernels.bias_dropout_residual_layernorm._probe_" + re.sub(r"\W", "_", name)
    spec = importlib.util.spec_from_loader(mod_name, loader=None)
    mod = importlib.util.module_from_spec(spec)
    mod.__package__ = "pallas_kernels.bias_dropout_residual_layernorm"
    sys.modules[mod_name] = mod
    exec(compile(src, km.__file__, "exec"), mod.__dict__)
    return mod


def main():
    key = jax.random.split(jax.random.key(1), 8)
    seed = pk.seed_words(seed_from_key(key[7]))
    print(f"# {jax.__version__} {jax.devices()[0].device_kind}; BDRLN Mosaic GPU backward kernel alone, p=0.1, device "
          "time per call, us, 20 calls on rotated inputs", flush=True)
    print("| shape | variant | bwd kernel |\n|---|---|---|", flush=True)
    for rows, d in ((8192, 1024), (32768, 1024), (32768, 768)):
        x, res, dy = (jax.random.normal(key[i], (rows, d), jnp.bfloat16) for i in (0, 1, 5))
        bias, scale = (jax.random.normal(key[i], (d,)) for i in (2, 3))
        mean = jnp.zeros((rows,), jnp.float32)
        rstd = jnp.ones((rows,), jnp.float32)
        args = (x, bias, res, scale, seed, mean, rstd, dy)
        copies = [tuple(a.copy() for a in args) for _ in range(max(1, -(-180 * 2**20 // (3 * x.nbytes))))]
        for name, rep in VARIANTS.items():
            mod = load_variant(name, rep)
            blocks = mod.default_blocks(rows, d)
            fn = jax.jit(lambda *a, mod=mod, blocks=blocks: mod.backward(*a, rate=0.1, interpret=False, blocks=blocks))
            it = itertools.cycle(copies)
            compiled = fn.lower(*args).compile()
            times = profile_compiled(compiled, next(it), 20, carry=lambda out, a: next(it), by="kernel",
                                     log=lambda m: None)
            us = sum(v for k, v in times.items() if "bdrln_bwd" in k) / 20 / 1e3
            print(f"| {rows}x{d} | {name} | {us:.1f} |", flush=True)


if __name__ == "__main__":
    main()
