"""Session 30: how fast does a Pallas (Triton-lowered) GEMM run on this GPU, at the MLM decoder's shape?

The MLM loss misses 2x over XLA at BERT-large's 1280 masked rows (kernels-h200.md, "Session 30", 3): a fused decoder +
cross-entropy would need its vocabulary GEMMs (logits = h E^T + b, N x D x V) inside Pallas kernels, so the question
before writing one is the GEMM rate Pallas reaches there against cuBLAS (XLA's GEMM on one GPU). Device time on
rotated inputs (session 21's method) of, at N rows x D = 1024 x V = 30720 (30522 rounded to 256):

- `xla-bf16` / `xla-f32`: XLA's `einsum` + bias (cuBLAS), logits out in bf16 / float32;
- `pallas MxVxK wW sS`: a Pallas tile GEMM (BM x BV tiles, a K loop of BK, W warps, S pipeline stages) + bias,
  bf16 logits out;
- `fused ...`: the same tiles reduced in registers to the cross-entropy's per-tile partials (row max, sum of exp,
  the label's logit): the forward of a fused loss, writing (V / BV, N) floats instead of logits.

    PYTHONPATH=. python benchmarks/gpu_scripts/session30/gemm_probe.py [--rows 1280,5120] [--calls 20]
"""
import argparse
import functools
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "session22"))  # its common.py
from common import cold_profile  # noqa: E402

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
from jax import lax  # noqa: E402
from jax.experimental import pallas as pl  # noqa: E402
from jax.experimental.pallas import triton as pltriton  # noqa: E402

from pallas_kernels._pallas import compiler_params, resolve_interpret  # noqa: E402


def _logits_tile(h_ref, e_ref, b_ref, *, bk: int):
    """float32 (BM, BV) tile of h E^T + b: a K loop of BK-wide slices of the (BM, D) and (BV, D) blocks."""
    bm, d = h_ref.shape
    bv = e_ref.shape[0]

    def body(k, acc):
        s = pl.ds(pl.multiple_of(k * bk, bk), bk)
        return acc + pltriton.dot(h_ref[:, s], e_ref[:, s], trans_b=True)
    acc = lax.fori_loop(0, d // bk, body, jnp.zeros((bm, bv), jnp.float32))
    return acc + b_ref[...][None, :]


def _mm_kernel(h_ref, e_ref, b_ref, o_ref, *, bk):
    o_ref[...] = _logits_tile(h_ref, e_ref, b_ref, bk=bk).astype(o_ref.dtype)


def _fused_kernel(h_ref, e_ref, b_ref, lab_ref, m_ref, s_ref, ll_ref, *, bk, bv):
    logits = _logits_tile(h_ref, e_ref, b_ref, bk=bk)
    cols = pl.program_id(1) * bv + jnp.arange(bv, dtype=jnp.int32)
    m = jnp.max(logits, axis=1)
    m_ref[...] = m
    s_ref[...] = jnp.sum(jnp.exp(logits - m[:, None]), axis=1)
    ll_ref[...] = jnp.sum(jnp.where(cols[None, :] == lab_ref[...][:, None], logits, 0.0), axis=1)


def _specs(bm, bv, d):
    # grid (N / BM, V / BV), row blocks first: consecutive programs share one E tile (E is ~L2-sized, h is small)
    return [pl.BlockSpec((bm, d), lambda i, j: (i, 0)), pl.BlockSpec((bv, d), lambda i, j: (j, 0)),
            pl.BlockSpec((bv,), lambda i, j: (j,))]


def pallas_logits(h, e, b, *, bm, bv, bk, warps, stages, interpret=None):
    n, d = h.shape
    v = e.shape[0]
    return pl.pallas_call(
        functools.partial(_mm_kernel, bk=bk), grid=(n // bm, v // bv), in_specs=_specs(bm, bv, d),
        out_specs=pl.BlockSpec((bm, bv), lambda i, j: (i, j)), out_shape=jax.ShapeDtypeStruct((n, v), h.dtype),
        compiler_params=compiler_params(warps, stages), interpret=resolve_interpret(interpret), name="probe_gemm",
    )(h, e, b)


def pallas_fused(h, e, b, labels, *, bm, bv, bk, warps, stages, interpret=None):
    n, d = h.shape
    v = e.shape[0]
    part = pl.BlockSpec((None, bm), lambda i, j: (j, i))
    return pl.pallas_call(
        functools.partial(_fused_kernel, bk=bk, bv=bv), grid=(n // bm, v // bv),
        in_specs=_specs(bm, bv, d) + [pl.BlockSpec((bm,), lambda i, j: (i,))],
        out_specs=[part, part, part], out_shape=[jax.ShapeDtypeStruct((v // bv, n), jnp.float32)] * 3,
        compiler_params=compiler_params(warps, stages), interpret=resolve_interpret(interpret), name="probe_fused",
    )(h, e, b, labels)


def nll_from_partials(m, s, ll):
    """Per-row nll from the (V / BV, N) partials: logsumexp over tiles minus the label's logit."""
    mx = jnp.max(m, axis=0)
    return mx + jnp.log(jnp.sum(s * jnp.exp(m - mx), axis=0)) - jnp.sum(ll, axis=0)


CONFIGS = [(128, 128, 64, 4, 3), (128, 128, 64, 8, 3), (128, 256, 64, 8, 3), (256, 128, 64, 8, 3),
           (64, 256, 64, 4, 4), (128, 128, 32, 4, 4), (128, 256, 32, 8, 4)]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--rows", default="1280,5120")
    ap.add_argument("--calls", type=int, default=20)
    ap.add_argument("--vocab", type=int, default=30720)
    ap.add_argument("--width", type=int, default=1024)
    a = ap.parse_args()
    v, d = a.vocab, a.width
    key = jax.random.split(jax.random.key(1), 4)
    print(f"# {jax.__version__} {jax.devices()[0].device_kind}; N x {d} x {v} GEMMs, device time per call on rotated "
          f"inputs, {a.calls} calls", flush=True)
    print("| rows | impl | us | TFLOP/s | max abs err vs xla-f32 |\n|---|---|---|---|---|", flush=True)
    for n in (int(r) for r in a.rows.split(",")):
        h = jax.random.normal(key[0], (n, d), jnp.bfloat16)
        e = (0.02 * jax.random.normal(key[1], (v, d))).astype(jnp.bfloat16)
        b = 0.02 * jax.random.normal(key[2], (v,))
        labels = jax.random.randint(key[3], (n,), 0, v)
        args = (h, e, b, labels)
        ref = jnp.einsum("ND,VD->NV", h, e, preferred_element_type=jnp.float32) + b
        ref_nll = jax.nn.logsumexp(ref, axis=1) - jnp.take_along_axis(ref, labels[:, None], 1)[:, 0]
        steps = {
            "xla-bf16": (lambda t: (jnp.einsum("ND,VD->NV", t[0], t[1], preferred_element_type=jnp.float32)
                                    + t[2]).astype(jnp.bfloat16), ref),
            "xla-f32": (lambda t: jnp.einsum("ND,VD->NV", t[0], t[1], preferred_element_type=jnp.float32) + t[2],
                        ref)}
        for bm, bv, bk, w, st in CONFIGS:
            kw = dict(bm=bm, bv=bv, bk=bk, warps=w, stages=st)
            steps[f"pallas {bm}x{bv}x{bk} w{w} s{st}"] = (lambda t, kw=kw: pallas_logits(*t[:3], **kw), ref)
            steps[f"fused {bm}x{bv}x{bk} w{w} s{st}"] = (
                lambda t, kw=kw: nll_from_partials(*pallas_fused(*t, **kw)), ref_nll)
        flop = 2 * n * d * v
        for name, (fn, want) in steps.items():
            try:
                err = float(jnp.max(jnp.abs(jax.jit(fn)(args).astype(jnp.float32) - want)))
                us = sum(cold_profile(fn, args, a.calls).values()) / a.calls / 1e3
                print(f"| {n} | {name} | {us:.1f} | {flop / us / 1e6:.0f} | {err:.2e} |", flush=True)
            except Exception as ex:  # a config that does not compile is a row, not the end of the run
                print(f"| {n} | {name} | failed: {type(ex).__name__}: {str(ex)[:150]} | | |", flush=True)


if __name__ == "__main__":
    main()
