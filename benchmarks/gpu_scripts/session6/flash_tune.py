"""Session 6: flash attention block sizes, per kernel (fwd, dK/dV, dQ) from the profiler's device times.

Each candidate: fwd+bwd compiled once, checked against the reference (relative L2 of output and gradients), then
`CALLS` profiled calls; prints the device time of each of the three kernels. Inputs are not rotated (16 MB per
tensor at S=512 vs a 60 MB L2): rank candidates, then confirm the chosen ones with benchmarks/kernels.py.
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


def run(b, s, rate, candidates):
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
    print(f"\n## B{b} S{s} p={rate}: default {default_block_sizes(s, 64)}", flush=True)
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
            print(f"  {name}: skip {type(e).__name__}: {str(e)[:200]}", flush=True)
            continue
        per = {kk: vv / CALLS / 1e3 for kk, vv in times.items()}
        fwd = sum(vv for kk, vv in per.items() if "fwd" in kk)
        dkdv = sum(vv for kk, vv in per.items() if "dkdv" in kk)
        dq = sum(vv for kk, vv in per.items() if "_dq" in kk)
        rest = sum(per.values()) - fwd - dkdv - dq
        print(f"  {name:38s} fwd {fwd:7.1f}  dkdv {dkdv:7.1f}  dq {dq:7.1f}  other {rest:5.1f}  "
              f"total {sum(per.values()):7.1f} us  err {err:.1e}", flush=True)


def candidates(s):
    """Round 2 (after round 1 found num_stages 3 better than 2 everywhere): around the 3-stage defaults."""
    d = default_block_sizes(s, 64)
    out = [("default", d)]
    fwd = [(128, 64, 4, 4), (64, 64, 4, 3), (64, 64, 4, 4), (128, 32, 4, 3), (64, 32, 4, 3), (128, 64, 8, 3),
           (64, 128, 4, 3), (32, 64, 4, 3)]
    dkdv = [(32, 64, 4, 4), (16, 64, 4, 3), (32, 32, 4, 3), (64, 64, 4, 3), (32, 64, 8, 3), (16, 32, 4, 3),
            (16, 64, 4, 4), (64, 32, 4, 3)]
    dq = [(64, 32, 4, 4), (32, 32, 4, 3), (32, 64, 4, 3), (64, 64, 4, 3), (64, 16, 4, 3), (128, 32, 8, 3),
          (32, 16, 4, 3), (16, 32, 4, 3)]
    for i in range(max(len(fwd), len(dkdv), len(dq))):  # fwd, dkdv and dq vary together: each is read separately
        kw = {}
        if i < len(fwd):
            kw.update(block_q=fwd[i][0], block_k=fwd[i][1], num_warps=fwd[i][2], num_stages=fwd[i][3])
        if i < len(dkdv):
            kw.update(block_q_dkv=dkdv[i][0], block_k_dkv=dkdv[i][1], num_warps_bwd=dkdv[i][2],
                      num_stages_bwd=dkdv[i][3])
        if i < len(dq):
            kw.update(block_q_dq=dq[i][0], block_k_dq=dq[i][1], num_warps_dq=dq[i][2], num_stages_dq=dq[i][3])
        kw = {kk: (min(vv, s) if kk.startswith("block") else vv) for kk, vv in kw.items()}
        name = "f{}x{}w{}s{} kv{}x{}w{}s{} q{}x{}w{}s{}".format(*(
            kw.get("block_q"), kw.get("block_k"), kw.get("num_warps"), kw.get("num_stages"),
            kw.get("block_q_dkv"), kw.get("block_k_dkv"), kw.get("num_warps_bwd"), kw.get("num_stages_bwd"),
            kw.get("block_q_dq"), kw.get("block_k_dq"), kw.get("num_warps_dq"), kw.get("num_stages_dq")))
        out.append((name, dataclasses.replace(d, **kw)))
    return out


if __name__ == "__main__":
    print(jax.devices()[0].device_kind, jax.__version__)
    for b, s in [(16, 512), (64, 128)]:
        if len(sys.argv) > 1 and str(s) not in sys.argv[1:]:
            continue
        run(b, s, 0.1, candidates(s))
