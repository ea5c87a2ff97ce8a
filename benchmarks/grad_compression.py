"""Compressed gradient exchange (jaxformer/compression): bytes per step, selection speed and quality, step time.

    python -m benchmarks.grad_compression --bytes              # any machine: compiles only (8 virtual CPU devices)
    python -m benchmarks.grad_compression --selection          # GPU: the three selections on BERT-large gradients
    python -m benchmarks.grad_compression --step --mesh data=2 # 2+ GPUs: dense vs compressed step time
    python -m benchmarks.grad_compression --convergence RUN ... --plot loss.png   # train.py runs, the first one dense

`--bytes` compiles the dense and the compressed train steps of each `--configs` model on `--mesh` (default data=8)
from abstract inputs (nothing is allocated) and counts the bytes of every collective in the optimized HLO: payload
(what a device puts into the collectives) and wire (what a device sends with ring algorithms: all-reduce
2(g-1)/g of its operand, all-gather (g-1)/g of its result, all-to-all and reduce-scatter (g-1)/g of their operand;
g the group size). It prints one JSON line per step and a markdown table (results/compression.md).

`--selection` computes two gradients of BERT-large (`--config`) on two synthetic batches and times each selection
method (`--methods`; jitted, median of `--repeats` calls after a warm-up) over the sparse tensors at each
`--densities`, twice: `select_reference` (impl "reference": running counts over every entry, a sort of the
candidates) and `select` (impl "bitmap": the admission bitmap and radix selection, selection.py), in one process;
the bitmap rows say whether they chose exactly the reference's entries and how much faster they ran. "reused"
starts from the thresholds of the first gradient and is timed on the second (a step that does not refresh them).
Quality: the fraction of each row's true top-k that the method chose (recall) and entries chosen per k. `--parts`
adds the sampled selection's pieces: its thresholds (reference: `lax.top_k` per tensor; bitmap: one radix
selection) and the admission bitmap's pass (the rest of `select` is compaction and refine). On a CPU,
`--config tiny` checks the script in a minute or two.

`--step` times the dense and the compressed train steps (ms/step, median of `--repeats` runs of `--steps`) and, on
the compressed step's gradient shapes, the selection alone (and `select_reference` beside it), the whole transform
(selection, packing, exchange, residual) and a dense all-reduce of the same gradients: the cost of compression
itself.

`--convergence` reads train.py output directories (run.json, metrics.jsonl) and prints, per run, the final train
loss (the mean of the last `--last` logged steps: one batch's loss is noisy), the final eval MLM loss and accuracy
and their differences from the first run's; `--plot` draws their train and eval MLM losses in one PNG.
"""

from __future__ import annotations

import argparse
import dataclasses
import functools
import json
import os
import re
import statistics
import sys
import time
from pathlib import Path

import jax

from jaxformer.compression import CompressedSteps, CompressionConfig, EXCHANGES, SELECTIONS
from jaxformer.config import TrainConfig
from jaxformer.hlo_analysis import analyze, nbytes, parse_module
from jaxformer.outputs import read_metrics
from pallas_kernels.timing import time_steps


# ----------------------------------------------------------------------------------------------- bytes
def _group_size(attrs: str, devices: int) -> int:
    m = re.search(r"replica_groups=\[(\d+),(\d+)\]<=", attrs)  # iota form: [groups, size]<=[...]
    if m:
        return int(m.group(2))
    m = re.search(r"replica_groups=\{\{([\d,]*)\}", attrs)
    return len(m.group(1).split(",")) if m and m.group(1) else devices


def collective_bytes(hlo: str, devices: int) -> list[dict]:
    """Every collective of a compiled step: kind, group size, payload and wire bytes per device per step."""
    comps, _ = parse_module(hlo)
    instrs = {i.name: (i, comp) for comp, body in comps.items() for i in body}
    out = []
    for op in analyze(hlo).ops:
        if op.cls != "collective":
            continue
        ins, comp = instrs[op.name]
        types = {i.name: i.type for i in comps[comp]}
        g = _group_size(ins.attrs, devices)
        payload = sum(nbytes(types.get(o, "")) for o in ins.operands)
        factor = {"all-reduce": 2 * (g - 1) / g, "all-gather": (g - 1), "collective-permute": 1.0}.get(
            op.kind, (g - 1) / g)  # all-gather: (g-1)/g of a result g times the operand
        out.append(dict(kind=op.kind, group=g, trips=op.trips, payload=payload * op.trips,
                        wire=factor * payload * op.trips))
    return out


def _batch(steps, tc, cfg):
    from jaxformer.data import synthetic_batch
    b = synthetic_batch(cfg.vocab_size, tc.batch_size, tc.seq_len, max(1, round(0.15 * tc.seq_len)))
    return jax.tree.map(lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=steps.batch_sharding), b)


def bytes_table(a) -> None:
    from flax import nnx
    from jaxformer import sharding
    from jaxformer.steps import Steps, build_model, make_optimizer
    rows = []
    for config in a.configs:
        tc = TrainConfig(config=config, batch_size=a.batch_size, seq_len=a.seq_len, kernels="xla", mesh=a.mesh,
                         steps=1000, warmup_steps=10)
        cfg = tc.model_config(30522)
        mesh = sharding.make_mesh(sharding.validate(tc.mesh, cfg, tc))
        model = build_model(cfg, 0)
        n_params = sum(x.size for x in jax.tree.leaves(nnx.state(model, nnx.Param)))
        variants = [("dense", None, None)] + [(e, d, CompressionConfig(density=d, exchange=e, selection=a.method,
                                                                         min_size=a.min_size))
                                             for e in EXCHANGES for d in a.densities]
        for name, density, comp in variants:
            t = time.perf_counter()
            if comp is None:
                steps = Steps(model, make_optimizer(tc), tc, mesh)
                step = steps.train_step
            else:
                steps = CompressedSteps(model, make_optimizer(tc), tc, mesh, comp)
                step = steps.train_step.at(comp.steady_step)
            state = steps.abstract_state(0)
            hlo = step.compile(state, _batch(steps, tc, cfg)).as_text()
            ops = collective_bytes(hlo, mesh.size)
            row = dict(config=config, mesh=sharding.describe(mesh), exchange=name, density=density,
                       params=n_params, payload_mb=sum(o["payload"] for o in ops) / 1e6,
                       wire_mb=sum(o["wire"] for o in ops) / 1e6,
                       all_reduce_mb=sum(o["payload"] for o in ops if o["kind"] == "all-reduce") / 1e6,
                       collectives={k: sum(1 for o in ops if o["kind"] == k) for k in sorted({o["kind"] for o in ops})},
                       compile_s=round(time.perf_counter() - t, 1))
            if comp is not None:
                layout = _layout(model, steps.mesh, comp)
                from jaxformer.compression.exchange import wire_bytes
                row["predicted_wire_mb"] = wire_bytes(layout, mesh.shape[comp.axis], name, comp.value_dtype,
                                                      comp.send_slack, comp.gather_factor) / 1e6
                row["k"] = layout.k_total
            rows.append(row)
            print(json.dumps(row), flush=True)
        del model
    print()
    print(markdown(rows))


def markdown(rows: list[dict]) -> str:
    """The table of results/compression.md: wire bytes per device against the dense step's and against an ideal
    float32 ring all-reduce of the gradients (2 (g-1)/g x 4 bytes x parameters)."""
    dense = {r["config"]: r for r in rows if r["exchange"] == "dense"}
    lines = ["| model | exchange | density | payload MB | wire MB / device | vs dense step | vs fp32 all-reduce |",
             "|---|---|---|---|---|---|---|"]
    ratio = lambda x: f"{x:.0f}x" if x >= 10 else f"{x:.2f}x"  # noqa: E731
    for r in rows:
        g = int(re.search(r"data=(\d+)", r["mesh"]).group(1))
        ideal = 2 * (g - 1) / g * 4 * r["params"] / 1e6
        lines.append(f"| {r['config']} | {r['exchange']} | {r['density'] or 1} | {r['payload_mb']:.2f} | "
                     f"{r['wire_mb']:.2f} | {ratio(dense[r['config']]['wire_mb'] / r['wire_mb'])} | "
                     f"{ratio(ideal / r['wire_mb'])} |")
    return "\n".join(lines)


# ----------------------------------------------------------------------------------------------- convergence
def _run_metrics(out: str) -> dict:
    tc = json.loads((Path(out) / "run.json").read_text())["train_config"]
    label = "dense" if tc.get("grad_compression", "none") == "none" else \
        f"{tc['grad_compression']} {tc['density']:g}"
    if tc.get("compression_freeze_variance_after"):
        label += f", frozen variance after {tc['compression_freeze_variance_after']}"
    if tc.get("compression_warmup_steps"):
        label += f", warm-up {tc['compression_warmup_steps']}"
    if tc.get("clip_norm") == 0:
        label += ", no clipping"
    if tc.get("optimizer", "adamw") != "adamw":
        label = f"{tc['optimizer']}: {label}"
    records = read_metrics(Path(out) / "metrics.jsonl")
    return dict(label=label, train=[r for r in records if "loss" in r],
                evals=[r for r in records if "eval_mlm_loss" in r])


def convergence_table(runs: list[dict], last: int) -> str:
    """Final train loss (mean of the last `last` records), eval MLM loss and accuracy; differences to runs[0]."""
    finals = [dict(train=statistics.fmean(r["loss"] for r in run["train"][-last:]), eval=run["evals"][-1])
              for run in runs]
    base = finals[0]
    lines = ["| run | steps | final train loss | vs first | eval MLM loss | vs first | eval MLM acc | vs first |",
             "|---|---|---|---|---|---|---|---|"]
    for run, f in zip(runs, finals):
        ev = f["eval"]
        rel = lambda x, y: f"{100 * (x - y) / y:+.2f}%"  # noqa: E731
        lines.append(f"| {run['label']} | {run['train'][-1]['step']} | {f['train']:.4f} | "
                     f"{rel(f['train'], base['train'])} | {ev['eval_mlm_loss']:.4f} | "
                     f"{rel(ev['eval_mlm_loss'], base['eval']['eval_mlm_loss'])} | {ev['eval_mlm_acc']:.4f} | "
                     f"{rel(ev['eval_mlm_acc'], base['eval']['eval_mlm_acc'])} |")
    return "\n".join(lines)


def plot_convergence(runs: list[dict], png: str, last: int) -> None:
    """Train loss (moving mean over `last` records) and eval MLM loss of each run against step."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import numpy as np
    fig, (ax, ax_eval) = plt.subplots(1, 2, figsize=(11, 4))
    for run in runs:
        steps, loss = np.array([r["step"] for r in run["train"]]), np.array([r["loss"] for r in run["train"]])
        w = min(last, len(loss))
        ax.plot(steps[w - 1:], np.convolve(loss, np.ones(w) / w, mode="valid"), label=run["label"])
        ax_eval.plot([r["step"] for r in run["evals"]], [r["eval_mlm_loss"] for r in run["evals"]], "o-",
                     label=run["label"])
    ax.set(xlabel="step", ylabel=f"train loss (MLM + NSP, mean of {last} logged steps)", title="training")
    ax_eval.set(xlabel="step", ylabel="eval MLM loss", title="held-out MLM loss")
    for a in (ax, ax_eval):
        a.grid(alpha=0.3)
        a.legend()
    fig.tight_layout()
    fig.savefig(png, dpi=100)
    plt.close(fig)


def _leaves(model, mesh=None):
    """The parameter leaves' shapes, PartitionSpecs on `mesh` and stacked flags, in tree order."""
    from flax import nnx
    from jaxformer import sharding
    from jaxformer.compression.steps import _stacked
    state = nnx.state(model, nnx.Param)
    leaves, treedef = jax.tree.flatten(nnx.to_pure_dict(state))
    specs = treedef.flatten_up_to(sharding.param_specs(state, mesh)) if mesh is not None else None
    return [x.shape for x in leaves], specs, treedef.flatten_up_to(_stacked(state))


def _layout(model, mesh, comp):
    from jaxformer.compression.transform import local_layout
    shapes, specs, stacked = _leaves(model, mesh)
    return local_layout(shapes, specs, stacked, mesh, comp.density, comp.min_size)


# ----------------------------------------------------------------------------------------------- selection
def _median_ms(fn, args, repeats: int) -> float:
    jax.block_until_ready(fn(*args))
    times = []
    for _ in range(repeats):
        t = time.perf_counter()
        jax.block_until_ready(fn(*args))
        times.append(time.perf_counter() - t)
    return 1e3 * statistics.median(times)


def _mags(grads, layout):
    import jax.numpy as jnp
    sparse = [i for i, leaf in enumerate(layout.leaves) if leaf.sparse]
    return [jnp.abs(grads[i]).reshape(layout.leaves[i].rows, layout.leaves[i].cols) for i in sparse]


def selection_table(a) -> None:
    import jax.numpy as jnp
    import numpy as np
    from flax import nnx
    from jaxformer.compression.exchange import Layout
    from jaxformer.compression import selection as sel
    from jaxformer.compression.selection import select, select_reference
    from jaxformer.data import synthetic_batch
    from jaxformer.losses import pretraining_losses
    from jaxformer.steps import _forward, build_model
    cfg = TrainConfig(config=a.config, kernels="xla").model_config(30522)
    model = build_model(cfg, 0)
    shapes, _, stacked = _leaves(model)
    graphdef, state, rest = nnx.split(model, nnx.Param, ...)

    @jax.jit
    def grads(params, batch):
        def loss(p):
            return pretraining_losses(_forward(graphdef, rest, p, batch, deterministic=True), batch)[0]
        return jax.tree.leaves(jax.grad(loss)(params))

    params = nnx.to_pure_dict(state)
    g = [grads(params, synthetic_batch(cfg.vocab_size, a.batch_size, a.seq_len, 20, seed=s)) for s in (0, 1)]
    del params, model, state
    for density in a.densities:
        layout = Layout.build(shapes, stacked, density, a.min_size)
        ks = [leaf.k for leaf in layout.leaves if leaf.sparse]
        mags = [_mags(gr, layout) for gr in g]
        fresh = [jnp.full(m.shape[0], -1.0) for m in mags[0]]

        def run(fn, method, m, t, step):
            return fn(m, ks, method, t, step=step, key=jax.random.key(0), sample_fraction=a.sample_fraction)

        truth = np.asarray(jax.jit(functools.partial(run, select_reference, "exact"))(mags[1], fresh,
                                                                                         jnp.int32(1))[0])
        truth = truth[truth < layout.n_sparse]
        for method in a.methods:
            reference = None
            for impl, fn in (("reference", select_reference), ("bitmap", select)):
                f = jax.jit(functools.partial(run, fn, method))
                t = f(mags[0], fresh, jnp.int32(0))[2] if method == "reused" else fresh
                ms = _median_ms(f, (mags[1], t, jnp.int32(1)), a.repeats)
                index, n, _ = f(mags[1], t, jnp.int32(1))
                index = np.asarray(index)[:int(n)]
                row = dict(device=jax.devices()[0].device_kind, jax=jax.__version__, config=a.config,
                           density=density, method=method, impl=impl, tensors=len(ks), entries=layout.n_sparse,
                           k=layout.k_total, ms=round(ms, 3),
                           recall=round(np.intersect1d(index, truth).size / max(1, truth.size), 4),
                           chosen_per_k=round(index.size / layout.k_total, 4))
                if reference is None:
                    reference = (index, ms)
                else:  # the bitmap selection must choose what the reference chose, entry for entry
                    row.update(same_as_reference=bool(np.array_equal(index, reference[0])),
                               speedup=round(reference[1] / ms, 2))
                print(json.dumps(row), flush=True)
        if a.parts:  # the sampled selection's pieces: its thresholds (both ways) and the bitmap's one pass
            key = jax.random.key(0)
            t = sel.sampled_thresholds(mags[1], ks, key, a.sample_fraction)
            parts = [("thresholds", "reference", jax.jit(lambda m: sel._kth_of_samples_top_k(
                         m, sel._samples(m, ks, key, a.sample_fraction))), (mags[1],)),
                     ("thresholds", "bitmap", jax.jit(lambda m: sel.sampled_thresholds(m, ks, key,
                                                                                        a.sample_fraction)),
                      (mags[1],)),
                     ("admission bitmap", "bitmap", jax.jit(sel.admission), (mags[1], t))]
            for part, impl, f, args in parts:
                print(json.dumps(dict(device=jax.devices()[0].device_kind, jax=jax.__version__, config=a.config,
                                      density=density, method="sampled", impl=impl, part=part,
                                      ms=round(_median_ms(f, args, a.repeats), 3))), flush=True)


# ----------------------------------------------------------------------------------------------- step time
def step_times(a) -> None:
    import jax.numpy as jnp
    import numpy as np
    from jax.sharding import NamedSharding, PartitionSpec as P
    from jaxformer import sharding
    from jaxformer.compression.exchange import Layout
    from jaxformer.compression.selection import select, select_reference
    from jaxformer.data import synthetic_batch
    from jaxformer.steps import Steps, build_model, make_optimizer
    tc = TrainConfig(config=a.config, seq_len=a.seq_len, batch_size=a.batch_size, kernels=a.kernels, mesh=a.mesh,
                     steps=1000, warmup_steps=10)
    cfg = tc.model_config(30522)
    mesh = sharding.make_mesh(sharding.validate(tc.mesh, cfg, tc))
    comp = CompressionConfig(density=a.densities[0], exchange=a.exchange, selection=a.method,
                             value_dtype=a.value_dtype, min_size=a.min_size, sample_fraction=a.sample_fraction)
    model = build_model(cfg, 0)
    shapes, _, stacked = _leaves(model)
    batches = [synthetic_batch(cfg.vocab_size, a.batch_size, a.seq_len, max(1, round(0.15 * a.seq_len)), s)
               for s in range(4)]
    common = dict(device=jax.devices()[0].device_kind, devices=mesh.size, jax=jax.__version__, config=a.config,
                  seq_len=a.seq_len, batch_size=a.batch_size, kernels=a.kernels, mesh=sharding.describe(mesh),
                  nccl=" ".join(f"{k}={v}" for k, v in sorted(os.environ.items()) if k.startswith("NCCL_")))
    for name in ("dense", "compressed"):
        steps = Steps(model, make_optimizer(tc), tc, mesh) if name == "dense" else \
            CompressedSteps(model, make_optimizer(tc), tc, mesh, comp)
        state = steps.init_state(model, 0)  # its parameters are the model's arrays: copied, as steps donate them
        state = steps.place(dataclasses.replace(state, params=jax.device_get(state.params)))
        placed = [steps.place_batch(b) for b in batches]
        state, m, compile_s, times = time_steps(steps.train_step, state, placed, a.steps, a.repeats)
        row = dict(common, step=name, ms_per_step=round(1e3 * statistics.median(times), 3),
                   spread_ms=[round(1e3 * x, 2) for x in times], compile_s=round(compile_s, 1), loss=float(m["loss"]))
        if name == "compressed":  # the data ranks must hold the same parameters, bit for bit
            same = all(all(np.array_equal(np.asarray(s.data), np.asarray(x.addressable_shards[0].data))
                           for s in x.addressable_shards) for x in jax.tree.leaves(state.params))
            row.update(compression=dataclasses.asdict(comp), replicas_identical=same,
                       stats=jax.device_get(state.opt_state[0].stats).reshape(-1, 4).tolist())
        print(json.dumps(row), flush=True)
        del state, placed

    # The cost of compression itself, on random per-rank gradients of the model's shapes (data axis only).
    axis, ranks = comp.axis, mesh.shape[comp.axis]
    tx = steps.transforms[comp.density]
    params = steps._params_shape
    sparse_state = jax.jit(lambda: tx.init(params), out_shardings=steps.state_shardings.opt_state[0])()
    leaves, treedef = jax.tree.flatten(params)
    keys = jax.random.split(jax.random.key(0), len(leaves))
    grads = [jax.device_put(1e-3 * jax.random.normal(k, (ranks, *p.shape)), NamedSharding(mesh, P(axis)))
             for k, p in zip(keys, leaves)]
    ranked = jax.tree.map(lambda x: P(axis) if x.ndim else P(), sparse_state)
    lead = [P(axis)] * len(leaves)
    layout = Layout.build(shapes, stacked, comp.density, comp.min_size)

    def transform(g, s):
        u, s = tx.update(treedef.unflatten([x[0] for x in g]), s)
        return [x[None] for x in jax.tree.leaves(u)], s

    def selection(g, fn=select):
        mags = _mags([x[0] for x in g], layout)
        index, _, _ = fn(mags, [leaf.k for leaf in layout.leaves if leaf.sparse], comp.selection,
                         [jnp.ones(m.shape[0]) for m in mags], step=jnp.int32(1), key=jax.random.key(0),
                         sample_fraction=comp.sample_fraction)
        return index[None]

    def dense(g):
        return [jax.lax.psum(x, axis) for x in g]

    def shard(fn, in_specs, out_specs):
        return jax.jit(jax.shard_map(fn, in_specs=in_specs, out_specs=out_specs, axis_names={axis},
                                     check_vma=False))

    n = a.repeats * a.steps
    with jax.set_mesh(mesh):
        f_transform = shard(transform, (lead, ranked), (lead, ranked))
        reference = functools.partial(selection, fn=select_reference)
        timings = dict(selection_ms=_median_ms(shard(selection, (lead,), P(axis)), (grads,), n),
                       reference_selection_ms=_median_ms(shard(reference, (lead,), P(axis)), (grads,), n),
                       transform_ms=_median_ms(lambda g: f_transform(g, sparse_state), (grads,), n),
                       dense_all_reduce_ms=_median_ms(shard(dense, (lead,), lead), (grads,), n))
    print(json.dumps(dict(common, step="compression alone", compression=dataclasses.asdict(comp),
                          **{k: round(v, 3) for k, v in timings.items()})), flush=True)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    what = ap.add_mutually_exclusive_group(required=True)
    what.add_argument("--bytes", action="store_true")
    what.add_argument("--selection", action="store_true")
    what.add_argument("--step", action="store_true")
    what.add_argument("--convergence", nargs="+", metavar="RUN", help="train.py output directories, dense first")
    ap.add_argument("--plot", metavar="PNG", default=None, help="--convergence: write the loss curves here")
    ap.add_argument("--last", type=int, default=5, help="--convergence: logged steps in the final train loss")
    ap.add_argument("--configs", nargs="+", default=["base", "large"], help="--bytes: the models")
    ap.add_argument("--config", default="large", help="--selection / --step: the model")
    ap.add_argument("--densities", type=float, nargs="+", default=[0.01, 0.001],
                    help="--step times the first")
    ap.add_argument("--mesh", default=None, help="default: data=8 for --bytes, data=2 for --step")
    ap.add_argument("--exchange", default="balanced", choices=EXCHANGES)
    ap.add_argument("--method", default="exact", choices=SELECTIONS, help="the selection of --bytes and --step")
    ap.add_argument("--methods", nargs="+", default=list(SELECTIONS), choices=SELECTIONS,
                    help="--selection: the methods timed")
    ap.add_argument("--parts", action="store_true",
                    help="--selection: also time the sampled selection's thresholds and admission bitmap alone")
    ap.add_argument("--value-dtype", default="bfloat16")
    ap.add_argument("--sample-fraction", type=float, default=CompressionConfig.sample_fraction)
    ap.add_argument("--min-size", type=int, default=CompressionConfig.min_size)
    ap.add_argument("--kernels", default="xla", help="--step (the Pallas kernels need batch_shard_map to leave the "
                                                     "manual data axis alone: jaxformer/compression/steps.py)")
    ap.add_argument("--seq-len", type=int, default=None, help="default: 32 for --bytes, 128 otherwise")
    ap.add_argument("--batch-size", type=int, default=None,
                    help="global; default: 8 for --bytes and --selection, 64 for --step")
    ap.add_argument("--steps", type=int, default=10)
    ap.add_argument("--repeats", type=int, default=5)
    a = ap.parse_args(argv)
    if a.convergence:
        runs = [_run_metrics(d) for d in a.convergence]
        print(convergence_table(runs, a.last))
        if a.plot:
            plot_convergence(runs, a.plot, a.last)
    elif a.bytes:  # compiles only: on 8 virtual CPU devices wherever it runs
        jax.config.update("jax_platforms", "cpu")
        jax.config.update("jax_num_cpu_devices", 8)
        a.mesh, a.seq_len, a.batch_size = a.mesh or "data=8", a.seq_len or 32, a.batch_size or 8
        bytes_table(a)
    elif a.selection:
        a.seq_len, a.batch_size = a.seq_len or 128, a.batch_size or 8
        selection_table(a)
    else:
        a.mesh, a.seq_len, a.batch_size = a.mesh or "data=2", a.seq_len or 128, a.batch_size or 64
        step_times(a)
    return 0


if __name__ == "__main__":
    sys.exit(main())
