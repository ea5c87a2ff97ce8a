"""Plumbing shared by the Mosaic GPU (Hopper+) kernels (`kernel_mgpu.py` of bias_gelu and BDRLN), as `_pallas.py` is
for the Triton ones: `plgpu.kernel` with Lane semantics, the TMA pipeline (and its interpret-mode stand-in),
WG_STRIDED layouts and the shape checks behind the registry's "does it support this call" (`registry.py`).
"""

from __future__ import annotations

import dataclasses
import functools
import inspect
import warnings

import jax
import jax.numpy as jnp
from jax import lax
from jax.experimental import pallas as pl
from jax.experimental.mosaic import gpu as mgpu
from jax.experimental.pallas import mosaic_gpu as plgpu

LANES = 256  # minor dimension of the GMEM views: TMA boxes are at most 256 elements along each dimension
MAX_TILE_ROWS = 256  # the other TMA box dimension
WARPGROUP = 128


def row_block_candidates(around, rows: tuple[int, ...], *, stage: str) -> list:
    """Block sizes to try around `around` for the row-wise Mosaic GPU kernels (the `Blocks` of both share these
    fields): rows per pipeline step (`rows`), tiles in flight and programs (1 or 2 per SM of an H100/H200)."""
    if stage == "fwd":
        return [dataclasses.replace(around, block_rows=br, max_concurrent_steps=k, programs=p)
                for br in rows for k in (2, 4) for p in (132, 264)]
    if stage == "bwd":
        return [dataclasses.replace(around, bwd_block_rows=br, bwd_max_concurrent_steps=k, bwd_programs=p)
                for br in rows for k in (2, 3) for p in (132, 264)]
    raise ValueError(f"{stage=} must be 'fwd' or 'bwd'")


def _load_takes_index() -> bool:
    """jax 0.10's `plgpu.load(ref, idx, ...)` needs the index; 0.11 makes it optional and deprecates it."""
    try:
        return inspect.signature(plgpu.load).parameters["idx"].default is inspect.Parameter.empty
    except (KeyError, TypeError, ValueError):
        return False


_LOAD_TAKES_INDEX = _load_takes_index()


def load(ref, *, layout=None, optimized: bool = True):
    """`plgpu.load` of the whole `ref` (index it with `ref.at[...]` first), without 0.11's deprecated index."""
    if _LOAD_TAKES_INDEX:
        return plgpu.load(ref, (), layout=layout, optimized=optimized)
    return plgpu.load(ref, layout=layout, optimized=optimized)


def store(ref, value, *, interpret: bool):
    """`ref[...] = value` for a value in a TILED register layout, as jax 0.10/0.11 lower it: a plain transfer, no
    planning (`optimized=False`). jax 0.12's `ref[...] =` plans TILED stores and rejects BDRLN's (its row statistics
    are 4-byte stores, not whole 32-byte GMEM sectors; its float32 accumulators move 32-byte vectors across 16-byte
    swizzle tiles); 0.12's `plgpu.store(..., optimized=False)` keeps the old transfer. Index `ref` with `.at[]`."""
    if interpret or not hasattr(plgpu, "store"):  # jax < 0.12: the assignment is the plain transfer
        ref[...] = value
    else:
        plgpu.store(ref, value, optimized=False)


def one_module(fn, static_argnames: tuple[str, ...]):
    """`fn` (a kernel's Python entry) behind one module-level `jax.jit`, so that every call site with the same shapes
    and static arguments shares one lowered Mosaic GPU module, one hash and so one compile per program. jax 0.11's
    Pallas lowering stamps each lowering with a per-process counter (`mosaic_gpu.dump_basename`), so bare calls give
    each call site its own hash and its own compile (the attention backward: ~2.8 s per BERT layer)."""
    return functools.wraps(fn)(jax.jit(fn, static_argnames=static_argnames))


def interpret_available() -> bool:
    """Whether `interpret=True` can run these kernels here: Mosaic GPU's interpret mode exists in this jax (private in
    0.10/0.11) and the backend is the CPU."""
    try:
        from jax._src.pallas.mosaic_gpu.interpret.params import InterpretGPUParams  # noqa: F401
    except ImportError:
        return False
    return jax.default_backend() == "cpu"


def interpret_params(interpret: bool):
    """`interpret=True` runs the kernel in Mosaic GPU's interpret mode (CPU; `InterpretGPUParams`, private in jax
    0.10/0.11); False compiles it for the GPU."""
    if not interpret:
        return None
    from jax._src.pallas.mosaic_gpu.interpret.params import InterpretGPUParams
    return InterpretGPUParams()


def vec_size(dtype) -> int:
    """Elements per thread vector of the WG_STRIDED layout for `dtype` (what a plain SMEM load picks: 8 bytes)."""
    return max(1, 8 // jnp.dtype(dtype).itemsize)


def strided(value, vec: int, interpret: bool):
    """Cast `value` to the WG_STRIDED layout with `vec`-element vectors (a no-op under interpret mode, which has no
    `layout_cast` rule). Placed right after a load, it makes the load itself use that layout."""
    if interpret:
        return value
    return plgpu.layout_cast(value, plgpu.Layout.WG_STRIDED(tuple(value.shape), vec))


def iota(n: int, vec: int, interpret: bool):
    """uint32 [0, n) in the WG_STRIDED layout (Lane-semantics iota needs its layout named)."""
    if interpret:
        return lax.broadcasted_iota(jnp.uint32, (n,), 0)
    return plgpu.broadcasted_iota(jnp.uint32, (n,), 0, layout=plgpu.Layout.WG_STRIDED((n,), vec))


@functools.cache
def _has_fast_instr() -> bool:
    ok = all(hasattr(mgpu.FragmentedArray, f) for f in ("_pointwise", "_lift_fast_instr"))
    if not ok:
        warnings.warn(f"jax {jax.__version__}: Mosaic GPU's FragmentedArray lacks _pointwise/_lift_fast_instr; "
                      "bias+GELU's Mosaic GPU kernels divide instead of using rcp.approx.ftz (slower)", stacklevel=2)
    return ok


def reciprocal(x, vec: int, interpret: bool, *, approx: bool = True):
    """1/x of a float32 WG_STRIDED array. `approx`: PTX `rcp.approx.ftz.f32`, one MUFU.RCP per element (at most 1
    ulp from 1/x; inputs and results below 2^-126 flush to zero). Mosaic GPU has no Pallas-level op for it: `x / y`
    is an IEEE `div.rn.f32` (about ten instructions), and `lax.rsqrt` under `approx_math` is `rsqrt.approx.f32`
    without `.ftz`, which ptxas wraps in a denormal test and two predicated multiplies (bias+GELU's SASS), so the
    instruction goes in through `plgpu.inline_mgpu` and Mosaic GPU's `FragmentedArray._pointwise` /
    `_lift_fast_instr` (private: where a jax lacks them, `1 / x` with a warning, once). Interpret mode (and
    `approx=False`): `1 / x`."""
    if interpret or not approx or not _has_fast_instr():
        return 1.0 / x
    layout = plgpu.Layout.WG_STRIDED(tuple(x.shape), vec)

    @plgpu.inline_mgpu(arg_types=(layout,),
                       return_type=plgpu.ShapeDtypeStruct(tuple(x.shape), jnp.float32, layout))
    def rcp(_, a):
        return a._pointwise(type(a)._lift_fast_instr("rcp.approx.ftz.f32"))

    return rcp(x)


def warpgroup_barrier(interpret: bool, *, auto_barriers: bool) -> None:
    """`bar.sync` over the program's warpgroup, for kernels compiled with `auto_barriers=False` (`kernel_call`): where
    one thread reads what another wrote to SMEM, and before the pipeline refetches into a tile slot the step read.
    Pallas has no op for it, so it goes in through `plgpu.inline_mgpu`. Nothing where Pallas places its own barriers
    (`auto_barriers`) or in interpret mode."""
    if interpret or auto_barriers:
        return

    @plgpu.inline_mgpu()
    def bar(_):
        mgpu.warpgroup_barrier()

    bar()


def seeds(seed_gmem, rate: float):
    """(seed0, seed1, row offset) from a kernel's seed words (`_pallas.seed_words`), read once per program; None
    without dropout."""
    return (seed_gmem[0], seed_gmem[1], seed_gmem[2]) if rate else None


def zeros(n: int, vec: int, interpret: bool):
    """float32 zeros (n,) in the WG_STRIDED layout (a loop carry must keep one layout; a bare constant is splat)."""
    return strided(jnp.zeros((n,), jnp.float32), vec, interpret)


def pipeline(body, *, steps: int, in_specs, out_specs, max_concurrent_steps: int, interpret: bool,
             init_carry=None):
    """`plgpu.emit_pipeline` over a 1-D grid of `steps`. Interpret mode (jax 0.10.2) cannot run it (its predicated
    SMEM->GMEM copies are unimplemented there), so there the same body runs in a plain loop over GMEM windows:
    that checks the math and the indexing, not the TMA pipelining."""
    if not interpret:
        return plgpu.emit_pipeline(body, grid=(steps,), in_specs=in_specs, out_specs=out_specs,
                                   max_concurrent_steps=max_concurrent_steps, init_carry=init_carry)

    def run(*gmem_refs):
        specs = list(in_specs) + list(out_specs)

        def window(spec, ref, s):
            return ref.at[tuple(pl.ds(i * b, b) for i, b in zip(spec.index_map(s), spec.block_shape))]

        def loop(s, carry):
            out = body((s,), *(window(sp, r, s) for sp, r in zip(specs, gmem_refs)),
                       *(() if init_carry is None else (carry,)))
            return carry if init_carry is None else out

        out = lax.fori_loop(0, steps, loop, jnp.int32(0) if init_carry is None else init_carry)
        return None if init_carry is None else out

    return run


def split_programs(tiles: int, target: int) -> tuple[int, int]:
    """(programs, steps) with programs * steps == tiles: the largest divisor of `tiles` not above `target`, or one
    tile per program when that divisor is too small to fill the GPU (the block scheduler then balances)."""
    best = max(d for d in range(1, min(tiles, max(1, target)) + 1) if tiles % d == 0)
    if best * 2 < min(tiles, target):
        return tiles, 1
    return best, tiles // best


def tile_order(interleave: bool, programs: int, steps: int):
    """(program, step) -> tile index: round-robin over the programs (program p takes tiles p, p + programs, ...: all
    programs stream through one window of the arrays together), or a contiguous run of `steps` tiles per program."""
    return (lambda p, s: s * programs + p) if interleave else (lambda p, s: p * steps + s)


def kernel_call(body, out_type, *, programs: int, interpret: bool, approx_math: bool, name: str,
                scratch_types=(), reduction_scratch_bytes: int | None = None, auto_barriers: bool = True):
    """`plgpu.kernel` over a 1-D grid of `programs` named "p", one warpgroup each. `auto_barriers=False`: Pallas
    inserts no warpgroup barrier around stores and before TMA fetches (`CompilerParams.unsafe_no_auto_barriers`);
    the body then places its own (`warpgroup_barrier`) where threads exchange data through SMEM."""
    # Lane semantics, named explicitly: these kernels place every register layout themselves (WG_STRIDED / TILED
    # casts, iotas with a layout). jax 0.11 changed `CompilerParams.lowering_semantics`'s default from Lane to
    # Warpgroup, whose layout-inference pass (mosaic/gpu/layout_inference.py) fails on them (no solution within its
    # fuel for bias_gelu; an IndexError on 1-D tiles for BDRLN at D=768). 0.10 already defaults to Lane.
    params = {"approx_math": approx_math, "lowering_semantics": plgpu.LoweringSemantics.Lane}
    if reduction_scratch_bytes:  # SMEM for cross-warp reductions (default 2 KiB)
        params["reduction_scratch_bytes"] = reduction_scratch_bytes
    if not auto_barriers:
        params["unsafe_no_auto_barriers"] = True
    return plgpu.kernel(body, out_type=out_type, scratch_types=scratch_types, grid=(programs,), grid_names=("p",),
                        compiler_params=plgpu.CompilerParams(**params),
                        interpret=interpret_params(interpret), kernel_name=name)


def check_rows(rows: int, width: int, dtype, block_rows: int, field: str, *, multiple: int | None = None):
    """ValueError (before any compile) for shapes these kernels do not take; the registry says why (`Skip`).
    `width` must be a multiple of `multiple` (default: what the strided bias broadcast needs) and of LANES."""
    item = jnp.dtype(dtype).itemsize
    if item not in (2, 4):
        raise ValueError(f"dtype={jnp.dtype(dtype).name} must be a 16- or 32-bit float for the Mosaic GPU kernel")
    multiple = max(multiple or WARPGROUP * vec_size(dtype), LANES)
    if width % multiple:
        raise ValueError(f"width={width} must be a multiple of {multiple} for the Mosaic GPU kernel "
                         f"({jnp.dtype(dtype).name})")
    if block_rows < 1 or rows % block_rows:
        raise ValueError(f"rows={rows} must be a positive multiple of {field}={block_rows} for the Mosaic GPU kernel")
    if block_rows * width // LANES > MAX_TILE_ROWS:
        raise ValueError(f"{field}={block_rows} x width={width} exceeds a TMA box ({MAX_TILE_ROWS} x {LANES})")
