"""The clock shared by the autotuner, the kernel benchmarks and the layout search: a step chained in one jit,
inputs rotated past the L2, two run lengths whose difference cancels the launch overhead; and `time_steps`, the
benchmarks' wall clock of a whole train step."""

from __future__ import annotations

import statistics
import sys
import time
from typing import Callable

import jax
import jax.numpy as jnp


ROTATE_BYTES = 180 * 2**20  # 3x an H200's L2 (60 MB): no step finds its operands still cached from the last one


def step_clock(step: Callable, args: tuple, *, lengths=(2, 10), rotate_bytes: int | None = None,
               max_copies: int | None = 8) -> Callable:
    """`time_step`'s chains for `step`, compiled once: returns `clock(repeats=5, nan_on_failure=True)` -> seconds per
    step, which can be called again without compiling again (the tuner re-times its winner and the default)."""
    rotate_bytes = ROTATE_BYTES if rotate_bytes is None else rotate_bytes
    size = sum(a.nbytes for a in jax.tree.leaves(args))
    k = max(1, -(-rotate_bytes // max(size, 1)))
    k = min(k, max_copies) if max_copies else k
    copies = tuple(jax.tree.map(lambda a, i=i: a + jnp.zeros((), a.dtype) if i else a, args) for i in range(k))
    calls = []
    for n in lengths:
        def chain(cs, n=n):
            cs = list(cs)
            for i in range(n * k):
                cs[i % k] = step(cs[i % k])
                cs = list(jax.lax.optimization_barrier(tuple(cs)))
            return tuple(cs)
        f = jax.jit(chain)
        jax.block_until_ready(f(copies))
        calls.append(f)

    def clock(repeats: int = 5, nan_on_failure: bool = True) -> float:
        for _ in range(3):  # the longer chain timed no slower than the shorter: a failed measurement, measured again
            runs = [_median_seconds(f, copies, repeats) for f in calls]
            if runs[1] > runs[0]:
                return (runs[1] - runs[0]) / ((lengths[1] - lengths[0]) * k)
        if not nan_on_failure:  # benchmarks/kernels.py and the layout search: the last difference, as they always had
            return (runs[1] - runs[0]) / ((lengths[1] - lengths[0]) * k)
        print(f"jaxformer autotune: no time measured ({lengths[1]} rounds took {runs[1] * 1e6:.0f} us, {lengths[0]} "
              f"took {runs[0] * 1e6:.0f}, three times)", file=sys.stderr, flush=True)
        return float("nan")  # never the fastest: `t < best` is False (a 0.0 us reading could win a tuning)

    return clock


def time_step(step: Callable, args: tuple, *, lengths=(2, 10), repeats: int = 5, rotate_bytes: int | None = None,
              max_copies: int | None = 8, nan_on_failure: bool = True) -> float:
    """Seconds per `step` (args -> args of the same shapes), as DESIGN.md and `benchmarks/kernels.py` time kernels.

    K copies of `args` (K x their bytes >= `rotate_bytes`, default `ROTATE_BYTES`; at most `max_copies`) are
    stepped in turn, so a step reads operands last touched K steps before (not from the L2); n rounds of that are
    unrolled in one jit with an `optimization_barrier` after each step (XLA fuses nothing across steps), for n in
    `lengths`; the time per step is (T(n2) - T(n1)) / ((n2 - n1) K), which cancels the launch overhead; median of
    `repeats`. (A `fori_loop` chain added 25-40 us per step on an H100 and ranked block sizes wrongly; so did (1, 3)
    rounds: kernels-h100.md, autotuning.)"""
    return step_clock(step, args, lengths=lengths, rotate_bytes=rotate_bytes, max_copies=max_copies)(
        repeats, nan_on_failure)


def _median_seconds(f, args, repeats: int) -> float:
    times = []
    for _ in range(repeats):
        t = time.perf_counter()
        jax.block_until_ready(f(args))
        times.append(time.perf_counter() - t)
    return statistics.median(times)


def median_seconds(f, args, repeats: int) -> float:
    """Wall-clock seconds of `f(args)` to completion, median of `repeats` calls (launch overhead included)."""
    return _median_seconds(f, args, repeats)


def random_inputs(like, seed: int = 0) -> tuple:
    """Standard-normal arrays with the shapes and dtypes of `like` (arrays or ShapeDtypeStructs), for tuning."""
    keys = jax.random.split(jax.random.key(seed), len(like))
    return tuple(jax.random.normal(k, a.shape, jnp.float32).astype(a.dtype) for k, a in zip(keys, like))


def grads_as_carry(fn: Callable, n_in: int) -> Callable:
    """A forward+backward step of `fn`: its VJP with the output as its own cotangent, the gradients of the first
    `n_in` arguments becoming the next step's arguments (so chained steps are not dead code)."""
    def step(args):
        y, vjp = jax.vjp(fn, *args)
        grads = vjp(y)
        cast = lambda g, a: jax.tree.map(lambda g, a: g.astype(a.dtype), g, a)  # noqa: E731
        return tuple(cast(g, a) for g, a in zip(grads[:n_in], args)) + tuple(args[n_in:])
    return step


def time_steps(train_step, state, batches, steps: int, repeats: int, warmup: int = 0):
    """Wall-clock time of a whole stateful step (a train step) called back to back, chained through its donated
    state and cycling over the placed `batches`: the first call (compile included), `warmup` more, then `repeats`
    timings of `steps` steps. Returns the last state and output, the first call's seconds and each repeat's seconds
    per step (the benchmarks' train-step timing; the kernels use `time_step`)."""
    t0 = time.perf_counter()
    state, m = train_step(state, batches[0])
    jax.block_until_ready(m)
    compile_s = time.perf_counter() - t0
    for i in range(warmup):
        state, m = train_step(state, batches[i % len(batches)])
    jax.block_until_ready(m)
    times = []
    for _ in range(repeats):
        t = time.perf_counter()
        for i in range(steps):
            state, m = train_step(state, batches[i % len(batches)])
        jax.block_until_ready((state, m))
        times.append((time.perf_counter() - t) / steps)
    return state, m, compile_s, times
