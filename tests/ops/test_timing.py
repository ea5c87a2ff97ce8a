"""The clock shared by the autotuner, benchmarks/kernels.py and the layout search (pallas_kernels/timing.py), and the
benchmark's device-time step: what it compiles is the operator's work, without copies into outputs of arrays the step
passes through or returns twice (which a compiled function must copy, and no model makes)."""

import itertools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import pallas_kernels.bias_dropout_residual_layernorm as bdrln
from benchmarks.kernels import _new_outputs
from pallas_kernels import timing
from pallas_kernels.dropout import seed_from_key
from pallas_kernels.timing import grads_as_carry


def test_time_step_measures_a_chained_step():
    x = jnp.ones((384, 384))
    traced = []
    step = lambda a: (traced.append(1), (a[0] @ a[0] / 384.0,))[1]  # noqa: E731
    one = timing.step_clock(step, (x,), lengths=(1, 5), rotate_bytes=0)  # one copy
    assert len(traced) == 1 + 5  # chains of 1 and 5 steps, each traced (and compiled) once
    four = timing.step_clock(step, (x,), lengths=(1, 5), rotate_bytes=4 * x.nbytes)  # 4 copies in turn
    assert len(traced) == 6 + 4 * (1 + 5)  # n rounds of the 4 copies: 4n steps per chain
    # Real clocks: positive and plausible (the other xdist worker shares the 2 CPU cores, so no ratio of two real
    # timings is asserted here: one CI run measured t4/t1 = 0.32, another 5.5; the per-step division is checked
    # without noise below).
    for clock in (one, four):
        assert 0 < min(clock(repeats=3) for _ in range(3)) < 1.0


def test_time_step_reports_seconds_per_step_not_per_round(monkeypatch):
    """The clock divides the two chains' time difference by the steps between them, (n2 - n1) x K with K copies:
    checked on a fake median time of launch overhead + (steps run) x c, which must come back as c for any K (per
    step; per round of K copies it would be K c)."""
    c, overhead = 1e-4, 5e-3
    for k in (1, 4):
        x = jnp.ones((8, 8))
        clock = timing.step_clock(lambda a: (a[0] * 1.0,), (x,), lengths=(2, 10), rotate_bytes=k * x.nbytes)
        times = itertools.cycle([2 * k * c + overhead, 10 * k * c + overhead])  # the clock times (short, long)
        monkeypatch.setattr(timing, "_median_seconds", lambda f, args, repeats: next(times))
        assert clock(repeats=3) == pytest.approx(c, rel=1e-9)


def test_time_step_measures_again_when_the_longer_chain_is_not_slower(monkeypatch, capsys):
    """A failed measurement (the longer chain no slower than the shorter) is retried, then reported as NaN, which is
    never the fastest (it was a "0.0 us" row in kernels.py and could have won a tuning)."""
    timings = iter([2.0, 1.0, 1.0, 3.0])  # (short, long) twice: the first pair failed, the second is 2 s apart
    monkeypatch.setattr(timing, "_median_seconds", lambda f, args, repeats: next(timings))
    x = (jnp.ones((4,)),)
    assert timing.time_step(lambda a: a, x, lengths=(1, 3), rotate_bytes=0) == pytest.approx(1.0)
    monkeypatch.setattr(timing, "_median_seconds", lambda f, args, repeats: 1.0)
    assert np.isnan(timing.time_step(lambda a: a, x, lengths=(1, 3), rotate_bytes=0))
    assert "no time measured" in capsys.readouterr().err
    # kernels.py's clock (and the layout search's) keeps the last difference, as it always did.
    assert timing.time_step(lambda a: a, x, lengths=(1, 3), rotate_bytes=0, nan_on_failure=False) == 0.0


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
