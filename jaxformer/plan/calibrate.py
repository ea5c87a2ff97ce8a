"""`python -m jaxformer.plan --calibrate FILE`: measure the rates the model uses on this machine's GPUs.

* GEMMs at BERT-base's and BERT-large's shapes (QKV, attention output, the two feed-forward GEMMs, whole and split
  in two for tensor parallelism) on 2048 and 8192 tokens, bf16, each chained with its shape back (`gemm_pair_step`):
  time = t0 + flop / rate, least squares;
* the copy bandwidth (a streaming scale of 256 MiB, read + write counted);
* the least time a launched operator costs (`measure_launch`): chains of tiny operators, in a loop and in a straight
  line, wall-clock time over the operators XLA launches (`jaxformer.hlo_analysis.Report.launches`);
* with more than one device, all-reduce, all-gather, reduce-scatter, all-to-all and a ring permute over all of
  them, 4 KiB to 64 MiB per device: time = steps x alpha + wire bytes / beta (ring algorithms), least squares.

Every step is timed by `pallas_kernels.timing.time_step` (chained in one jit, inputs rotated past the L2, the launch
overhead cancelled between two chain lengths). About a minute and a half on two H100s.
"""

from __future__ import annotations

import datetime
import json
import math
import sys
from pathlib import Path

import numpy as np

from .hardware import COLLECTIVE_KINDS, ring_steps, wire_fraction

GEMM_WIDTHS = {"base": (768, 3072), "large": (1024, 4096)}
MESSAGE_BYTES = tuple(4 ** i * 1024 for i in range(0, 9))  # 4 KiB .. 64 MiB


def gemm_shapes(tokens=(2048, 8192)) -> list[tuple[int, int, int]]:
    """(m, k, n) of BERT's layer GEMMs: QKV (D -> 3D), attention output (D -> D), FFN (D -> F, F -> D), each whole and
    with its split dimension halved (tensor parallelism over two GPUs)."""
    out = []
    for d, f in GEMM_WIDTHS.values():
        for m in tokens:
            for k, n in ((d, 3 * d), (d, d), (d, f), (f, d), (d, 3 * d // 2), (d // 2, d), (d, f // 2), (f // 2, d)):
                out.append((m, k, n))
    return sorted(set(out))


def fit_line(x, y, weights=None) -> tuple[float, float]:
    """Least squares y = a + b x with a, b >= 0 (relative errors: each point weighted by 1/y)."""
    x, y = np.asarray(x, float), np.asarray(y, float)
    w = 1.0 / y if weights is None else np.asarray(weights)
    A = np.stack([np.ones_like(x), x], axis=1) * w[:, None]
    a, b = np.linalg.lstsq(A, y * w, rcond=None)[0]
    if a < 0:  # no intercept: through the origin
        a, b = 0.0, float(np.sum(w * w * x * y) / np.sum(w * w * x * x))
    if b <= 0:
        b = float(np.min(y / x))
    return float(a), float(b)


def _time(step, args, quick: bool) -> float:
    from pallas_kernels.timing import time_step
    return time_step(step, args, repeats=3 if quick else 5, rotate_bytes=2**20 if quick else None)


def gemm_pair(m: int, k: int, n: int, seed: int = 0) -> tuple:
    """Operands of `gemm_pair_step`: x (m, k), w1 (k, n), w2 (n, k), bf16, the weights scaled by 1/sqrt(fan-in) so
    that values stay near unit size along a chain."""
    import jax
    import jax.numpy as jnp
    key = jax.random.split(jax.random.key(seed + m + k + n), 3)
    return tuple((jax.random.normal(kk, shape, jnp.float32) * scale).astype(jnp.bfloat16)
                 for kk, shape, scale in ((key[0], (m, k), 1.0), (key[1], (k, n), k ** -0.5),
                                          (key[2], (n, k), n ** -0.5)))


def gemm_pair_step(args: tuple) -> tuple:
    """Two GEMMs of 2mkn flop each, x (m, k) @ w1 (k, n) @ w2 (n, k) -> the next x: each product feeds the next
    (nothing is dead code) and no pass over memory is added beside the GEMMs' own reads and writes (the chain it
    replaced, `c + a @ w`, read and wrote a carried output once more per GEMM, which put the fitted rate below what
    the step's GEMMs reach: docs/performance-model.md, calibration)."""
    x, w1, w2 = args
    return (x @ w1) @ w2, w1, w2


def measure_gemm_rate(m: int = 8192, k: int = 1024, n: int = 4096, quick: bool = False) -> dict:
    """bf16 flop/s of chained GEMM pairs (`gemm_pair_step`) at (m, k, n) and back: the GEMM rate this device reaches
    at a shape, timed by `pallas_kernels.timing.time_step` (8192 x 1024 x 4096: BERT-large's feed-forward GEMMs on
    64 x 128 tokens). {m, k, n, flop (per GEMM), seconds (per GEMM), flop_per_s}."""
    t = _time(gemm_pair_step, gemm_pair(m, k, n), quick) / 2
    return dict(m=m, k=k, n=n, flop=2.0 * m * k * n, seconds=t, flop_per_s=2.0 * m * k * n / t)


def measure_gemms(shapes, quick: bool = False) -> list[dict]:
    """{m, k, n, flop, seconds} per shape: half a `gemm_pair_step` at (m, k, n) (its GEMM and the one back)."""
    return [{key: r[key] for key in ("m", "k", "n", "flop", "seconds")}
            for r in (measure_gemm_rate(m, k, n, quick) for m, k, n in shapes)]


def measure_copy(nbytes: int, quick: bool = False) -> dict:
    import jax.numpy as jnp
    x = jnp.ones((nbytes // 4,), jnp.float32)
    t = _time(lambda args: (args[0] * 1.0001,), (x,), quick)
    return dict(bytes=2 * nbytes, seconds=t)


def launch_chain(n_ops: int, trips: int, loop: bool):
    """A jitted chain of `n_ops` x `trips` links on 256 floats, as a `fori_loop` of `trips` trips or in a straight
    line: each link a sort (never fused with its neighbours) and a negation (its own small kernel), each waiting for
    the one before and taking far less time than launching it does."""
    import jax
    import jax.numpy as jnp

    def chain(x, n):
        for _ in range(n):
            x = -jnp.sort(x)
        return x

    if loop:
        return jax.jit(lambda x: jax.lax.fori_loop(0, trips, lambda i, y: chain(y, n_ops), x))
    return jax.jit(lambda x: chain(x, n_ops * trips))


def measure_launch(quick: bool = False) -> dict:
    """Seconds per launched operator when operators are too small to keep the GPU busy: the host's cost of launching
    one (XLA's thunks, the driver), or the GPU's least time per kernel, whichever is larger. {"loop": ..., "straight":
    ...}, each {ops, seconds, per_op}: inside a while loop (the pipeline's tick loop and layer scans) and in the
    step's straight line (where XLA may replay runs of kernels as CUDA graphs). Wall-clock, median of repeats."""
    import jax.numpy as jnp
    from pallas_kernels.timing import median_seconds

    from ..hlo_analysis import analyze

    n_ops, trips = (8, 4) if quick else (64, 32)
    x = jnp.ones((256,), jnp.float32)
    out = {}
    for name, loop in (("loop", True), ("straight", False)):
        f = launch_chain(n_ops, trips, loop)
        compiled = f.lower(x).compile()
        ops = analyze(compiled.as_text()).launches()
        median_seconds(compiled, x, 3)  # warm-up
        t = median_seconds(compiled, x, 3 if quick else 11)
        out[name] = dict(ops=ops, seconds=t, per_op=t / ops)
    return out


def measure_collectives(sizes, quick: bool = False) -> dict:
    """{kind: [{bytes, seconds, n}]}: per-device buffer bytes (all-gather: the gathered result; reduce-scatter: the
    operand), float32."""
    import jax
    import jax.numpy as jnp
    from jax.sharding import Mesh, PartitionSpec as P

    devices = jax.devices()
    n = len(devices)
    mesh = Mesh(np.array(devices), ("i",))
    perm = [(i, (i + 1) % n) for i in range(n)]

    def sm(f):
        return jax.shard_map(f, mesh=mesh, in_specs=P("i"), out_specs=P("i"), check_vma=False)

    same = {"all-reduce": sm(lambda x: jax.lax.psum(x, "i") * (1.0 / n)),
            "collective-permute": sm(lambda x: jax.lax.ppermute(x, "i", perm)),
            "all-to-all": sm(lambda x: jax.lax.all_to_all(x, "i", 0, 0, tiled=True))}
    # Each step's result feeds the next step's operand (a few elements of it), so no collective is dead code
    gather = sm(lambda x: x + jax.lax.all_gather(x, "i", tiled=True)[:x.shape[0]])
    scatter = sm(lambda y: (lambda s: y.at[:s.shape[0]].add(s))(jax.lax.psum_scatter(y, "i", tiled=True)))
    out = {k: [] for k in COLLECTIVE_KINDS}
    for kind in COLLECTIVE_KINDS:
        for size in sizes:
            big = max(size // 4 // n * n, n)  # float32 elements per device (the larger side), divisible by n
            y = jnp.ones((big * n,), jnp.float32)  # `big` per device
            x = jnp.ones((big,), jnp.float32)  # `big / n` per device
            if kind in same:
                f = same[kind]
                t = _time(lambda a, f=f: (f(a[0]),), (y,), quick)
            elif kind == "all-gather":
                t = _time(lambda a: (gather(a[0]),), (x,), quick)
            else:
                t = _time(lambda a: (scatter(a[0]),), (y,), quick)
            out[kind].append(dict(bytes=4 * big, seconds=t, n=n))
    return out


def _valid(rows):
    return [r for r in rows if math.isfinite(r["seconds"]) and r["seconds"] > 0]


def fit(raw: dict) -> dict:
    g = _valid(raw["gemm"])
    if len(g) < 2:
        raise RuntimeError(f"calibrate: only {len(g)} GEMM timings succeeded; cannot fit the GEMM rate")
    t0, inv_rate = fit_line([r["flop"] for r in g], [r["seconds"] for r in g])
    copy = raw["copy"]
    res = dict(gemm_rate=1.0 / inv_rate, gemm_t0=t0, copy_bps=copy["bytes"] / copy["seconds"], collectives={})
    if "launch" in raw:
        res["launch_s"] = {k: v["per_op"] for k, v in raw["launch"].items()}
    for kind, rows in raw.get("collectives", {}).items():
        rows = _valid(rows)
        if len(rows) < 2:
            continue
        n = rows[0]["n"]
        # t = steps * alpha + wire * M / beta: a line in M with intercept steps * alpha and slope wire / beta
        a, b = fit_line([r["bytes"] for r in rows], [r["seconds"] for r in rows])
        res["collectives"][kind] = dict(alpha=a / max(ring_steps(kind, n), 1), beta=wire_fraction(kind, n) / b)
    return res


def calibrate(path: str, quick: bool = False, log=lambda m: print(m, file=sys.stderr, flush=True)) -> dict:
    """Measure and write `path` (JSON: the raw timings and the fitted rates). `quick`: tiny sizes (tests on CPU)."""
    import jax

    devices = jax.devices()
    raw = dict(device=devices[0].device_kind, gpus=len(devices), platform=devices[0].platform, jax=jax.__version__,
               date=datetime.date.today().isoformat())
    shapes = [(256, 256, 256), (512, 256, 512), (512, 512, 512)] if quick else gemm_shapes()
    log(f"calibrate: {len(shapes)} GEMMs on {raw['device']}")
    raw["gemm"] = measure_gemms(shapes, quick)
    raw["copy"] = measure_copy(2**22 if quick else 256 * 2**20, quick)
    raw["launch"] = measure_launch(quick)
    if len(devices) > 1:
        sizes = (2**16, 2**20) if quick else MESSAGE_BYTES
        log(f"calibrate: 5 collectives x {len(sizes)} sizes over {len(devices)} devices")
        raw["collectives"] = measure_collectives(sizes, quick)
    raw["fit"] = fit(raw)
    f = raw["fit"]
    log(f"calibrate: GEMM {f['gemm_rate'] / 1e12:.0f} TFLOP/s + {f['gemm_t0'] * 1e6:.1f} us, copy "
        f"{f['copy_bps'] / 1e12:.2f} TB/s, launch {f['launch_s']['loop'] * 1e6:.2f} us per operator in a loop, "
        f"{f['launch_s']['straight'] * 1e6:.2f} in a straight line"
        + "".join(f", {k} {v['beta'] / 1e9:.0f} GB/s + {v['alpha'] * 1e6:.1f} us" for k, v in f["collectives"].items()))
    Path(path).write_text(json.dumps(raw, indent=1))
    return raw
