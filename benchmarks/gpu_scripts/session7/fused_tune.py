"""Session 7 (runs 1, 2): the one-kernel flash backward (`fused_bwd`) against the dK/dV + dQ pair, per kernel.

Each candidate: fwd+bwd compiled once, checked against the reference (relative L2 of output and gradients), then
`CALLS` profiled calls; prints the device time of the forward, the backward kernel(s) and the XLA rest (delta,
mask code). Inputs are not rotated (16 MB per tensor): rank candidates, then confirm with benchmarks/kernels.py.
Usage: python fused_tune.py [128] [512]
"""
import dataclasses
import os
import sys

os.environ["XLA_FLAGS"] = os.environ.get("XLA_FLAGS", "") + " --xla_gpu_enable_command_buffer="
import jax
import jax.numpy as jnp

from jaxformer.hlo_profile import profile_compiled
from pallas_kernels.attention import attention, default_block_sizes, flash_attention
from pallas_kernels.dropout import seed_from_key

CALLS = 5


def run(b, s, rate, candidates, best):
    key = jax.random.split(jax.random.key(0), 5)
    q, k, v, do = (jax.random.normal(key[i], (b, s, 16, 64), jnp.bfloat16) for i in range(4))
    mask = jnp.arange(s)[None, :] < jax.random.randint(key[4], (b, 1), s // 2, s + 1)
    seed = seed_from_key(jax.random.key(1))

    def fb(f):
        def g(q, k, v):
            o, vjp = jax.vjp(lambda q, k, v: f(q, k, v, mask, seed=seed, rate=rate), q, k, v)
            return (o,) + vjp(do)
        return jax.jit(g)
    ref = fb(attention)(q, k, v)
    print(f"\n## B{b} S{s} p={rate}", flush=True)
    for name, blk in candidates:
        try:
            f = fb(lambda *a, **kw: flash_attention(*a, **kw, block_sizes=blk))
            out = f(q, k, v)
            err = max(float(jnp.linalg.norm((a - r).astype(jnp.float32)) / jnp.linalg.norm(r.astype(jnp.float32)))
                      for a, r in zip(out, ref))
            if not err < 2e-2:
                raise AssertionError(f"relative error {err:.2e}")
            times = profile_compiled(f.lower(q, k, v).compile(), (q, k, v), CALLS, log=lambda m: None,
                                     by="kernel")
        except Exception as e:
            print(f"  {name}: skip {type(e).__name__}: {str(e)[:300]}", flush=True)
            continue
        per = {kk: vv / CALLS / 1e3 for kk, vv in times.items()}
        fwd = sum(vv for kk, vv in per.items() if "fwd" in kk)
        bwd = sum(vv for kk, vv in per.items() if "dkdv" in kk or "_dq" in kk or "bwd_fused" in kk)
        rest = sum(per.values()) - fwd - bwd
        total = sum(per.values())
        print(f"  {name:34s} fwd {fwd:7.1f}  bwd {bwd:7.1f}  other {rest:5.1f}  total {total:7.1f} us"
              f"  err {err:.1e}", flush=True)
        if best is not None and (s not in best or total < best[s][0]):
            best[s] = (total, name, blk)


def candidates(s):
    """Run 2: the pair (row-major, as session 6; key-major dK/dV tiles) and the one-kernel backward (S <= 128; the best
    row-major tiles of run 1, and key-major tiles)."""
    d = dataclasses.replace(default_block_sizes(s, 64), fused_bwd=False, key_major=False)
    out = [("pair row-major (session 6)", d)]
    for bq, bk, w in ((32, 64, 4), (64, 64, 4), (16, 64, 4), (32, 128, 8), (64, 128, 8), (64, 64, 8)):
        if bk <= s:
            out.append((f"pair key-major kv{bq}x{bk}w{w}",
                        dataclasses.replace(d, key_major=True, block_q_dkv=bq, block_k_dkv=bk, num_warps_bwd=w)))
    if s <= 128:
        out.append(("fused row-major q16 w4 s3", dataclasses.replace(d, fused_bwd=True, block_q_dkv=16,
                                                                       num_warps_fused=4, num_stages_bwd=3)))
        for bq in (16, 32, 64):
            for w in (4, 8):
                for st in (2, 3):
                    out.append((f"fused key-major q{bq} w{w} s{st}",
                                dataclasses.replace(d, fused_bwd=True, key_major=True, block_q_dkv=bq,
                                                    num_warps_fused=w, num_stages_bwd=st)))
    return out


if __name__ == "__main__":
    import json
    print(jax.devices()[0].device_kind, jax.__version__)
    best = {}
    for b, s in [(64, 128), (16, 512)]:
        if len(sys.argv) > 1 and str(s) not in sys.argv[1:]:
            continue
        run(b, s, 0.1, candidates(s), best)
    for s, (total, name, blk) in best.items():
        print(f"best at S{s}: {name} ({total:.1f} us)")
        run(64 if s == 128 else 16, s, 0.0, [("default", default_block_sizes(s, 64)), (name, blk)], None)
    if os.environ.get("OUT"):
        with open(os.path.join(os.environ["OUT"], "best_blocks.json"), "w") as f:
            json.dump({s: dataclasses.asdict(blk) for s, (_, _, blk) in best.items()}, f)
