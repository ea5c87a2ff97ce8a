"""python -m jaxformer.plan: rank distributed training strategies for a BERT encoder by predicted step time.

    python -m jaxformer.plan --config large --seq-len 128 --global-batch 256 --gpus 16 --gpu h100
    python -m jaxformer.plan --hidden-size 2560 --layers 36 --heads 32 --gpus 64 --inter-node-gbps 100 --json
    python -m jaxformer.plan --config large --gpus 2 --strategy dp=2          # one strategy, its breakdown
    python -m jaxformer.plan --calibrate calib.json                           # on the GPUs: measure the rates
    python -m jaxformer.plan --validate benchmarks/results/runs.jsonl --calibration calib.json

Every input is checked before any work (exit status 2, naming the field and value). The model, its equations and
assumptions: docs/performance-model.md.
"""

from __future__ import annotations

import argparse
import json
import sys

from ..config import BertConfig
from .hardware import PROFILES, Calibration, Hardware
from .search import Space, check, evaluate, search, table
from .workload import Strategy, Workload

STRATEGY_KEYS = {"dp": "dp", "data": "dp", "fsdp": "fsdp", "tp": "tp", "tensor": "tp", "pp": "pp", "pipeline": "pp",
                 "m": "microbatches", "microbatches": "microbatches", "r": "repeats", "repeats": "repeats",
                 "remat": "remat", "kernels": "kernels", "sp": "sequence_parallel", "density": "density"}


def parse_strategy(text: str, defaults: dict) -> Strategy:
    """"dp=2,tp=2,pp=2,m=4,r=1,remat=full,kernels=pallas,sp" -> Strategy."""
    fields = dict(defaults)
    for piece in (p.strip() for p in text.split(",") if p.strip()):
        key, eq, value = piece.partition("=")
        if key not in STRATEGY_KEYS:
            raise ValueError(f"--strategy piece {piece!r}: unknown key {key!r}; keys are {sorted(STRATEGY_KEYS)}")
        name = STRATEGY_KEYS[key]
        if name == "sequence_parallel":
            fields[name] = value.lower() not in ("0", "false", "no") if eq else True
        elif name in ("remat", "kernels"):
            fields[name] = value
        else:
            try:
                fields[name] = float(value) if name == "density" else int(value)
            except ValueError:
                raise ValueError(f"--strategy piece {piece!r}: {value!r} is not a number") from None
    return Strategy(**fields)


def _csv(text: str, kind=str) -> tuple:
    return tuple(kind(x.strip()) for x in text.split(",") if x.strip())


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m jaxformer.plan", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    m = p.add_argument_group("model")
    m.add_argument("--config", default=None, help="preset: tiny, mini, base, large (default large, or custom with "
                                                  "--hidden-size)")
    m.add_argument("--layers", type=int, default=None, help="num_hidden_layers (overrides the preset)")
    m.add_argument("--hidden-size", type=int, default=None)
    m.add_argument("--heads", type=int, default=None, help="num_attention_heads")
    m.add_argument("--intermediate-size", type=int, default=None, help="default 4 x hidden size for a custom model")
    m.add_argument("--vocab-size", type=int, default=None)
    m.add_argument("--seq-len", type=int, default=128)
    m.add_argument("--global-batch", type=int, default=256)
    h = p.add_argument_group("hardware")
    h.add_argument("--gpus", type=int, default=8)
    h.add_argument("--gpus-per-node", type=int, default=8)
    h.add_argument("--gpu", default="h100", help=f"one of {sorted(PROFILES)}")
    h.add_argument("--inter-node-gbps", type=float, default=None,
                   help="a node's network bandwidth in Gb/s, all its NICs together (default: the profile's)")
    h.add_argument("--calibration", metavar="FILE", default=None, help="rates measured by --calibrate")
    s = p.add_argument_group("strategies")
    s.add_argument("--strategy", default=None, help="evaluate one, e.g. dp=2,tp=2,pp=2,m=8,r=2,remat=full")
    s.add_argument("--kernels", default="pallas", help="comma list of xla, pallas")
    s.add_argument("--remat", default="none,full", help="comma list of none, full, dots")
    s.add_argument("--microbatches", default=None, help="comma list (default: powers of two from the stages)")
    s.add_argument("--repeats", default="1,2", help="comma list of circular-schedule repeats")
    s.add_argument("--sequence-parallel", action="store_true", help="also try Megatron sequence parallelism")
    s.add_argument("--density", type=float, default=None, help="top-k gradient exchange at this density")
    s.add_argument("--pipeline-style", default="jaxformer", choices=("jaxformer", "megatron"),
                   help="pipelines as jaxformer/pipeline.py runs them, or Megatron-style (1F1B, embeddings and heads "
                        "on the first and last stage, gradients summed once): a what-if")
    s.add_argument("--overlap-grads", action="store_true",
                   help="assume the batch axes' gradient/weight traffic hides behind compute (default: exposed)")
    o = p.add_argument_group("output")
    o.add_argument("--top", type=int, default=20)
    o.add_argument("--json", action="store_true", help='print {"strategies": [...]}')
    o.add_argument("--no-progress", action="store_true")
    v = p.add_argument_group("calibration and validation")
    v.add_argument("--calibrate", metavar="FILE", default=None, help="measure this machine's GPUs, write FILE")
    v.add_argument("--validate", metavar="FILE", nargs="?", const="benchmarks/results/runs.jsonl", default=None,
                   help="predict every recorded run (default benchmarks/results/runs.jsonl)")
    v.add_argument("--plot", metavar="PNG", default=None, help="with --validate: predicted vs measured plot")
    return p


def workload_of(a) -> Workload:
    custom = {k: v for k, v in (("num_hidden_layers", a.layers), ("hidden_size", a.hidden_size),
                                ("num_attention_heads", a.heads), ("intermediate_size", a.intermediate_size),
                                ("vocab_size", a.vocab_size)) if v is not None}
    if a.config is not None:
        if a.config not in BertConfig.preset_names():
            raise ValueError(f"--config {a.config!r} is unknown; choose one of {BertConfig.preset_names()}")
        cfg = BertConfig.preset(a.config, **custom)
    elif "hidden_size" in custom:
        custom.setdefault("intermediate_size", 4 * custom["hidden_size"])
        custom.setdefault("num_attention_heads", max(1, custom["hidden_size"] // 64))
        cfg = BertConfig(**custom)
    else:
        cfg = BertConfig.preset("large", **custom)
    for name, value in (("--seq-len", a.seq_len), ("--global-batch", a.global_batch)):
        if value < 1:
            raise ValueError(f"{name} {value} must be a positive integer")
    if a.seq_len > cfg.max_position_embeddings:
        raise ValueError(f"--seq-len {a.seq_len} exceeds max_position_embeddings={cfg.max_position_embeddings}")
    return Workload(cfg, a.seq_len, a.global_batch)


def hardware_of(a) -> Hardware:
    if a.gpu not in PROFILES:
        raise ValueError(f"--gpu {a.gpu!r} is unknown; choose one of {sorted(PROFILES)}")
    for name, value in (("--gpus", a.gpus), ("--gpus-per-node", a.gpus_per_node)):
        if value < 1:
            raise ValueError(f"{name} {value} must be a positive integer")
    if a.gpus > a.gpus_per_node and a.gpus % a.gpus_per_node:
        raise ValueError(f"--gpus {a.gpus} is not a multiple of --gpus-per-node {a.gpus_per_node}")
    if a.inter_node_gbps is not None and a.inter_node_gbps <= 0:
        raise ValueError(f"--inter-node-gbps {a.inter_node_gbps} must be positive")
    calib = None
    if a.calibration:
        try:
            calib = Calibration.load(a.calibration)
        except (OSError, KeyError, ValueError) as e:
            raise ValueError(f"--calibration {a.calibration}: {e}") from None
    return Hardware.make(a.gpu, a.gpus_per_node, a.inter_node_gbps, calib)


def space_of(a) -> Space:
    try:
        space = Space(kernels=_csv(a.kernels), remat=_csv(a.remat),
                      microbatches=_csv(a.microbatches, int) if a.microbatches else None,
                      repeats=_csv(a.repeats, int),
                      sequence_parallel=(False, True) if a.sequence_parallel else (False,),
                      density=a.density, pipeline_style=a.pipeline_style)
    except ValueError:
        raise ValueError(f"--microbatches {a.microbatches!r} / --repeats {a.repeats!r} must be comma lists of "
                         f"integers") from None
    for k in space.kernels:
        if k not in ("xla", "pallas"):
            raise ValueError(f"--kernels {k!r} must be xla or pallas")
    for r in space.remat:
        if r not in ("none", "full", "dots"):
            raise ValueError(f"--remat {r!r} must be none, full or dots")
    for name, values in (("--microbatches", space.microbatches or ()), ("--repeats", space.repeats)):
        if any(v < 1 for v in values):
            raise ValueError(f"{name} {values} must be positive integers")
    if a.density is not None and not 0 < a.density <= 1:
        raise ValueError(f"--density {a.density} must be in (0, 1]")
    if a.top < 1:
        raise ValueError(f"--top {a.top} must be >= 1")
    return space


def main(argv=None) -> int:
    a = build_parser().parse_args(argv)
    try:
        if a.calibrate:
            from .calibrate import calibrate
            calibrate(a.calibrate)
            return 0
        hw = hardware_of(a)
        if a.validate:
            from .validate import validate
            return validate(a.validate, hw, plot_path=a.plot, as_json=a.json)
        w = workload_of(a)
        space = space_of(a)
        one = None
        if a.strategy:
            one = parse_strategy(a.strategy, dict(kernels=space.kernels[0], density=a.density,
                                                  pipeline_style=a.pipeline_style))
            if one.gpus != a.gpus:
                raise ValueError(f"--strategy {a.strategy!r} uses {one.gpus} GPUs (dp*fsdp*tp*pp) but --gpus is "
                                 f"{a.gpus}")
            reason = check(w, one, a.gpus)
            if reason:
                raise ValueError(f"--strategy {a.strategy!r}: {reason}")
    except (ValueError, FileNotFoundError) as e:
        print(f"plan: error: {e}", file=sys.stderr)
        return 2
    if one is not None:
        preds = [evaluate(w, one, hw, a.gpus, overlap_grads=a.overlap_grads)]
    else:
        preds = search(w, hw, a.gpus, space, overlap_grads=a.overlap_grads,
                       progress=not a.no_progress and not a.json and sys.stderr.isatty())
    if a.json:
        print(json.dumps({"workload": dict(config=w.model.to_dict(), seq_len=w.seq_len, global_batch=w.global_batch,
                                           params=w.params),
                          "hardware": dict(gpu=hw.profile.name, gpus=a.gpus, gpus_per_node=hw.gpus_per_node,
                                           inter_node_gbps=hw.inter_node_gbps, calibrated=hw.calibration is not None),
                          "strategies": [p.to_dict() for p in preds]}))
        return 0
    cfg = w.model
    print(f"BERT L={cfg.num_hidden_layers} D={cfg.hidden_size} N={cfg.num_attention_heads} "
          f"F={cfg.intermediate_size} ({w.params / 1e6:.0f}M parameters), S={w.seq_len}, global batch "
          f"{w.global_batch}, {a.gpus} x {hw.profile.name} ({hw.gpus_per_node} per node, {hw.inter_node_gbps:g} Gb/s "
          f"between nodes){', calibrated' if hw.calibration else ''}")
    print(table(preds, a.top))
    if one is not None and preds[0].feasible:
        print("breakdown (ms): " + ", ".join(f"{k[:-2]} {v * 1e3:.2f}" for k, v in preds[0].breakdown.items()
                                             if k.endswith("_s")))
        for c in preds[0].collectives:
            print(f"    {c.kind:<19}{c.what:<48} x{c.count:<6g}{c.bytes / 1e6:>10.2f} MB over {c.axis} ({c.group})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
