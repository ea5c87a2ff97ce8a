"""Block sizes of the Triton flash-attention kernels: the dataclass, its defaults per shape, the autotuner's
candidates, and the shape checks run before anything compiles."""

import dataclasses

import jax.numpy as jnp

from .._pallas import fit_pow2


@dataclasses.dataclass(frozen=True)
class Blocks:
    """Tile sizes (powers of two >= 16; S and T must be multiples of them), Triton launch parameters, and the form
    of the backward (the dK/dV + dQ pair or one kernel; row- or key-major tiles; dS stored or recomputed)."""

    block_q: int = 128  # forward: query rows per program
    block_k: int = 64  # forward: keys per inner-loop step
    block_q_dkv: int = 32  # dK/dV kernel: query rows per inner-loop step
    block_k_dkv: int = 64  # dK/dV kernel: keys per program
    block_q_dq: int = 64  # dQ kernel: query rows per program
    block_k_dq: int = 32  # dQ kernel: keys per inner-loop step
    num_warps: int = 4
    num_stages: int = 3  # 3 measured faster than 2 for all three kernels at S=128 and 512 (kernels-h200.md)
    num_warps_bwd: int = 4  # the dK/dV kernel (and the dQ kernel unless set below)
    num_stages_bwd: int = 3
    num_warps_dq: int | None = None  # None: num_warps_bwd
    num_stages_dq: int | None = None  # None: num_stages_bwd
    # One backward kernel per (b, n) holding all T keys (dQ, dK, dV in one pass; T a power of two) instead of the
    # dK/dV + dQ pair; it steps over query rows by block_q_dkv with num_warps_fused / num_stages_bwd.
    fused_bwd: bool = False
    num_warps_fused: int = 8
    # Backward tiles key-major, (keys, queries) instead of (queries, keys), in the dK/dV and one-kernel backward: the
    # dK and dV products then have the key block, not the query block, as their rows (M of the matrix unit).
    key_major: bool = False
    # `flash_attention_qkv(bias=)`: add the Q/K/V bias inside the kernels (True) or by XLA before them (False). The
    # train step ran 2.3% faster folded with the one-kernel backward (S=128) and 1% slower with the pair (S=512;
    # kernels-h200.md, Attention), so the default follows `fused_bwd`.
    fold_bias: bool = False
    # The dK/dV + dQ pair only (ignored with `fused_bwd`): the dK/dV kernel runs first and also stores dS (in q's
    # dtype, as the dQ product reads it; (B, N, T, S) with key-major tiles, else (B, N, S, T)), and the dQ kernel
    # multiplies it by K instead of recomputing the scores, probabilities, dropout mask and dP (delta then comes
    # from an XLA pass before the pair). Trades the dQ kernel's recompute for one write and one read of dS.
    store_ds: bool = False


def default_blocks(s: int, h: int, t: int | None = None) -> Blocks:
    """Defaults for query length S, head width H and key length T (= S unless given).

    H <= 64 (BERT): 128x64 forward tiles with 4 warps, as Triton's fused-attention tutorial uses; the backward
    tiles are smaller because each step holds four fp32 (block_q, block_k) tiles (s/p, dp, ds, the hash) at once,
    key-major. T <= 128 (a power of two): the one-kernel backward (`fused_bwd`, 32 query rows per step, 8 warps),
    else the key-major dK/dV (64x64 tiles) + dQ pair storing dS for a dQ = dS K kernel with 128x64 tiles
    (`store_ds`; row-major tiles store it slower). Measured per kernel (kernels-h200.md, Attention): at B64 S128
    p=0.1 the one-kernel backward took 101.3 us against the pair's 110.5 (+15 us of XLA for delta); at B16 S512
    key-major tiles took the pair from 320.6 to 267.0 us, and storing dS saved 48.7 us more. Wider heads (not tuned):
    row-major pair, the key tile halved and the warps doubled to keep the fp32 accumulators in registers.
    """
    t = s if t is None else t
    wide = h > 64
    fused = t <= 128 and is_pow2(t) and not wide
    store_ds = not fused and not wide
    return Blocks(
        block_q=fit_pow2(128, s), block_k=fit_pow2(32 if wide else 64, t),
        block_q_dkv=fit_pow2(32 if fused or wide else 64, s), block_k_dkv=fit_pow2(64, t),
        block_q_dq=fit_pow2(128 if store_ds else 64, s), block_k_dq=fit_pow2(64 if store_ds else 32, t),
        num_warps=8 if wide else 4, num_warps_bwd=8 if wide else 4,
        fused_bwd=fused, key_major=not wide, fold_bias=fused, store_ds=store_ds,
    )


def candidate_blocks(around: Blocks, s: int, h: int, t: int | None = None, *, stage: str) -> list[Blocks]:
    """Blocks to try around `around` (for the autotuner and `benchmarks/kernels.py --tune`): stage "fwd" the forward
    tiles, "bwd" the backward's form (pair or one kernel, row- or key-major) and tiles. Every candidate fits S and T
    (`fit_pow2`)."""
    t = s if t is None else t
    if stage == "fwd":
        return [dataclasses.replace(around, block_q=fit_pow2(bq, s), block_k=fit_pow2(bk, t), num_warps=w, num_stages=st)
                for bq, bk, w, st in ((128, 64, 4, 3), (64, 64, 4, 3), (128, 32, 4, 3), (128, 64, 8, 3),
                                      (128, 64, 4, 2))]
    if stage != "bwd":
        raise ValueError(f"{stage=} must be 'fwd' or 'bwd'")
    # dS stored only with key-major tiles (row-major measured slower); one candidate toggles it.
    pairs = [dataclasses.replace(around, fused_bwd=False, key_major=km, block_q_dkv=fit_pow2(bq, s),
                                 block_k_dkv=fit_pow2(bk, t), num_warps_bwd=w, store_ds=km and around.store_ds)
             for km in (False, True) for bq, bk, w in ((32, 64, 4), (64, 64, 4), (32, 32, 4), (64, 128, 8))]
    pairs.append(dataclasses.replace(around, fused_bwd=False, store_ds=not around.store_ds))
    fused = [dataclasses.replace(around, fused_bwd=True, key_major=km, block_q_dkv=fit_pow2(bq, s),
                                 num_warps_fused=w)
             for km in (False, True) for bq, w in ((16, 4), (32, 8), (64, 8))] if t <= 128 and is_pow2(t) else []
    return pairs + fused


def is_pow2(x: int) -> bool:
    return x >= 1 and x & (x - 1) == 0


def check_inputs(q, k, v, mask, blocks: Blocks | None = None, segments: bool = False) -> None:
    """Raise ValueError, naming the value, for shapes the kernels cannot take, with `blocks` if given (before anything
    compiles). `segments`: the mask holds packed rows' integer segment ids, which needs self-attention (T = S)."""
    if q.ndim != 4 or k.ndim != 4:
        raise ValueError(f"q and k must be (B, S, N, H) and (B, T, N, H); got {q.shape=} {k.shape=}")
    b, s, n, h = q.shape
    t = k.shape[1]
    if k.shape != (b, t, n, h) or v.shape != k.shape:
        raise ValueError(f"k and v must be (B, T, N, H) matching {q.shape=}; got {k.shape=} {v.shape=}")
    if mask.shape != (b, t):
        raise ValueError(f"mask must be (B, T) = {(b, t)}; got {mask.shape=}")
    if segments and (t != s or not jnp.issubdtype(mask.dtype, jnp.integer)):
        raise ValueError(f"segments=True takes integer segment ids (B, S) for self-attention (T = S); got "
                         f"{mask.dtype=} with S={s}, T={t}")
    if not (q.dtype == k.dtype == v.dtype):
        raise ValueError(f"q, k, v must share a dtype; got {q.dtype=} {k.dtype=} {v.dtype=}")
    if not is_pow2(h) or h < 16:
        raise ValueError(f"head width {h=} must be a power of two >= 16 (Triton tiles)")
    if blocks is None:
        return
    for name, block in dataclasses.asdict(blocks).items():
        if name.startswith("block_") and (not is_pow2(block) or block < 16):
            raise ValueError(f"{name}={block} must be a power of two >= 16")
    if blocks.fused_bwd and not is_pow2(t):
        raise ValueError(f"fused_bwd holds all T={t} keys in one tile: T must be a power of two")
    for name, length in (("block_q", s), ("block_q_dkv", s), ("block_q_dq", s),
                         ("block_k", t), ("block_k_dkv", t), ("block_k_dq", t)):
        block = getattr(blocks, name)
        if length % block:
            dim = "S" if name.startswith("block_q") else "T"
            raise ValueError(f"{dim}={length} must be a multiple of {name}={block}")
