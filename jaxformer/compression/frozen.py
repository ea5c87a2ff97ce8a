"""`scale_by_adam_frozen_variance`: Adam's scaling whose second moment stops updating after a number of steps.

1-bit Adam (Tang et al. 2021): Adam's update m / sqrt(v) is not linear in the gradient, so error feedback, which
conserves the gradient but delivers a coordinate's share in bursts (its residual once every ~1/density steps), does
not conserve Adam's movement: the second moment tracks the bursts and divides them down. Estimated over dense
steps and then frozen, v is a fixed per-coordinate scale, the update is linear in the exchanged gradient (momentum
SGD with a diagonal preconditioner) and a delayed gradient moves the parameters as far as a dense one.

The state is `optax.ScaleByAdamState`, so `make_optimizer`'s chain keeps the layout of `optax.adamw` / `optax.lamb`.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import optax


def scale_by_adam_frozen_variance(b1: float, b2: float, eps: float, freeze_after: int
                                  ) -> optax.GradientTransformation:
    """`optax.scale_by_adam(b1, b2, eps)` for the first `freeze_after` updates (the same numbers); from update
    `freeze_after + 1` on, `nu` and its bias correction stay as they were after update `freeze_after`."""
    if isinstance(freeze_after, bool) or not isinstance(freeze_after, int) or freeze_after < 1:
        raise ValueError(f"freeze_after={freeze_after!r} must be an integer >= 1")

    def init(params):
        return optax.ScaleByAdamState(count=jnp.zeros([], jnp.int32), mu=optax.tree.zeros_like(params),
                                      nu=optax.tree.zeros_like(params))

    def update(updates, state, params=None):
        del params
        count = optax.safe_increment(state.count)
        mu = optax.tree.update_moment(updates, state.mu, b1, 1)
        live = optax.tree.update_moment_per_elem_norm(updates, state.nu, b2, 2)
        nu = jax.tree.map(lambda new, old: jnp.where(count <= freeze_after, new, old), live, state.nu)
        # optax's own moment and bias-correction arithmetic, so the first `freeze_after` updates are scale_by_adam's
        mu_hat = optax.tree.bias_correction(mu, b1, count)
        nu_hat = optax.tree.bias_correction(nu, b2, jnp.minimum(count, freeze_after))
        out = jax.tree.map(lambda m, v: m / (jnp.sqrt(v) + eps), mu_hat, nu_hat)
        return out, optax.ScaleByAdamState(count=count, mu=mu, nu=nu)

    return optax.GradientTransformation(init, update)
