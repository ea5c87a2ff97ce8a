"""Implementations and block sizes tuned on the GPU at first use, the choice cached on disk.

The registry picks an implementation and its default blocks for every call (`pallas_kernels.registry`). Under
`JAXFORMER_AUTOTUNE=tune`, a kernel call whose key (GPU, jax version, operator, per-shard call) the cache lacks is
tuned while it is traced: the other implementations that can run it (`registry.runnable`) are timed with their
defaults, then the fastest one's forward candidates, then its backward's. Each candidate is compiled and run
forward+backward on random inputs of the call's shapes, checked against the default's outputs (one that does not
compile or disagrees is skipped, with a line saying so) and timed by `pallas_kernels.timing`; the fastest is kept if
it beats the default by more than 5% twice (among the candidates, then re-timed alternately with the default), and
written to the cache file, which every later trace reads. A call the default runs in under 25 us is not tuned.
Tuning one key takes minutes of compiles: it is for shapes and GPUs the default tables were not measured on
(kernels-h200.md and kernels-h100.md, autotuning).

    JAXFORMER_AUTOTUNE        cache (default): cached choices, else the registry's
                              tune (or 1): also tune keys the cache lacks (progress on stderr)
                              off (or 0): the registry's choices only
    JAXFORMER_AUTOTUNE_CACHE  the cache file (default ~/.cache/jaxformer/autotune.json)

Nothing is tuned or read in interpret mode (CPU), nor tuned with more than one process (each must compile the same
kernels; a cache file written beforehand is still read). The cache is a JSON object {key: {"impl": name, "blocks":
{field: value}, "us": time, "default_us": time}}, written atomically; an entry that does not match this code's
implementations and configs is ignored, with one line on stderr.
"""

from __future__ import annotations

import concurrent.futures
import dataclasses
import json
import os
import sys
import tempfile
from typing import Callable, Sequence

import jax
import jax.numpy as jnp

from . import registry
from .registry import Choice, Device
from .timing import random_inputs, step_clock

ENV_MODE = "JAXFORMER_AUTOTUNE"
ENV_CACHE = "JAXFORMER_AUTOTUNE_CACHE"
MODES = ("cache", "tune", "off")
_ALIASES = {"": "cache", "1": "tune", "true": "tune", "0": "off", "false": "off"}
MIN_TUNE_US = 25.0  # a call the default runs faster than this is not tuned: a few us to gain, within the noise


def mode() -> str:
    """The autotuning mode from $JAXFORMER_AUTOTUNE (see the module docstring)."""
    raw = os.environ.get(ENV_MODE, "cache")
    m = _ALIASES.get(raw.strip().lower(), raw.strip().lower())
    if m not in MODES:
        raise ValueError(f"{ENV_MODE}={raw!r} must be one of {', '.join(MODES)} (or 1 / 0)")
    return m


def cache_path() -> str:
    return os.environ.get(ENV_CACHE) or os.path.join(os.path.expanduser("~"), ".cache", "jaxformer", "autotune.json")


def cache_key(op: str, device: Device, **fields) -> str:
    return f"{op}|{device.kind}|jax {jax.__version__}|" + ",".join(f"{k}={v}" for k, v in sorted(fields.items()))


def tuned(op: str, call, device: Device, choice: Choice, fn: Callable, like: Sequence, *, interpret: bool,
          named: bool = False) -> Choice:
    """The registry's `choice` for `call`, or the cached (or, tuning, newly tuned) one. `fn(choice)(*operands)` runs
    the operator with a choice on operands shaped like `like` (the shard's; only shapes and dtypes are kept, so
    nothing of the caller's trace reaches the tuner's thread). `named`: the caller named the implementation, so only
    its configs are tried; else every implementation that can run the call is."""
    if not choice.impl.kernel:
        return choice
    alternatives = [] if named else registry.runnable(op, call, device, choice)[1:]
    stages = ([lambda best: alternatives] if alternatives else []) + [
        lambda best, stage=stage: [Choice(best.impl, c) for c in best.impl.candidates(best.config, call, device, stage)]
        for stage in ("fwd", "bwd")]
    like = [jax.ShapeDtypeStruct(a.shape, a.dtype) for a in like]
    return choose(op, dataclasses.asdict(call), choice, stages, lambda: fwd_bwd_bench(fn, random_inputs(like)),
                  interpret=interpret, alternatives=alternatives, device=device)


def fwd_bwd_bench(fn: Callable, args: tuple):
    """`choose`'s (step, args, outputs) for an operator `fn(choice)(*args)` differentiable in every arg.

    A step is one forward+backward with the output as its own cotangent, the gradients becoming the next args (so
    chained steps are not dead code); `outputs(choice)` is the output and the gradients for a fixed random
    cotangent (the output itself can make a layernorm's gradient vanish, leaving only rounding noise to compare)."""
    def step(choice):
        def run(a):
            y, vjp = jax.vjp(fn(choice), *a)
            return tuple(g.astype(x.dtype) for g, x in zip(vjp(y), a))
        return run

    def outputs(choice):
        def run(a):
            y, vjp = jax.vjp(fn(choice), *a)
            ct = jax.tree.map(lambda t: jax.random.normal(jax.random.key(7), t.shape, jnp.float32).astype(t.dtype),
                              y)
            return y, vjp(ct)
        return jax.jit(run)(args)

    return step, args, outputs


def choose(op: str, fields: dict, default: Choice, stages: Sequence[Callable], make_bench: Callable, *,
           interpret: bool, alternatives: Sequence[Choice] = (), device: Device | None = None, tol: float = 2e-2,
           margin: float = 0.05) -> Choice:
    """The choice for one call: cached, tuned now, or `default` (see the module docstring).

    `stages`: functions best -> candidate choices, tuned one after another; `make_bench()` -> (step, args, outputs):
    `step(choice)` maps args to args of the same shapes (a forward+backward), `outputs(choice)` gives what is compared
    with the default's (relative error < `tol`). A candidate replaces the best so far only when faster by more than
    `margin`: single timings at BERT's shapes preferred candidates that the train step then ran slower with.
    `alternatives`: the other implementations' defaults the stages may return; a cached choice of one of them is
    read back as that implementation."""
    if interpret:
        return default
    m = mode()
    if m == "off":
        return default
    path = cache_path()
    key = cache_key(op, Device.current() if device is None else device, **fields)
    hit = _load(path).get(key)
    if hit is not None:
        try:
            return _from_entry(hit, [default, *alternatives])
        except (TypeError, ValueError, KeyError) as e:
            print(f"jaxformer autotune: ignoring the cached entry {key}: {type(e).__name__}: {e}", file=sys.stderr)
    if m != "tune":
        return default
    if jax.process_count() > 1:
        print(f"jaxformer autotune: {op} not tuned with {jax.process_count()} processes (each must compile the "
              "same kernels); tune on one process first, with the same cache file", file=sys.stderr)
        return default
    # In a fresh thread: JAX's trace state is per thread, so the candidates compile and run for real even while the
    # caller is being traced (by jit, shard_map, a custom_vjp, ...), and no mesh context of the caller applies.
    with concurrent.futures.ThreadPoolExecutor(max_workers=1) as pool:
        best, best_t, default_t = pool.submit(_tune, op, default, stages, make_bench, tol, margin).result()
    _store(path, key, {"impl": best.impl.name, "blocks": _fields_of(best.config), "us": round(best_t * 1e6, 2),
                       "default_us": round(default_t * 1e6, 2)})
    print(f"jaxformer autotune: {op} {fields}: {best.impl.name} {best_t * 1e6:.1f} us (default "
          f"{default.impl.name} {default_t * 1e6:.1f}), cached in {path}", file=sys.stderr)
    return best


def _fields_of(config):
    return None if config is None else dataclasses.asdict(config)


def _from_entry(entry: dict, options: Sequence[Choice]) -> Choice:
    """The choice a cache entry holds: an implementation among `options` (those that can run the call here) and a
    config with exactly the fields of that implementation's config class."""
    by_name = {c.impl.name: c for c in options}
    like = by_name.get(entry["impl"])
    if like is None:
        raise ValueError(f"impl={entry['impl']!r} is not among those that run here ({sorted(by_name)})")
    blocks = entry["blocks"]
    if like.config is None or blocks is None:
        if like.config is not None or blocks is not None:
            raise ValueError(f"blocks={blocks!r} do not match {like.impl.name}'s config {like.config!r}")
        return Choice(like.impl, None)
    cls = type(like.config)
    names = {f.name for f in dataclasses.fields(cls)}
    if set(blocks) != names:
        raise ValueError(f"the fields {sorted(set(blocks) ^ names)} differ from {cls.__qualname__}'s")
    return Choice(like.impl, cls(**blocks))


_READ: dict = {}  # (path, mtime, size) -> the parsed cache: every trace of a kernel looks its key up


def _load(path: str) -> dict:
    """The cache file's entries ({} if absent or unreadable); parsed once per version of the file. Read-only."""
    try:
        st = os.stat(path)
        version = (path, st.st_mtime_ns, st.st_size)
        if version not in _READ:
            with open(path) as f:
                data = json.load(f)
            _READ.clear()
            _READ[version] = data if isinstance(data, dict) else {}
        return _READ[version]
    except FileNotFoundError:
        return {}
    except (OSError, ValueError) as e:  # unreadable or corrupt: tuned choices are an optimisation, never fatal
        print(f"jaxformer autotune: ignoring the cache {path}: {type(e).__name__}: {e}", file=sys.stderr)
        return {}


def _store(path: str, key: str, entry: dict) -> None:
    """Merge `entry` under `key` into the cache file (re-read first, so concurrent writers lose at most a race)."""
    try:
        os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
        data = {**_load(path), key: entry}
        fd, tmp = tempfile.mkstemp(dir=os.path.dirname(os.path.abspath(path)), prefix=".autotune-", suffix=".json")
        with os.fdopen(fd, "w") as f:
            json.dump(data, f, indent=1, sort_keys=True)
        os.replace(tmp, path)
    except OSError as e:
        print(f"jaxformer autotune: could not write the cache {path}: {e}", file=sys.stderr)


def _max_rel_err(got, want) -> float:
    errs = [float(jnp.linalg.norm((g.astype(jnp.float32) - w.astype(jnp.float32)).ravel()) /
                  (jnp.linalg.norm(w.astype(jnp.float32).ravel()) + 1e-30))
            for g, w in zip(jax.tree.leaves(got), jax.tree.leaves(want))]
    return max(errs, default=0.0)


def _tune(op, default, stages, make_bench, tol, margin):
    step, args, outputs = make_bench()
    want = outputs(default)
    # The default's clock and the best candidate's stay compiled for the re-timing at the end; the others go.
    clocks = {default: step_clock(step(default), args)}
    default_t = best_t = clocks[default]()
    best = default
    if default_t * 1e6 < MIN_TUNE_US:
        print(f"jaxformer autotune: {op}: {default_t * 1e6:.1f} us with the default blocks, under "
              f"{MIN_TUNE_US:.0f} us: not tuned", file=sys.stderr, flush=True)
        return best, best_t, default_t
    for i, stage in enumerate(stages):
        candidates = [c for c in dict.fromkeys(stage(best)) if c != best]
        for j, c in enumerate(candidates):
            tag = f"jaxformer autotune: {op} stage {i + 1}/{len(stages)}, candidate {j + 1}/{len(candidates)}"
            try:
                err = _max_rel_err(outputs(c), want)
                if not err < tol:
                    raise ValueError(f"relative error {err:.2e} against the default blocks' outputs")
                clock = step_clock(step(c), args)
                t = clock()
            except Exception as e:  # noqa: BLE001 - a candidate that does not compile or disagrees is skipped
                print(f"{tag}: skipped ({type(e).__name__}: {str(e)[:200]})", file=sys.stderr, flush=True)
                continue
            print(f"{tag}: {c.impl.name} {t * 1e6:.1f} us (best {best_t * 1e6:.1f})", file=sys.stderr, flush=True)
            if t < best_t * (1 - margin):  # a switch must clear the timing noise (see `choose`)
                if best != default:
                    del clocks[best]  # a beaten candidate is not timed again
                best, best_t, clocks[c] = c, t, clock
    if best == default:
        return best, best_t, default_t
    # Confirm: the winner and the default timed again, alternately (single timings of a ~50-150 us kernel picked
    # winners 5-40% ahead that the benchmarks then found no faster).
    again = {default: [], best: []}
    for choice in (default, best, default, best):
        again[choice].append(clocks[choice]())
    default_t, best_t = min(again[default]), min(again[best])
    confirmed = best_t < default_t * (1 - margin)
    print(f"jaxformer autotune: {op}: retimed, default {default_t * 1e6:.1f} us, chosen {best_t * 1e6:.1f} us: "
          f"{'confirmed' if confirmed else 'not confirmed, the default kept'}", file=sys.stderr, flush=True)
    return (best, best_t, default_t) if confirmed else (default, default_t, default_t)
