"""Session 9: the autotuner on the row-wise kernels at BERT's shapes (H200), every candidate's time printed (its
stderr lines), then the default table and the tuner's choice timed again with benchmarks/kernels.py's chained,
L2-rotated fwd+bwd loop (the numbers the results file compares), with the XLA reference for scale.

    JAXFORMER_AUTOTUNE=tune JAXFORMER_AUTOTUNE_CACHE=$OUT/cache.json PYTHONPATH=. python \
        benchmarks/gpu_scripts/session9/tune_rows.py bdrln:8192x768 bdrln:8192x1024 bias_gelu:8192x3072
"""
import os
import sys
import time

import jax
import jax.numpy as jnp

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", ".."))
import kernels as kb  # noqa: E402  benchmarks/kernels.py

import pallas_kernels.bias_dropout_residual_layernorm as bdrln  # noqa: E402
import pallas_kernels.bias_gelu as bias_gelu  # noqa: E402
from pallas_kernels import autotune  # noqa: E402

RATE = 0.1
SEED = jnp.array([1, 2], jnp.uint32)


def case(op, rows, d, rate):
    k = jax.random.split(jax.random.key(0), 5)
    if op == "bdrln":
        args = (jax.random.normal(k[0], (rows, d), jnp.bfloat16), jax.random.normal(k[1], (d,)),
                jax.random.normal(k[2], (rows, d), jnp.bfloat16), 1 + 0.1 * jax.random.normal(k[3], (d,)),
                jax.random.normal(k[4], (d,)))
        kw = dict(seed=SEED, rate=rate, eps=1e-12)
        return (args, lambda blocks: lambda *a: bdrln.bias_dropout_residual_layernorm(*a, **kw, blocks=blocks),
                lambda *a: bdrln.reference.bias_dropout_residual_layernorm(*a, **kw), bdrln.kernel,
                8 * rows * d * 2)  # fwd 3RD, bwd 5RD (2-byte)
    args = (jax.random.normal(k[0], (rows, d), jnp.bfloat16), jax.random.normal(k[1], (d,)))
    module = bias_gelu._PerShape.pick(args[0])[0]
    backend = "mgpu" if module is bias_gelu._k_mgpu else "triton"
    return (args, lambda blocks: lambda *a: bias_gelu.bias_gelu(*a, seed=SEED, rate=rate, blocks=blocks,
                                                                backend="auto" if blocks is None else backend),
            lambda *a: bias_gelu.reference.bias_gelu(*a, seed=SEED, rate=rate), module,
            5 * rows * d * 2)  # fwd x in y out, bwd x, dy in dx out


def main():
    print(f"# {jax.devices()[0].device_kind}, jax {jax.__version__}, autotune {autotune.mode()}, "
          f"cache {autotune.cache_path()}", flush=True)
    bw = kb.copy_bandwidth(5, int(os.environ.get("SCALE", 1)))
    print(f"copy bandwidth {bw / 1e9:.0f} GB/s", flush=True)
    for spec in sys.argv[1:]:
        op, shape, *rate = spec.split(":")  # op:RxD[:rate] (default 0.1)
        rate = float(rate[0]) if rate else RATE
        rows, d = map(int, shape.split("x"))
        args, fn, ref, module, nbytes = case(op, rows, d, rate)
        t0 = time.time()
        jax.block_until_ready(jax.jit(lambda a: jax.vjp(fn(None), *a)[0])(args))  # tunes (stderr) while tracing
        print(f"{spec}: tuned in {time.time() - t0:.0f} s", flush=True)
        default = module.default_blocks(rows, d)
        entry = autotune._load(autotune.cache_path())
        def fields(k):
            return dict(f.split("=", 1) for f in k.split("|")[-1].split(","))
        key = next((k for k in entry if k.startswith(op + "|") and fields(k).get("rows") == str(rows) and
                    str(d) in (fields(k).get("d"), fields(k).get("f")) and
                    fields(k).get("dropout") == str(bool(rate)) and fields(k).get("device", "") == ""
                    and jax.devices()[0].device_kind in k), None)
        if key is None:  # not tuned (interpret mode on a CPU, or mode off)
            chosen = default
            print(f"{spec}: not tuned", flush=True)
        else:
            chosen = autotune._from_fields(default, entry[key]["blocks"])
            print(f"{spec}: tuner {entry[key]['us']} us (default {entry[key]['default_us']} us in its own timing); "
                  f"chosen {chosen}", flush=True)
        rows_out = [("xla", ref)] + [("default", fn(default))] + ([("chosen", fn(chosen))] if chosen != default else [])
        for name, f in rows_out + [("default again", fn(default))]:
            err = kb.check_against(f, ref, args, len(args), "fwd+bwd")
            t = kb.per_iteration(kb._grads_as_carry(f, len(args)), args, 5, min_bytes=kb.ROTATE_BYTES[0] // int(os.environ.get("SCALE", 1)))
            print(f"| {op} {shape} p={rate} | fwd+bwd | {name} | {t * 1e6:.1f} us | {100 * nbytes / t / bw:.0f}% of copy"
                  f" BW | rel err {err:.1e} |", flush=True)


if __name__ == "__main__":
    main()
