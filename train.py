"""Command-line trainer (thin: parse flags, hand over to jaxformer).

Until the training issue lands this runs a short forward/backward smoke on the `tiny` preset with random tokens,
and says so.
"""

import argparse
import sys
import time


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--config", default="tiny", help="preset name: tiny, mini, base, large (default tiny)")
    parser.add_argument("--steps", type=int, default=3, help="forward/backward passes to run (default 3)")
    args = parser.parse_args(argv)

    import jax
    import jax.numpy as jnp
    from flax import nnx

    from jaxformer import BertConfig, BertForPreTraining

    print("train.py: pre-training is not implemented yet; running a forward/backward smoke test "
          f"of the {args.config!r} preset on random tokens ({jax.devices()[0].platform}).")
    try:
        cfg = BertConfig.preset(args.config)
    except ValueError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    model = BertForPreTraining(cfg, rngs=nnx.Rngs(0))
    ids = jax.random.randint(jax.random.key(1), (8, 64), 0, cfg.vocab_size)

    @nnx.jit
    def step(m, ids):
        def loss_fn(m):
            logits = m(ids, deterministic=False).mlm_logits
            return -jnp.mean(jnp.take_along_axis(jax.nn.log_softmax(logits), ids[..., None], -1))
        return nnx.value_and_grad(loss_fn)(m)

    for i in range(args.steps):
        t = time.perf_counter()
        loss, grads = step(model, ids)
        gnorm = jnp.sqrt(sum(jnp.sum(g ** 2) for g in jax.tree.leaves(grads)))
        print(f"pass {i}: mlm loss {float(loss):.4f}  grad norm {float(gnorm):.4f}  "
              f"({time.perf_counter() - t:.2f}s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
