"""The deferred all-reduce of benchmarks/dp_overlap.py computes the same gradients as jax.grad under GSPMD,
and its compiled step has the all-reduce inside the backward loop (issued one trip late), on 8 CPU devices."""

import jax
import jax.numpy as jnp
import pytest

from benchmarks.dp_overlap import deferred_grads, gspmd_grads, make_inputs
from jaxformer.hlo_analysis import analyze


@pytest.mark.parametrize("group", [False, True])
def test_deferred_reduction_matches_gspmd_gradients(group):
    """`group`: the variant whose trip's all-reduce and GEMMs carry one XLA scheduling group id."""
    mesh = jax.make_mesh((8,), ("data",), axis_types=(jax.sharding.AxisType.Auto,))
    ws, x = make_inputs(4, 16, 8, 32, 64, mesh, dtype=jnp.float32, seed=3)
    with jax.set_mesh(mesh):
        want = jax.jit(gspmd_grads)(ws, x)
        step = jax.jit(lambda ws, x: deferred_grads(ws, x, mesh, group=group)).lower(ws, x).compile()
        got = step(ws, x)
    for g, w in zip(got, want):
        assert g.shape == w.shape and float(jnp.max(jnp.abs(w))) > 0
        assert float(jnp.max(jnp.abs(g - w)) / jnp.max(jnp.abs(w))) < 1e-5
    looped = [op for op in analyze(step.as_text()).ops if op.kind == "all-reduce" and op.trips > 1]
    assert looped, "the per-layer all-reduce should run inside the backward loop"
    assert ("_scheduling_group_id" in step.as_text()) == group
