"""Data-movement report of a compiled train step, from XLA's *optimized* HLO (after fusion).

    python -m jaxformer.hlo_report --config tiny [--kernels pallas] [--forward-only] [--json] [--dump DIR]
    python -m jaxformer.hlo_report --config base --compare xla pallas
    python -m jaxformer.hlo_report --config base --mesh data=8 --grad-compression topk-balanced --density 0.01

Compiles the step from abstract shapes (no model-sized allocation), then `jaxformer.hlo_analysis.analyze` puts every
operator XLA launches into Ivanov et al.'s classes with its flop and bytes; this module formats the tables, the
JSON and the side-by-side comparison.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import sys
from pathlib import Path

from .config import COMPRESSION_FLAGS
from .data import synthetic_batch
from .hlo_analysis import (  # noqa: F401  (COLLECTIVES, analyze, Report are this module's public names too)
    COLLECTIVES, Report, analyze, CLASSES, shapes)


def compiled_hlo(tc, forward_only: bool = False, mesh=None) -> str:
    """The optimized HLO text of `tc`'s train step (or the model's forward), compiled from abstract shapes only:
    nothing of the model's size is allocated, so base/large can be analysed on a CPU. With a `mesh`
    (`jaxformer.sharding.make_mesh`) it is the sharded step the trainer runs there, collectives included."""
    import jax
    from flax import nnx

    from .compression import make_steps, steady_train_step
    from .model import BertForPreTraining
    from .steps import make_optimizer

    cfg = tc.model_config(30522)
    make = lambda: BertForPreTraining(cfg, rngs=nnx.Rngs(params=0, dropout=1))  # noqa: E731
    model = nnx.eval_shape(make)
    p = max(1, round(0.15 * tc.seq_len))
    batch = jax.eval_shape(lambda: synthetic_batch(cfg.vocab_size, tc.batch_size, tc.seq_len, p))
    if forward_only:
        graphdef, params, rest = nnx.split(model, nnx.Param, ...)

        def forward(params, b):
            m = nnx.merge(graphdef, params, rest)
            return m(b["input_ids"], b["token_type_ids"], b["attention_mask"], b["masked_positions"])
        if mesh is None:
            return jax.jit(forward).lower(params, batch).compile().as_text()
        from . import sharding
        fwd = jax.jit(forward, in_shardings=(sharding.param_shardings(params, mesh), sharding.batch_sharding(mesh)))
        with jax.set_mesh(mesh):
            return fwd.lower(nnx.to_pure_dict(params), batch).compile().as_text()
    steps = make_steps(model, make_optimizer(tc), tc, mesh)
    state = jax.eval_shape(lambda: steps.init_state(make(), 0))
    return steady_train_step(steps).compile(state, batch).as_text()


def _mesh(text: str, tc):
    """The mesh of `--mesh` over the first devices it needs (all of them for a -1 axis), checked as train.py checks
    it. Where JAX has not started yet, a CPU gets as many virtual devices as the mesh has."""
    import jax

    from . import sharding
    from .config import MeshConfig

    size = MeshConfig.parse(text).size  # negative with a -1 axis
    if size > 0:
        try:
            jax.config.update("jax_num_cpu_devices", size)
        except Exception:  # noqa: BLE001 (backends already started, e.g. under pytest: use the devices there are)
            pass
    devices = jax.devices()
    devices = devices[:size] if 0 < size <= len(devices) else devices
    return sharding.make_mesh(sharding.validate(text, tc.model_config(30522), tc, len(devices)), devices)


# ----------------------------------------------------------------------------------------------- output
def _fmt(x: float) -> str:
    for unit, scale in (("T", 1e12), ("G", 1e9), ("M", 1e6), ("k", 1e3)):
        if abs(x) >= scale:
            return f"{x / scale:.2f}{unit}"
    return f"{x:.0f}"


def class_table(rep: Report) -> list[str]:
    """Per class: launches, flop, bytes and their shares; with a joined profile also measured time per step and its
    share of runtime (Ivanov et al.'s Table 1)."""
    classes = rep.classes()
    tf = sum(c["flop"] for c in classes.values()) or 1.0
    tb = sum(c["bytes"] for c in classes.values()) or 1.0
    timed = "time_s" in classes["other"]
    tt = sum(c.get("time_s", 0.0) for c in classes.values()) or 1.0
    lines = [f"{'class':<14}{'count':>7}{'flop':>10}{'flop%':>7}{'bytes':>10}{'bytes%':>8}"
             + (f"{'ms':>9}{'time%':>7}" if timed else "")]
    for name, c in classes.items():
        lines.append(f"{name:<14}{c['count']:>7}{_fmt(c['flop']):>10}{100 * c['flop'] / tf:>6.1f}%"
                     f"{_fmt(c['bytes']) + 'B':>10}{100 * c['bytes'] / tb:>7.1f}%"
                     + (f"{c['time_s'] * 1e3:>9.3f}{100 * c['time_s'] / tt:>6.1f}%" if timed else ""))
    lines.append(f"{'total':<14}{sum(c['count'] for c in classes.values()):>7}{_fmt(tf):>10}{'':>7}"
                 f"{_fmt(tb) + 'B':>10}" + (f"{'':>8}{tt * 1e3:>9.3f}" if timed else ""))
    return lines


def profiled_report(tc, steps: int, mesh=None) -> tuple[Report, str]:
    """The report of `tc`'s train step with measured device time per operator (`jaxformer.hlo_profile`): builds the
    model for real (this needs the memory of a training run) and runs `steps` profiled steps on a synthetic batch.
    With a `mesh`, the sharded step; times are per device (averaged over the devices' traces)."""
    from .compression import make_steps
    from .hlo_profile import profile_compiled
    from .steps import build_model, make_optimizer

    cfg = tc.model_config(30522)
    model = build_model(cfg, 0)
    st = make_steps(model, make_optimizer(tc), tc, mesh)
    state = st.place(st.init_state(model, 0))
    del model
    batch = st.place_batch(synthetic_batch(cfg.vocab_size, tc.batch_size, tc.seq_len, max(1, round(0.15 * tc.seq_len))))
    compiled = st.train_step.compile(state, batch)
    times = profile_compiled(compiled, (state, batch), steps, carry=lambda out, args: (out[0], args[1]),
                             log=lambda m: print(m, file=sys.stderr))
    text = compiled.as_text()
    rep = analyze(text)
    rep.attach_times(times, steps)
    return rep, text


def text_report(rep: Report, top: int) -> str:
    lines = class_table(rep)
    lines.append(f"launches per step: {rep.launches()} ({rep.launches(in_loops=True)} inside while loops)")
    coll = {k: v for k, v in rep.collectives().items() if v["count"]}
    if coll:
        lines += ["", "collectives: " + ", ".join(f"{k} x{v['count']} {_fmt(v['bytes'])}B" for k, v in coll.items())]
    timed = rep.timed
    lines += ["", f"top {top} operators by {'measured time' if timed else 'bytes'} (loop bodies: bytes and flop "
              "summed over all trips)",
              f"{'name':<40}{'class':<14}{'bytes':>10}{'flop':>10}{'trips':>6}" + ("      us" if timed else "")
              + "  shape"]
    for op in rep.top(top):
        lines.append(f"{op.name[:39]:<40}{op.cls:<14}{_fmt(op.bytes) + 'B':>10}{_fmt(op.flop):>10}{op.trips:>6}"
                     + (f"{op.time_s * 1e6:>8.1f}" if timed else "") + f"  {op.shape}")
    lines += [f"note: {n}" for n in rep.notes]
    return "\n".join(lines)


def compare_report(a: str, ra: Report, b: str, rb: Report) -> str:
    ta, tb = class_table(ra), class_table(rb)
    width = max(len(x) for x in ta) + 3
    lines = [f"{'kernels=' + a:<{width}}kernels={b}"] + [f"{x:<{width}}{y}" for x, y in zip(ta, tb)]
    ca, cb = ra.classes(), rb.classes()
    lines += ["", f"change in bytes per step ({b} - {a}):"]
    for name in CLASSES:
        d = cb[name]["bytes"] - ca[name]["bytes"]
        lines.append(f"  {name:<14}{'+' if d >= 0 else '-'}{_fmt(abs(d))}B")
    sa, sb = sum(c["bytes"] for c in ca.values()), sum(c["bytes"] for c in cb.values())
    lines.append(f"  {'total':<14}{'+' if sb >= sa else '-'}{_fmt(abs(sb - sa))}B "
                 f"({100 * (sb - sa) / (sa or 1):+.1f}%)")
    lines += [f"note ({k}): {n}" for k, r in ((a, ra), (b, rb)) for n in r.notes]
    return "\n".join(lines)


# train.py's flags that shape the compiled step, with their help from TrainConfig (defaults: a small step).
SHARED_FLAGS = ("config", "seq_len", "batch_size", "kernels", "dtype", "remat", "scan_layers", "layouts",
                "microbatches", "pipeline_repeats") + COMPRESSION_FLAGS


def parse_args(argv=None) -> argparse.Namespace:
    from .cli import HelpFormatter, add_flags
    from .config import TrainConfig
    p = argparse.ArgumentParser(prog="python -m jaxformer.hlo_report", description=__doc__,
                                formatter_class=HelpFormatter)
    add_flags(p, TrainConfig, only=SHARED_FLAGS, defaults=dict(batch_size=8, kernels="xla"))
    p.add_argument("--forward-only", action="store_true", help="the model's forward (eval) instead of a train step")
    p.add_argument("--top", type=int, default=15, help="how many operators to list by bytes")
    p.add_argument("--json", action="store_true", help="print one JSON object")
    p.add_argument("--dump", metavar="DIR", default=None, help="write the optimized HLO text to DIR")
    p.add_argument("--compare", nargs=2, metavar=("A", "B"), choices=("auto", "xla", "pallas"), default=None,
                   help="compare two --kernels values, e.g. --compare xla pallas")
    p.add_argument("--profile", type=int, nargs="?", const=5, default=None, metavar="STEPS",
                   help="run the train step for real, STEPS (default 5) of them under the profiler, and add each "
                        "class's measured share of runtime (use on a GPU; builds the whole model)")
    p.add_argument("--mesh", default=None,
                   help="compile the step sharded on this device mesh, as train.py --mesh (e.g. data=2,tensor=4); on "
                        "a CPU the mesh's size of virtual CPU devices is made; default: one device, no mesh")
    p.add_argument("--hlo", metavar="FILE", default=None,
                   help="analyse this optimized-HLO text file (e.g. train.py --dump-hlo on a GPU) instead of compiling")
    return p.parse_args(argv)


def main(argv=None) -> int:
    args = parse_args(argv)
    if args.profile:
        # XLA on a GPU replays runs of kernels as CUDA graphs ("command buffers"), which the profiler reports as one
        # event: switch them off (before the backend starts) so each kernel is an event with its own hlo_op.
        os.environ["XLA_FLAGS"] = os.environ.get("XLA_FLAGS", "") + " --xla_gpu_enable_command_buffer="
    from .config import BertConfig, TrainConfig
    kernels = args.compare or [args.kernels]
    try:
        if args.config not in BertConfig.preset_names():
            raise ValueError(f"--config {args.config!r} is unknown; choose one of {BertConfig.preset_names()}")
        if args.top < 0:
            raise ValueError(f"--top {args.top} must be >= 0")
        if args.profile is not None and (args.profile < 1 or args.forward_only or args.hlo):
            raise ValueError(f"--profile {args.profile} needs STEPS >= 1 and times the train step: not with "
                             f"--forward-only or --hlo")
        configs = [TrainConfig(config=args.config, seq_len=args.seq_len, batch_size=args.batch_size, kernels=k,
                               dtype=args.dtype, remat=args.remat, layouts=args.layouts, scan_layers=args.scan_layers,
                               microbatches=args.microbatches, pipeline_repeats=args.pipeline_repeats,
                               **{f: getattr(args, f) for f in COMPRESSION_FLAGS},
                               **({"mesh": args.mesh} if args.mesh else {})) for k in kernels]
        if args.grad_compression != "none" and not (args.mesh or args.hlo or args.forward_only):
            raise ValueError(f"grad_compression={args.grad_compression!r} compresses the gradient exchange over the "
                             "data axis: give --mesh with data > 1 (e.g. --mesh data=2)")
        mesh = _mesh(args.mesh, configs[0]) if args.mesh and not args.hlo else None
    except ValueError as e:  # TrainConfig's validation names the field: say the flag instead
        msg = re.sub(r"\b(seq_len|batch_size|dtype|remat|kernels|layouts|grad_compression|density|compression_\w+)\b",
                     lambda m: "--" + m.group(1).replace("_", "-"), str(e), count=1)
        print(f"hlo_report: error: {msg}", file=sys.stderr)
        return 2
    if args.hlo:
        try:
            rep = analyze(Path(args.hlo).read_text())
        except (OSError, ValueError) as e:
            print(f"hlo_report: error: --hlo {args.hlo}: {e}", file=sys.stderr)
            return 2
        print(json.dumps(dict(hlo=args.hlo, **rep.to_json(args.top))) if args.json else text_report(rep, args.top))
        return 0
    reports = {}
    for k, tc in zip(kernels, configs):
        if args.profile:
            reports[k], text = profiled_report(tc, args.profile, mesh)
        else:
            text = compiled_hlo(tc, args.forward_only, mesh)
        if args.dump:
            out = Path(args.dump)
            out.mkdir(parents=True, exist_ok=True)
            name = f"{'forward' if args.forward_only else 'train_step'}_{args.config}_{k}.hlo.txt"
            (out / name).write_text(text)
            print(f"wrote {out / name}", file=sys.stderr)
        if not args.profile:
            reports[k] = analyze(text)
        if k == "pallas" and "triton" not in text:  # CPU: interpret mode, nothing like the GPU's fused kernels
            reports[k].notes.append("Pallas kernels ran in interpret mode (no GPU): each grid is a while loop of "
                                    "per-block slices and updates, so their bytes and counts are not the GPU's")
    setup = dict(config=args.config, seq_len=args.seq_len, batch_size=args.batch_size, dtype=args.dtype,
                 remat=args.remat, forward_only=args.forward_only, **({"mesh": args.mesh} if args.mesh else {}),
                 **({"grad_compression": args.grad_compression, "density": args.density}
                    if args.grad_compression != "none" and not args.forward_only else {}))
    if args.json:
        if args.compare:
            print(json.dumps(dict(setup, compare={k: r.to_json(args.top) for k, r in reports.items()})))
        else:
            print(json.dumps(dict(setup, kernels=kernels[0], **reports[kernels[0]].to_json(args.top))))
    elif args.compare:
        print(compare_report(kernels[0], reports[kernels[0]], kernels[1], reports[kernels[1]]))
    else:
        print(", ".join(f"{k}={v}" for k, v in setup.items()) + f", kernels={kernels[0]}")
        print(text_report(reports[kernels[0]], args.top))
    return 0


if __name__ == "__main__":
    sys.exit(main())
