"""`benchmarks/kernels.py`'s device-time step: what it compiles is the operator's work, without copies into outputs
of arrays the step passes through or returns twice (which a compiled function must copy, and no model makes)."""
import jax
import jax.numpy as jnp
import pytest

from benchmarks.kernels import _new_outputs
from pallas_kernels.timing import grads_as_carry
import pallas_kernels.bias_dropout_residual_layernorm as bdrln
from pallas_kernels.dropout import seed_from_key


def _copies(fn, args) -> int:
    return sum(" copy(" in line for line in jax.jit(fn).lower(args).compile().as_text().splitlines())


@pytest.mark.parametrize("rate", [0.0, 0.1])
def test_device_time_step_compiles_no_output_copies(rate):
    k = jax.random.split(jax.random.key(0), 6)
    x, res = (jax.random.normal(k[i], (64, 256), jnp.float32) for i in (0, 1))
    b, s, t = (jax.random.normal(k[i], (256,)) for i in (2, 3, 4))
    seed = seed_from_key(k[5])
    args = (x, b, res, s, t)
    fn = lambda *a: bdrln.reference.bias_dropout_residual_layernorm(*a, seed=seed, rate=rate, eps=1e-12)  # noqa: E731
    fwd_bwd, fwd = grads_as_carry(fn, 5), (lambda c: (fn(*c),) + tuple(c[1:]))
    # as steps: the forward passes four arguments through, and without dropout d_residual is dx
    assert _copies(fwd, args) == 4
    assert _copies(fwd_bwd, args) == (1 if rate == 0.0 else 0)
    for step, n_new in ((fwd, 1), (fwd_bwd, 4 if rate == 0.0 else 5)):
        assert _copies(_new_outputs(step), args) == 0
        assert len(jax.eval_shape(_new_outputs(step), args)) == n_new  # every computed output kept once
