"""Does XLA overlap a data-parallel gradient all-reduce with the backward layer loop when it is given something to
overlap with? Measured on a stack of BERT-large feed-forward blocks, outside the model.

The train step's layer-weight all-reduce sits at the end of each backward trip with nothing left in the trip to hide
it (benchmarks/results/distributed-2xh200.md, where the data-parallel gap is). Two gradient computations of the same
loss:

* `gspmd`: `jax.grad` through `lax.scan` on batch-sharded activations; GSPMD all-reduces each layer's weight
  gradient inside its trip (what the train step does).
* `deferred`: inside `shard_map` over `data`, a hand-written backward scan computes trip i's weight gradients as
  per-device partial sums and all-reduces them during trip i+1 (`psum` of the carried partials, independent of the
  trip's own work), the schedule XLA's collective pipeliner would produce.

    PYTHONPATH=. python benchmarks/dp_overlap.py                  # on 2+ GPUs: ms per gradient step, both ways
    PYTHONPATH=. python benchmarks/dp_overlap.py --opt-level O2   # at XLA's O2
    JAX_NUM_CPU_DEVICES=8 PYTHONPATH=. python benchmarks/dp_overlap.py --check   # CPU: same gradients, small shapes
"""

from __future__ import annotations

import argparse
import contextlib
import json
import statistics
import time

import jax
import jax.numpy as jnp
from jax.experimental.xla_metadata import set_xla_metadata
from jax.sharding import NamedSharding, PartitionSpec as P

from jaxformer.steps import _tracing  # the mesh and XLA's optimization level while the step compiles
from pallas_kernels.mesh import _shard_map


def layer(w, h):
    """One residual feed-forward block: h + gelu(h W1) W2, bf16 products, fp32 residual stream."""
    w1, w2 = w
    u = jax.nn.gelu(jnp.einsum("bsd,df->bsf", h.astype(w1.dtype), w1), approximate=False)
    return h + jnp.einsum("bsf,fd->bsd", u, w2).astype(h.dtype)


def loss_fn(ws, x):
    h, _ = jax.lax.scan(lambda h, w: (layer(w, h), None), x, ws)
    return jnp.mean(h.astype(jnp.float32) ** 2)


def gspmd_grads(ws, x):
    return jax.grad(loss_fn)(ws, x)


def deferred_grads(ws, x, mesh, group=False):
    """The same gradients, each layer's all-reduce issued one backward trip late (see the module docstring).
    `group`: tag the trip's all-reduce and its backward GEMMs with one XLA scheduling group
    (`_scheduling_group_id`), asking the latency-hiding scheduler to run them together."""
    def local(ws, x):  # per device: x is the local batch, ws the (replicated) weights
        def fwd(h, w):
            return layer(w, h), h  # keep each layer's input: the backward recomputes the layer from it

        h, inputs = jax.lax.scan(fwd, x, ws)
        n = jax.lax.psum(1, "data")
        # d mean(h^2) / dh over the global batch; the local share of the mean
        dh = (2.0 / (h.size * n)) * h.astype(jnp.float32)
        pending = jax.tree.map(jnp.zeros_like, jax.tree.map(lambda a: a[0], ws))

        def bwd(carry, xs):
            dh, pending = carry
            w, h_in = xs
            with set_xla_metadata(_scheduling_group_id="1") if group else contextlib.nullcontext():
                reduced = jax.lax.psum(pending, "data")  # the previous trip's partial sums: nothing waits on it
                _, vjp = jax.vjp(layer, w, h_in)
                dw, dh = vjp(dh.astype(h_in.dtype))
            return (dh, dw), reduced

        rev = lambda a: a[::-1]  # noqa: E731
        (dh, last), reduced = jax.lax.scan(bwd, (dh, pending), (jax.tree.map(rev, ws), rev(inputs)))
        last = jax.lax.psum(last, "data")
        # reduced[t] holds trip t-1's layer (layer L-t in forward order); reduced[0] is the zeros' sum.
        grads = jax.tree.map(lambda r, l_: jnp.concatenate([r[1:], l_[None]])[::-1], reduced, last)
        return grads

    spec_w = jax.tree.map(lambda _: P(), ws)
    return _shard_map(local, mesh, (spec_w, P("data")), spec_w)(ws, x)


def make_inputs(layers, batch, seq, dim, ff, mesh, dtype=jnp.bfloat16, seed=0):
    k = jax.random.split(jax.random.key(seed), 3)
    w1 = (jax.random.normal(k[0], (layers, dim, ff), jnp.float32) * dim ** -0.5).astype(dtype)
    w2 = (jax.random.normal(k[1], (layers, ff, dim), jnp.float32) * ff ** -0.5).astype(dtype)
    x = jax.random.normal(k[2], (batch, seq, dim), jnp.float32)
    rep = NamedSharding(mesh, P())
    return jax.device_put((w1, w2), rep), jax.device_put(x, NamedSharding(mesh, P("data")))


def compiled_step(kind, ws, x, mesh, level):
    """A jitted gradient step that feeds its gradients back as a tiny weight update, so iterations chain."""
    grads = gspmd_grads if kind == "gspmd" else (
        lambda ws, x: deferred_grads(ws, x, mesh, group=kind == "deferred-grouped"))

    def step(ws, x):
        g = grads(ws, x)
        return jax.tree.map(lambda w, d: (w - 1e-6 * d).astype(w.dtype), ws, g)

    rep = jax.tree.map(lambda _: NamedSharding(mesh, P()), ws)
    fn = jax.jit(step, in_shardings=(rep, NamedSharding(mesh, P("data"))), out_shardings=rep, donate_argnums=0)
    with _tracing(mesh, level=level):
        return fn.lower(ws, x).compile()


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--layers", type=int, default=24)
    ap.add_argument("--batch", type=int, default=128, help="global batch (split over all devices)")
    ap.add_argument("--seq", type=int, default=128)
    ap.add_argument("--dim", type=int, default=1024)
    ap.add_argument("--ff", type=int, default=4096)
    ap.add_argument("--opt-level", default=None, choices=("O0", "O1", "O2", "O3"))
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--dump-hlo", default=None, metavar="PREFIX",
                    help="write each compiled step's HLO text to PREFIX-<kind>.txt")
    ap.add_argument("--kinds", default="gspmd,deferred,deferred-grouped")
    ap.add_argument("--check", action="store_true", help="small fp32 shapes: compare the two gradients and stop")
    a = ap.parse_args()
    mesh = jax.make_mesh((jax.device_count(),), ("data",), axis_types=(jax.sharding.AxisType.Auto,))
    if a.check:
        ws, x = make_inputs(4, 2 * jax.device_count(), 8, 32, 64, mesh, dtype=jnp.float32)
        with jax.set_mesh(mesh):
            want = jax.jit(gspmd_grads)(ws, x)
            got = [jax.jit(lambda ws, x, g=g: deferred_grads(ws, x, mesh, group=g))(ws, x) for g in (False, True)]
        err = max(float(jnp.max(jnp.abs(g - w)) / jnp.max(jnp.abs(w))) for gs in got for g, w in zip(gs, want))
        print(json.dumps(dict(check="deferred vs gspmd gradients", max_rel_err=err)))
        return
    ws, x = make_inputs(a.layers, a.batch, a.seq, a.dim, a.ff, mesh)
    result = dict(device=jax.devices()[0].device_kind, devices=jax.device_count(), jax=jax.__version__,
                  opt_level=a.opt_level or "default", shapes=dict(layers=a.layers, batch=a.batch, seq=a.seq,
                                                                   dim=a.dim, ff=a.ff))
    for kind in a.kinds.split(","):
        step = compiled_step(kind, ws, x, mesh, a.opt_level)
        text = step.as_text()
        if a.dump_hlo:
            with open(f"{a.dump_hlo}-{kind}.txt", "w") as f:
                f.write(text)
        ws = step(ws, x)  # warm-up
        jax.block_until_ready(ws)
        times = []
        for _ in range(a.repeats):
            t = time.perf_counter()
            for _ in range(a.steps):
                ws = step(ws, x)
            jax.block_until_ready(ws)
            times.append((time.perf_counter() - t) / a.steps * 1e3)
        result[kind] = dict(ms=round(statistics.median(times), 3), spread_ms=[round(t, 3) for t in times],
                            all_reduce_starts=text.count("all-reduce-start"), all_reduces=text.count("all-reduce("))
    print(json.dumps(result))


if __name__ == "__main__":
    main()
