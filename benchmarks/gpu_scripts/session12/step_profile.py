"""Session 12: where the BERT-large train step's time goes outside the encoder layers, and whether the layer scan's
stacked residual buffers cost what datamovement-h200.md counted (9 GB/step zero-filled by `loop_broadcast_fusion`s
before the loop). `profile`: per-kernel device time of the compiled step (run with XLA's command buffers off), top
kernels and the zero-fills' sum. `ab`: the step timed with the layers in `jax.lax.scan` (as shipped) and unrolled (a
Python loop over the 24 layers, patched in here only), alternating, with compile times.

    XLA_FLAGS=--xla_gpu_enable_command_buffer= PYTHONPATH=. \
        python benchmarks/gpu_scripts/session12/step_profile.py profile 128 64
    PYTHONPATH=. python benchmarks/gpu_scripts/session12/step_profile.py ab 128 64
"""
import collections
import re
import statistics
import sys
import time

import jax

from jaxformer.config import TrainConfig
from jaxformer.data import synthetic_batch
from jaxformer.steps import Steps, build_model, make_optimizer

_scan = jax.lax.scan
LAYERS = 24


def unrolled_scan(f, init, xs, length=None, **kw):
    """lax.scan over the encoder's 24 layers as a Python loop (other scans unchanged)."""
    leaves = jax.tree.leaves(xs)
    if not leaves or leaves[0].shape[0] != LAYERS or kw:
        return _scan(f, init, xs, length=length, **kw)
    carry, ys = init, []
    for i in range(leaves[0].shape[0]):
        carry, y = f(carry, jax.tree.map(lambda a: a[i], xs))
        ys.append(y)
    return carry, None if ys[0] is None else jax.tree.map(lambda *a: jax.numpy.stack(a), *ys)


def build(s, b, config="large"):
    tc = TrainConfig(config=config, seq_len=s, batch_size=b, kernels="pallas", steps=1000, warmup_steps=10,
                     mesh="data=-1")
    cfg = tc.model_config(30522)
    model = build_model(cfg, 0)
    steps = Steps(model, make_optimizer(tc), tc, None)
    state = steps.place(steps.init_state(model, 0))
    p = max(1, round(0.15 * s))
    batches = [steps.place_batch(synthetic_batch(cfg.vocab_size, b, s, p, seed)) for seed in range(4)]
    return steps, state, batches


def time_step(steps, state, batches, n=10, repeats=3):
    t0 = time.perf_counter()
    state, m = steps.train_step(state, batches[0])
    jax.block_until_ready(m)
    compile_s = time.perf_counter() - t0
    for i in range(2):
        state, m = steps.train_step(state, batches[i % 4])
    jax.block_until_ready(m)
    times = []
    for _ in range(repeats):
        t = time.perf_counter()
        for i in range(n):
            state, m = steps.train_step(state, batches[i % 4])
        jax.block_until_ready((state, m))
        times.append((time.perf_counter() - t) / n)
    peak = (jax.devices()[0].memory_stats() or {}).get("peak_bytes_in_use", 0) / 2**30
    return statistics.median(times), times, compile_s, peak, float(m["loss"])


def main(mode, s, b):
    print(f"# {jax.devices()[0].device_kind}, jax {jax.__version__}, mode {mode}, S{s} B{b}", flush=True)
    if mode == "profile":
        from jaxformer.hlo_profile import profile_compiled
        steps, state, batches = build(s, b)
        compiled = steps.train_step.compile(state, batches[0])
        times = profile_compiled(compiled, (state, batches[0]), 3, carry=lambda out, args: (out[0], args[1]),
                                 log=lambda m: print("  " + m), by="both")
        total = sum(times.values()) / 3 / 1e3
        print(f"  kernels summed: {total:.1f} us per step")
        groups = collections.defaultdict(float)
        for k, ns in times.items():
            groups[re.sub(r"[._]\d+", "", k.split(":")[-1].strip())] += ns / 3 / 1e3
        print("  by kind (us per step):")
        for k, us in sorted(groups.items(), key=lambda kv: -kv[1])[:25]:
            print(f"  {us:10.1f}  {100 * us / total:5.1f}%  {k[:100]}")
        print("  top kernels:")
        for k, ns in sorted(times.items(), key=lambda kv: -kv[1])[:40]:
            print(f"  {ns / 3 / 1e3:10.1f}  {k[:140]}")
        zf = sum(ns for k, ns in times.items() if "broadcast" in k) / 3 / 1e3
        print(f"  broadcast fusions (zero-fills) summed: {zf:.1f} us per step", flush=True)
        return
    for form in ("scan", "unrolled", "scan", "unrolled"):
        jax.lax.scan = unrolled_scan if form == "unrolled" else _scan
        steps, state, batches = build(s, b)
        t, ts, c, peak, loss = time_step(steps, state, batches)
        print(f"  {form:9s} {t * 1e3:.2f} ms ({b / t:.1f} seq/s), spread {[round(x * 1e3, 2) for x in ts]}, "
              f"compile {c:.1f} s, peak {peak:.1f} GiB, loss {loss:.4f}", flush=True)
        del steps, state, batches
    jax.lax.scan = _scan


if __name__ == "__main__":
    main(sys.argv[1], int(sys.argv[2]), int(sys.argv[3]))
