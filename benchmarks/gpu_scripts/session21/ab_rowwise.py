"""Session 21: device time per kernel of BDRLN and bias+GELU fwd+bwd, every backend, with the inputs rotated over
>= 180 MB of copies so that no call finds its operands in L2 (the plain `--profile` of benchmarks/kernels.py calls
one input set, which stays in the H100's/H200's 50-60 MB L2 at 8192 rows). Triton also with 16 rows per backward
program (the default before this session) where the new default differs.

    PYTHONPATH=. python benchmarks/gpu_scripts/session21/ab_rowwise.py [--calls 20] [--ops bdrln,bias_gelu]
"""
import argparse
import dataclasses
import itertools
import os
import re

os.environ["XLA_FLAGS"] = os.environ.get("XLA_FLAGS", "") + " --xla_gpu_enable_command_buffer="  # kernels, not graphs

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402

from benchmarks.kernels import _grads_as_carry, copy_bandwidth, per_iteration  # noqa: E402
from jaxformer.hlo_profile import profile_compiled  # noqa: E402
import pallas_kernels.bias_dropout_residual_layernorm as bdrln  # noqa: E402
import pallas_kernels.bias_gelu as bias_gelu  # noqa: E402
from pallas_kernels.bias_dropout_residual_layernorm import kernel as bdrln_triton  # noqa: E402
from pallas_kernels.bias_gelu import kernel as bias_gelu_triton  # noqa: E402
from pallas_kernels.dropout import seed_from_key  # noqa: E402

ROTATE = 180 * 2**20
COPY_BYTES = 256 * 2**20  # the copy probe's buffer
SHAPES = {"bdrln": ((8192, 768), (8192, 1024), (16384, 768), (16384, 1024), (32768, 768), (32768, 1024)),
          "bias_gelu": ((8192, 3072), (8192, 4096), (32768, 4096))}


def cold_profile(fn, args, calls):
    """{kernel: ns} over `calls` calls of jit(fn), each on the next of K copies of `args` (K x bytes >= ROTATE)."""
    compiled = jax.jit(fn).lower(args).compile()
    nbytes = sum(a.nbytes for a in args)
    copies = [tuple(a.copy() for a in args) for _ in range(max(1, -(-ROTATE // nbytes)))]
    it = itertools.cycle(copies)
    return profile_compiled(compiled, (next(it),), calls, carry=lambda out, a: (next(it),), by="both", log=lambda m: 0)


def copy_device_time():
    """Device time (us per call) and GB/s of the copy probe (`benchmarks.kernels.copy_bandwidth`: XLA's fp32 `x + 1`
    over 256 MB, two buffers alternating, device time on a GPU)."""
    gbs = copy_bandwidth(5) / 1e9
    return 2 * COPY_BYTES / gbs / 1e3, gbs


def copy_chain_bandwidth():
    """GB/s of the same probe timed as a chain (what `copy_bandwidth` returned before 40f2947)."""
    x = jax.random.normal(jax.random.key(0), (COPY_BYTES // 4,), jnp.float32)
    return 2 * x.nbytes / per_iteration(lambda x: (x[0] + 1,), (x,), 5) / 1e9


def split(times, calls):
    """us per call: (total, forward kernel, backward kernel, everything else)."""
    us = {k: v / calls / 1e3 for k, v in times.items()}
    fwd = sum(v for k, v in us.items() if re.search(r"_fwd", k))
    bwd = sum(v for k, v in us.items() if re.search(r"_bwd", k))
    total = sum(us.values())
    return total, fwd, bwd, total - fwd - bwd


def copies(a):
    """A copy of each kernel's bytes: XLA's fp32 `x + 1` reading and writing as many bytes as the forward (then the
    backward) kernel moves, rotated like the operators; the sum over both, against the operator's two kernels."""
    sizes = {"bdrln": lambda r, d: (3 * r * d * 2, 5 * r * d * 2), "bias_gelu": lambda r, d: (2 * r * d * 2,
                                                                                               3 * r * d * 2)}
    big_us, big_gbs = copy_device_time()
    print(f"# {jax.__version__} {jax.devices()[0].device_kind}; 256 MB fp32 copy {big_us:.1f} us, {big_gbs:.0f} GB/s "
          f"(device time); size-matched copies, device time per call, us, {a.calls} calls on rotated inputs",
          flush=True)
    print("| op (p = 0.1 bytes) | shape | copy of fwd bytes | copy of bwd bytes | both | GB/s of both |")
    print("|---|---|---|---|---|---|", flush=True)
    for op in a.ops.split(","):
        for rows, d in SHAPES[op]:
            if a.shapes and f"{rows}x{d}" not in a.shapes.split(","):
                continue
            us = []
            for nbytes in sizes[op](rows, d):
                x = jax.random.normal(jax.random.key(0), (nbytes // 8,), jnp.float32)  # read + written = nbytes
                us.append(sum(cold_profile(lambda t: (t[0] + 1,), (x,), a.calls).values()) / a.calls / 1e3)
            total = sum(sizes[op](rows, d))
            print(f"| {op} | {rows}x{d} | {us[0]:.1f} | {us[1]:.1f} | {sum(us):.1f} | "
                  f"{total / (sum(us) * 1e-6) / 1e9:.0f} |", flush=True)


def bdrln_inputs(key, rows, d):
    """(x, bias, residual, scale, shift) of a (rows, d) BDRLN shard: bf16 activations, float32 parameters."""
    x, res = (jax.random.normal(key[i], (rows, d), jnp.bfloat16) for i in (0, 1))
    bias, shift = (jax.random.normal(key[i], (d,)) for i in (2, 3))
    return x, bias, res, 1 + 0.1 * jax.random.normal(key[4], (d,)), shift


def sweep(a):
    """Device time of BDRLN's Mosaic GPU forward and backward kernels per candidate block size, p = 0.1."""
    from pallas_kernels.bias_dropout_residual_layernorm import kernel_mgpu
    print(f"# {jax.__version__} {jax.devices()[0].device_kind}; BDRLN Mosaic GPU, p=0.1, device time per call, us, "
          f"{a.calls} calls on rotated inputs", flush=True)
    print("| shape | block_rows | steps in flight | programs | fwd kernel | bwd kernel |")
    print("|---|---|---|---|---|---|", flush=True)
    key = jax.random.split(jax.random.key(1), 8)
    seed = seed_from_key(key[7])
    for rows, d in SHAPES["bdrln"]:
        if a.shapes and f"{rows}x{d}" not in a.shapes.split(","):
            continue
        args = bdrln_inputs(key, rows, d)
        default = kernel_mgpu.default_blocks(rows, d)
        for br, k, p in itertools.product((4, 8), (2, 3, 4), (132, 264)):
            blocks = dataclasses.replace(default, block_rows=br, max_concurrent_steps=k, programs=p,
                                         bwd_block_rows=br, bwd_max_concurrent_steps=k, bwd_programs=p)
            fn = _grads_as_carry(lambda *t, b=blocks: bdrln.bias_dropout_residual_layernorm(
                *t, seed=seed, rate=0.1, eps=1e-12, backend="mgpu", blocks=b), 5)
            mark = " (default)" if blocks == default else ""
            try:
                _, fwd, bwd, _ = split(cold_profile(fn, args, a.calls), a.calls)
                print(f"| {rows}x{d} | {br} | {k} | {p}{mark} | {fwd:.1f} | {bwd:.1f} |", flush=True)
            except Exception as e:  # e.g. more shared memory than an SM has
                print(f"| {rows}x{d} | {br} | {k} | {p}{mark} | failed: {type(e).__name__}: {str(e)[:80]} | |",
                      flush=True)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--calls", type=int, default=20)
    ap.add_argument("--ops", default="bdrln,bias_gelu")
    ap.add_argument("--rates", default="0,0.1")
    ap.add_argument("--shapes", default="", help="only shapes whose RxD label is in this comma-separated list")
    ap.add_argument("--impls", default="", help="only these implementations (comma-separated; xla always runs)")
    ap.add_argument("--sweep", action="store_true", help="BDRLN's Mosaic GPU kernels under each candidate Blocks "
                    "(rows per step 4/8, steps in flight 2/3/4, 132/264 programs; forward and backward alike)")
    ap.add_argument("--register-sums", action="store_true", help="BDRLN's Mosaic GPU kernels also with the other "
                    "setting of `bwd_register_sums`")
    ap.add_argument("--copies", action="store_true", help="device time of copies of each operator's forward and "
                    "backward bytes (fp32 x + 1 over half the bytes), the size-matched copy rate")
    a = ap.parse_args()
    if a.sweep:
        return sweep(a)
    if a.copies:
        return copies(a)
    copy_us, copy_gbs = copy_device_time()
    bw = copy_gbs * 1e9
    print(f"# copy probe (fp32 x + 1, 256 MB): device time {copy_us:.1f} us per call, {copy_gbs:.0f} GB/s; "
          f"the same timed as a chain: {copy_chain_bandwidth():.0f} GB/s; percentages below against the device time")
    print(f"# {jax.__version__} {jax.devices()[0].device_kind}; copy {bw / 1e9:.0f} GB/s (fp32 probe); device time "
          f"per call, us, {a.calls} calls on rotated inputs", flush=True)
    print("| op | shape | p | impl | total | fwd kernel | bwd kernel | other (sums, copies) | % of copy BW | vs XLA |")
    print("|---|---|---|---|---|---|---|---|---|---|", flush=True)
    key = jax.random.split(jax.random.key(1), 8)
    seed = seed_from_key(key[7])
    for op in a.ops.split(","):
        for rows, d in SHAPES[op]:
            if a.shapes and f"{rows}x{d}" not in a.shapes.split(","):
                continue
            if op == "bdrln":
                args = bdrln_inputs(key, rows, d)
                tri = bdrln_triton.default_blocks(rows, d)
            else:
                args = (jax.random.normal(key[0], (rows, d), jnp.bfloat16), jax.random.normal(key[2], (d,)))
                tri = bias_gelu_triton.default_blocks(rows, d)
            for rate in (float(r) for r in a.rates.split(",")):
                if op == "bdrln":
                    nbytes = (3 + (5 if rate else 4)) * rows * d * 2
                    ref = lambda *t, rate=rate: bdrln.reference.bias_dropout_residual_layernorm(  # noqa: E731
                        *t, seed=seed, rate=rate, eps=1e-12)
                    fused = lambda *t, rate=rate, **kw: bdrln.bias_dropout_residual_layernorm(  # noqa: E731
                        *t, seed=seed, rate=rate, eps=1e-12, **kw)
                else:
                    nbytes = 5 * rows * d * 2  # reads x, writes y; reads x, dy, writes dx (benchmarks/kernels.py)
                    ref = lambda *t, rate=rate: bias_gelu.reference.bias_gelu(  # noqa: E731
                        *t, seed=seed, rate=rate)
                    fused = lambda *t, rate=rate, **kw: bias_gelu.bias_gelu(*t, seed=seed, rate=rate, **kw)  # noqa: E731
                impls = [("xla", ref), ("triton", lambda *t, f=fused: f(*t, backend="triton"))]
                if tri.bwd_rows_per_program != 16:
                    old = dataclasses.replace(tri, bwd_rows_per_program=16)
                    impls.append(("triton rpp=16", lambda *t, f=fused, b=old: f(*t, backend="triton", blocks=b)))
                impls.append(("mgpu", lambda *t, f=fused: f(*t, backend="mgpu")))
                if op == "bdrln" and a.register_sums:  # the backward's column sums as register carries (and not)
                    from pallas_kernels.bias_dropout_residual_layernorm import kernel_mgpu
                    base = kernel_mgpu.default_blocks(rows, d)
                    other = dataclasses.replace(base, bwd_register_sums=not base.bwd_register_sums)
                    impls.append((f"mgpu register_sums={other.bwd_register_sums}",
                                  lambda *t, f=fused, b=other: f(*t, backend="mgpu", blocks=b)))
                xla = None
                for name, fn in impls:
                    if a.impls and name != "xla" and name.split()[0] not in a.impls.split(","):
                        continue
                    total, fwd, bwd, other = split(cold_profile(_grads_as_carry(fn, len(args)), args, a.calls),
                                                   a.calls)
                    xla = xla or total
                    print(f"| {op} | {rows}x{d} | {rate} | {name} | {total:.1f} | {fwd:.1f} | {bwd:.1f} | "
                          f"{other:.1f} | {100 * nbytes / (total * 1e-6) / bw:.0f}% | {xla / total:.2f}x |",
                          flush=True)


if __name__ == "__main__":
    main()
