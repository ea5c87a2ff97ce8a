"""Block sizes tuned on the GPU at first use, and the choice cached on disk.

Each kernel has a measured default table (`default_block_sizes` / `default_blocks`, tuned on an H200 for BERT's
shapes). For other shapes or GPUs, `JAXFORMER_AUTOTUNE=tune` makes a kernel that meets a new key (GPU, jax version,
operator, shapes, dtype, dropout on/off) while it is being traced time its candidate block sizes there and then:
each candidate is compiled and run forward+backward on random inputs of those shapes, checked against the default's
outputs (a candidate that fails to compile or disagrees is skipped, with a line saying so), timed as
`benchmarks/kernels.py` times operators (`time_step` / `step_clock`), and the fastest is kept if it beats the
default by more than 5% twice (once among the candidates, once more re-timed alternately with the default), and
written to the cache file. Every later trace, in this process or another, reads it. Kernels: flash attention
(forward tiles, then the backward's form and tiles) and the row-wise ones, BDRLN / layernorm and bias+GELU (Triton
or Mosaic GPU: forward tiles, then the backward's chunks), per shard shape; with `backend="auto"` (their default)
the row-wise ones also time the other backend's default blocks first (Triton's on a Hopper GPU where the rule picked
Mosaic GPU, and the reverse), so the backend is chosen per GPU by measurement too, and the winner's candidates
follow. A kernel the default runs in under 25 us is not tuned.

What it is worth, measured (kernels-h200.md, kernels-h100.md): the backend choice moved BDRLN at 32768x1024 with
dropout on an H100 from Mosaic GPU to Triton, 218.7 -> 206.5 us of device time (session 22); block sizes alone
nothing yet at BERT's shapes. On an H200 no candidate beat the BDRLN table; on an H100 (whose tables were never
measured) the first timing harnesses picked candidates 5-40% "faster" that `benchmarks/kernels.py` and the train
step found no faster, which is why winners are now re-timed. Tuning one key takes 1-5 minutes of compiles. It is
for shapes and GPUs the tables never saw.

    JAXFORMER_AUTOTUNE        cache (default): use cached choices, else the default table
                              tune (or 1): also tune keys the cache lacks (progress on stderr)
                              off (or 0): the default table only
    JAXFORMER_AUTOTUNE_CACHE  the cache file (default ~/.cache/jaxformer/autotune.json)

Nothing is tuned or read in interpret mode (CPU), nor tuned with more than one process (every process must compile
the same kernels; a shared cache file written beforehand is still read). The cache is a JSON object {key: {"blocks":
{field: value}, "kind": the blocks' class (its module: the backend), "us": time, "default_us": time}}, written
atomically (a temporary file, then a rename).
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

from .timing import random_inputs, step_clock, time_step  # noqa: F401  (the tuner's clock)

ENV_MODE = "JAXFORMER_AUTOTUNE"
ENV_CACHE = "JAXFORMER_AUTOTUNE_CACHE"
MODES = ("cache", "tune", "off")
_ALIASES = {"": "cache", "1": "tune", "true": "tune", "0": "off", "false": "off"}


def mode() -> str:
    """The autotuning mode from $JAXFORMER_AUTOTUNE (see the module docstring)."""
    raw = os.environ.get(ENV_MODE, "cache")
    m = _ALIASES.get(raw.strip().lower(), raw.strip().lower())
    if m not in MODES:
        raise ValueError(f"{ENV_MODE}={raw!r} must be one of {', '.join(MODES)} (or 1 / 0)")
    return m


def cache_path() -> str:
    return os.environ.get(ENV_CACHE) or os.path.join(os.path.expanduser("~"), ".cache", "jaxformer", "autotune.json")


def cache_key(op: str, **fields) -> str:
    device = jax.devices()[0].device_kind
    return f"{op}|{device}|jax {jax.__version__}|" + ",".join(f"{k}={v}" for k, v in sorted(fields.items()))


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


def _kind(blocks) -> str:
    """The class of a block-size choice, as the cache names it (which kernel module's `Blocks`: the backend)."""
    return f"{type(blocks).__module__}.{type(blocks).__qualname__}"


def _from_fields(default, fields: dict):
    """The blocks a cache entry holds, as an instance of `default`'s class. A field the entry lacks (added to the class
    after the entry was written) takes the class's own default, the kernel's behaviour before the field existed, not
    `default`'s choice for this shape: e.g. BDRLN's `bwd_params_smem`, which `default_blocks` pairs with three
    register sums, would otherwise join an older entry's one sum (measured slower: kernels-h200.md, "Session 25")."""
    names = {f.name for f in dataclasses.fields(default)}
    return dataclasses.replace(type(default)(), **{k: v for k, v in fields.items() if k in names})


def _from_entry(default, alternatives, entry: dict):
    """A cached choice: its fields onto the default of its class (`default` or one of `alternatives`); entries
    without a class (written before backends were tuned) are the default's."""
    kind = entry.get("kind", _kind(default))
    like = next((b for b in (default, *alternatives) if _kind(b) == kind), None)
    if like is None:
        raise ValueError(f"a choice of {kind}, not among the classes tried here")
    return _from_fields(like, entry["blocks"])


def fwd_bwd_bench(fn: Callable, args: tuple):
    """`make_bench`'s (step, args, outputs) for an operator `fn(blocks)(*args)` differentiable in every arg.

    A step is one forward+backward with the output as its own cotangent, the gradients becoming the next args (so
    chained steps are not dead code); `outputs(blocks)` is the output and the gradients for a fixed random cotangent
    (the output itself can make a layernorm's gradient vanish, leaving only rounding noise to compare)."""
    def step(blocks):
        def run(a):
            y, vjp = jax.vjp(fn(blocks), *a)
            return tuple(g.astype(x.dtype) for g, x in zip(vjp(y), a))
        return run

    def outputs(blocks):
        def run(a):
            y, vjp = jax.vjp(fn(blocks), *a)
            ct = jax.tree.map(lambda t: jax.random.normal(jax.random.key(7), t.shape, jnp.float32).astype(t.dtype),
                              y)
            return y, vjp(ct)
        return jax.jit(run)(args)

    return step, args, outputs


def choose_rowwise(op: str, kernels, default, fn: Callable, operands, *, interpret: bool, others=(), **fields):
    """`choose` for a row-wise kernel module `kernels` (BDRLN, bias+GELU; Triton or Mosaic GPU): its
    `candidate_blocks` for the forward, then the backward, timed forward+backward of `fn(blocks)(*args)` on random
    inputs shaped like `operands` (the shard's, possibly tracers: only their shapes and dtypes are kept, so nothing
    of the caller's trace reaches the tuner's thread). `fields` make the cache key with `op`.

    `others`: (module, its default blocks) of other backends that take the shape (`backend="auto"`): their defaults
    are tried first, and the forward and backward candidates are then those of the winner's module; `fn` must run the
    backend of the blocks' class. Returns (module, blocks)."""
    like = [jax.ShapeDtypeStruct(a.shape, a.dtype) for a in operands]
    module_of = {_kind(default): kernels} | {_kind(b): m for m, b in others}
    alternatives = [b for _, b in others]
    stages = ([lambda best: alternatives] if alternatives else []) + [
        lambda best: module_of[_kind(best)].candidate_blocks(best, stage="fwd"),
        lambda best: module_of[_kind(best)].candidate_blocks(best, stage="bwd")]
    best = choose(op, fields, default, stages, lambda: fwd_bwd_bench(fn, random_inputs(like)), interpret=interpret,
                  alternatives=alternatives)
    return module_of[_kind(best)], best


def _max_rel_err(got, want) -> float:
    errs = [float(jnp.linalg.norm((g.astype(jnp.float32) - w.astype(jnp.float32)).ravel()) /
                  (jnp.linalg.norm(w.astype(jnp.float32).ravel()) + 1e-30))
            for g, w in zip(jax.tree.leaves(got), jax.tree.leaves(want))]
    return max(errs, default=0.0)


def choose(op: str, fields: dict, default, stages: Sequence[Callable], make_bench: Callable, *, interpret: bool,
           tol: float = 2e-2, margin: float = 0.05, alternatives=()):
    """The block sizes to use for one kernel call: cached, tuned now, or `default` (see the module docstring).

    `stages`: functions best -> candidate block sizes, tuned one after another (e.g. forward tiles, then the
    backward's); `make_bench()` -> (step, args, outputs): `step(blocks)` maps args to args of the same shapes (a
    forward+backward), `outputs(blocks)` gives what is compared with the default's (relative error < `tol`).
    Called only when tuning. A candidate replaces the best so far only when faster by more than `margin`: on an
    H200 at BERT's shapes the tuner's own timing preferred candidates 1.7% and 3.3% faster than the default table,
    and the train step was 1.5% and 0.5% slower with them (kernels-h200.md, session 8), so a switch must clear 5%.
    `alternatives`: block sizes of other classes (other backends) the stages may return; a cached choice of one of
    them comes back as that class (the entry names it, "kind").
    """
    if interpret:
        return default
    m = mode()
    if m == "off":
        return default
    path = cache_path()
    key = cache_key(op, **fields)
    hit = _load(path).get(key)
    if isinstance(hit, dict) and isinstance(hit.get("blocks"), dict):
        try:
            return _from_entry(default, alternatives, hit)
        except (TypeError, ValueError) as e:
            print(f"jaxformer autotune: ignoring the cached entry {key}: {e}", file=sys.stderr)
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
    _store(path, key, {"blocks": dataclasses.asdict(best), "kind": _kind(best), "us": round(best_t * 1e6, 2),
                       "default_us": round(default_t * 1e6, 2)})
    print(f"jaxformer autotune: {op} {fields}: {best_t * 1e6:.1f} us (default {default_t * 1e6:.1f}), cached in "
          f"{path}", file=sys.stderr)
    return best


MIN_TUNE_US = 25.0  # a kernel the default table runs faster than this is not tuned (see `_tune`)


def _tune(op, default, stages, make_bench, tol, margin):
    step, args, outputs = make_bench()
    want = outputs(default)
    # The default's clock and the best candidate's stay compiled for the re-timing at the end; the others go.
    clocks = {default: step_clock(step(default), args)}
    default_t = best_t = clocks[default]()
    best = default
    if default_t * 1e6 < MIN_TUNE_US:  # a few us to gain at most, within the timing noise at these sizes (H100,
        # session 9: the MLM head's small bias+GELU timed 13-30 us across candidates), for minutes of compiles
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
            print(f"{tag}: {t * 1e6:.1f} us (best {best_t * 1e6:.1f})", file=sys.stderr, flush=True)
            if t < best_t * (1 - margin):  # a switch must clear the timing noise (see `choose`)
                if best != default:
                    del clocks[best]  # a beaten candidate is not timed again
                best, best_t, clocks[c] = c, t, clock
    if best == default:
        return best, best_t, default_t
    # Confirm: the winner and the default timed again, alternately. Single timings of a ~50-150 us kernel picked
    # "winners" 5-40% ahead that benchmarks/kernels.py then found no faster or slower (H100, session 9).
    again = {default: [], best: []}
    for blocks in (default, best, default, best):
        again[blocks].append(clocks[blocks]())
    default_t, best_t = min(again[default]), min(again[best])
    confirmed = best_t < default_t * (1 - margin)
    print(f"jaxformer autotune: {op}: retimed, default {default_t * 1e6:.1f} us, chosen {best_t * 1e6:.1f} us: "
          f"{'confirmed' if confirmed else 'not confirmed, the default kept'}", file=sys.stderr, flush=True)
    return (best, best_t, default_t) if confirmed else (default, default_t, default_t)
