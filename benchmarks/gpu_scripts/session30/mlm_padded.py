"""Session 30: the MLM loss at the model's padded vocabulary (V = 30528 rows of the table, vocab_size = 30522), where
`benchmarks/kernels.py` times V = 30522. At 30522 columns a bf16 (N, V) d_logits has rows of 61044 bytes, not
16-byte aligned, and run 6's profile shows XLA padding it and running the fused loss's gradient GEMMs as its own
Triton GEMMs (1261 us for one at 5120 rows). fwd+bwd device time per call on rotated inputs, us, and each
implementation's kernels.

    PYTHONPATH=. python benchmarks/gpu_scripts/session30/mlm_padded.py [--rows 1280,5120] [--calls 20] [--vocab 30528]
"""
import argparse
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "session22"))  # its common.py
sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "session28"))  # floors.py's helpers
from common import cold_profile  # noqa: E402
from floors import fwd_bwd, kernels_cell  # noqa: E402

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402

from pallas_kernels import mlm_loss  # noqa: E402


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--rows", default="1280,5120")
    ap.add_argument("--calls", type=int, default=20)
    ap.add_argument("--vocab", type=int, default=30528, help="table rows (the model's: 30592, 30522 rounded to 128)")
    a = ap.parse_args()
    v, valid, d = a.vocab, 30522, 1024
    key = jax.random.split(jax.random.key(1), 4)
    print(f"# {jax.__version__} {jax.devices()[0].device_kind}; MLM loss fwd+bwd, V = {v} (vocab_size {valid}), "
          f"device time per call on rotated inputs, {a.calls} calls\n| rows | impl | us | XLA / impl | kernels (us) |\n"
          "|---|---|---|---|---|", flush=True)
    impls = {"xla": mlm_loss.mlm_cross_entropy, "chunked-16384": mlm_loss.mlm_cross_entropy_chunked,
             "fused": mlm_loss.mlm_cross_entropy_fused}
    for n in (int(r) for r in a.rows.split(",")):
        h = jax.random.normal(key[0], (n, d), jnp.bfloat16)
        emb = 0.02 * jax.random.normal(key[1], (v, d))
        bias = 0.02 * jax.random.normal(key[2], (v,))
        labels = jax.random.randint(key[3], (n,), 0, valid)
        args = (h, emb, bias)
        times = {}
        for name, fn in impls.items():
            step = fwd_bwd(lambda h, e, b, fn=fn: h + 0 * fn(h, e, b, labels, vocab_size=valid)[0][:, None].astype(
                h.dtype), args)
            us = {k: t / a.calls / 1e3 for k, t in cold_profile(step, args, a.calls).items()}
            times[name] = sum(us.values())
            print(f"| {n} | {name} | {times[name]:.1f} | {times['xla'] / times[name]:.2f}x | {kernels_cell(us)} |",
                  flush=True)


if __name__ == "__main__":
    main()
