"""A/B of how the kernels draw the (same) dropout mask: `tile` = `keep_mask_tile` (one hash per two neighbouring
elements, the halves interleaved; the shipped form) vs `per-element` = `keep_mask` on every element's index (one
hash per element, 16 of its bits used). Both draw the reference's mask; only the generation differs. Flash
attention fwd+bwd (B64 S128, B16 S512) and BDRLN fwd / fwd+bwd (8192x1024, 32768x1024), p=0.1, default blocks.
python ab_keep.py"""
import jax
import jax.numpy as jnp

from benchmarks import kernels as bench
from pallas_kernels import _pallas as pk
from pallas_kernels.attention import flash_attention, kernel
from pallas_kernels.bias_dropout_residual_layernorm import bias_dropout_residual_layernorm
from pallas_kernels.dropout import keep_mask

_tile_attn, _tile_pk = kernel._keep, pk.keep
u32 = jnp.uint32


def _attn_per_element(drop, q_start, k_start, block_q, block_k, *, t_len, rate, key_major=False):
    if drop is None:
        return None
    seed0, seed1, head_row = drop
    rows = head_row + (q_start + jnp.arange(block_q, dtype=jnp.int32)).astype(u32)
    cols = (k_start + jnp.arange(block_k, dtype=jnp.int32)).astype(u32)
    index = rows[None, :] * u32(t_len) + cols[:, None] if key_major else rows[:, None] * u32(t_len) + cols[None, :]
    return keep_mask((seed0, seed1), index, rate)


def _pk_per_element(seed_ref, rows, first_col, n_cols, width, rate):
    cols = (first_col + jnp.arange(n_cols, dtype=jnp.int32)).astype(u32)
    index = (rows.astype(u32) + seed_ref[2])[:, None] * u32(width) + cols[None, :]
    return keep_mask(seed_ref, index, rate)


def _time(f, args, n_in, fwd_too):
    out = []
    if fwd_too:
        out.append(1e6 * bench.per_iteration(lambda c: (f(*c),) + tuple(c[1:]), args, 5))
    out.append(1e6 * bench.per_iteration(bench._grads_as_carry(f, n_in), args, 5))
    return " | ".join(f"{t:.1f}" for t in out)


def main():
    key = jax.random.split(jax.random.key(0), 8)
    seed = jnp.array([1, 2], jnp.uint32)
    print("| op | shape | mask drawn | us (fwd+bwd; BDRLN: fwd, fwd+bwd) |")
    for b, s in [(64, 128), (16, 512)]:
        q, k, v = (jax.random.normal(key[i], (b, s, 16, 64), jnp.bfloat16) for i in range(3))
        mask = jnp.arange(s)[None, :] < jax.random.randint(key[3], (b,), s // 2, s + 1)[:, None]
        for name, fn in [("tile", _tile_attn), ("per-element", _attn_per_element), ("tile", _tile_attn)]:
            kernel._keep = fn
            f = lambda q, k, v: flash_attention(q, k, v, mask, seed=seed, rate=0.1)  # noqa: E731
            print(f"| attention | B{b} S{s} p=0.1 | {name} | {_time(f, (q, k, v), 3, False)} |", flush=True)
    kernel._keep = _tile_attn
    for rows, d in [(8192, 1024), (32768, 1024)]:
        x, r = (jax.random.normal(key[i], (rows, d), jnp.bfloat16) for i in (4, 5))
        bias, scale, shift = (jax.random.normal(key[6 + i % 2], (d,)) for i in range(3))
        for name, fn in [("tile", _tile_pk), ("per-element", _pk_per_element), ("tile", _tile_pk)]:
            pk.keep = fn
            f = lambda x, r, bias, scale, shift: bias_dropout_residual_layernorm(  # noqa: E731
                x, bias, r, scale, shift, seed=seed, rate=0.1, eps=1e-12)
            print(f"| bdrln | {rows}x{d} p=0.1 | {name} | {_time(f, (x, r, bias, scale, shift), 5, True)} |",
                  flush=True)
    pk.keep = _tile_pk


if __name__ == "__main__":
    main()
