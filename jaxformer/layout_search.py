"""Global layout search for the encoder layer: time every operator in every candidate layout, solve a shortest path.

    python -m jaxformer.layout_search --config large --seq-len 128 --batch-size 64 [--kernels xla|pallas]
        [--dtype bfloat16] [--out PATH] [--quick] [--max-candidates K] [--repeats R]

Ivanov et al. (MLSys 2021) chose the stored order of every activation globally: each operator is timed (forward +
backward) in each combination of its inputs' and outputs' layouts, and the cheapest sequence of configurations,
transposes included, is a shortest path over (operator position, layouts of the live tensors): `layouts/solver.py`.
The operators are the very functions the model runs (`jaxformer/layer.py`), timed by `pallas_kernels.timing`, the
clock of the kernel benchmarks (chained iterations inside one jit with an optimization barrier, two run lengths,
median of repeats; jaxformer/layout_timing.py). The result is written as a `LayoutConfig` JSON file (default
`layouts/configs/<gpu>-<preset>-s<seq>.json`, loadable by name or path: `BertConfig(layouts=...)`, `train.py
--layouts`), and the whole encoder layer (forward + backward) is timed in the chosen and in the default layouts.

Operators (XLA path): qkv_proj (x -> qkv), scores (qkv -> scores), softmax (scores -> probs, same layout), context
(probs, qkv -> ctx), attn_out (ctx, x -> x1: projection + BDRLN), ffn_in (x1 -> h: the projection, h the
pre-activation), ffn_out (h, x1 -> x2: bias + GELU, projection, BDRLN). x1 and x2 are stored like x (BDRLN adds the
residual row by row, and x2 is the next layer's x). Under `--kernels pallas` the three attention operators are one
flash-attention operator that reads qkv only as the packed BSCNH (always a candidate; the model's default there) and
writes ctx only as BSNH: other qkv/ctx layouts cost transposes, which are timed and are edges of the graph, exactly the
transposes the model then inserts (`jaxformer/layer.py`).
"""

from __future__ import annotations

import argparse
import datetime
import itertools
import math
import re
import sys
import time
from pathlib import Path

from layouts import config as lc
from layouts.solver import Op, Problem, solve

from .layer import FLASH_CTX, FLASH_QKV, layouts_for

FIXED = {"qkv_kernel": "DCNH", "qkv_bias": "CNH", "out_kernel": "NHD", "in_kernel": "DF", "out2_kernel": "FD"}


def build_problem(kernels: str, cands: dict[str, tuple[str, ...]]) -> tuple[Problem, dict]:
    """The operator graph for `kernels` ("xla" or "pallas") over candidate layouts `cands` (costs filled later)."""
    cands = dict(cands, x1=cands["x"], x2=cands["x"], probs=cands["scores"])
    if kernels == "pallas":
        attention = [Op("flash", ("qkv",), ("ctx",), reads={"qkv": (FLASH_QKV,)}, writes={"ctx": (FLASH_CTX,)})]
        attn_out = Op("attn_out", ("ctx", "x"), ("x1",), reads={"ctx": cands["ctx"]})
    else:
        attention = [Op("scores", ("qkv",), ("scores",)), Op("softmax", ("scores",), ("probs",)),
                     Op("context", ("probs", "qkv"), ("ctx",))]
        attn_out = Op("attn_out", ("ctx", "x"), ("x1",))
    ops = [Op("qkv_proj", ("x",), ("qkv",)), *attention, attn_out, Op("ffn_in", ("x1",), ("h",)),
           Op("ffn_out", ("h", "x1"), ("x2",))]
    problem = Problem(candidates=cands, ops=ops, inputs=("x",), outputs=("x2",), cost=None, ties={"x2": "x"})
    return problem, cands


def same_layout_required(op: Op, reads, writes) -> bool:
    """Operators whose output must be stored like one input: softmax (probs like scores), the BDRLNs (like x)."""
    want = {"softmax": 0, "attn_out": 1, "ffn_out": 1}.get(op.name)
    return want is None or writes[0] == reads[want]


def configurations(problem: Problem, op: Op):
    """Every (reads, writes) an edge of the graph can use for `op` (independent of the state)."""
    read_sets = [op.reads.get(t, problem.candidates[t]) for t in op.inputs]  # reads: live or as `op.reads` allows
    write_sets = [problem.write_options(op, t) for t in op.outputs]
    for reads in itertools.product(*read_sets):
        for writes in itertools.product(*write_sets):
            if same_layout_required(op, reads, writes):
                yield tuple(reads), tuple(writes)


def extract(problem: Problem, solution) -> lc.LayoutConfig:
    """The LayoutConfig of a solved path: where each named activation is written (or, for ctx, read)."""
    by = {c.op: c for c in solution.choices}
    fields = dict(x=solution.inputs["x"], qkv=by["qkv_proj"].writes["qkv"], ctx=by["attn_out"].reads["ctx"],
                  h=by["ffn_in"].writes["h"])
    if "scores" in by:
        fields["scores"] = by["scores"].writes["scores"]
    return lc.LayoutConfig(**fields)


def path_cost(problem: Problem, L: lc.LayoutConfig, kernels: str) -> float:
    """The graph cost of one given LayoutConfig (to print the default layout's predicted time beside the best)."""
    pinned = dict(problem.candidates, x=(L.x,), x1=(L.x,), x2=(L.x,), qkv=(L.qkv,), scores=(L.scores,),
                  probs=(L.scores,), ctx=(L.ctx,), h=(L.h,))
    if kernels == "pallas":  # the flash operator's ctx is BSNH whatever L says; attn_out reads it in L.ctx
        pinned["ctx"] = problem.candidates["ctx"]
    ops = [Op(o.name, o.inputs, o.outputs, {t: ((L.ctx,) if t == "ctx" and o.name == "attn_out" else r)
                                            for t, r in o.reads.items()}, o.writes) for o in problem.ops]
    return solve(Problem(pinned, ops, problem.inputs, problem.outputs, problem.cost, problem.transpose,
                         problem.ties)).total


def slug(text: str) -> str:
    return re.sub(r"[^a-z0-9]+", "-", text.lower()).strip("-") or "device"


def parse_args(argv=None):
    from .cli import HelpFormatter, add_flags
    from .config import TrainConfig
    p = argparse.ArgumentParser(prog="python -m jaxformer.layout_search", description=__doc__,
                                formatter_class=HelpFormatter)
    # train.py's flags for the model's shapes (help from TrainConfig; defaults: BERT-large, batch 64)
    add_flags(p, TrainConfig, only=("config", "seq_len", "batch_size", "dtype"),
              defaults=dict(config="large", batch_size=64))
    p.add_argument("--kernels", choices=("xla", "pallas"), default=None,
                   help="which kernels' operators to time; default: pallas on a GPU, xla elsewhere (as "
                        "kernels='auto')")
    p.add_argument("--out", default=None, help="the LayoutConfig JSON file to write; default: "
                   "layouts/configs/<gpu>-<preset>-s<seq>.json")
    p.add_argument("--max-candidates", type=int, default=None,
                   help="try only the first K candidates of each tensor (the default layout is always first)")
    p.add_argument("--vary", default=",".join(lc.LOGICAL),
                   help="the tensors whose layouts are searched (the others keep the default), e.g. x,h")
    p.add_argument("--repeats", type=int, default=5, help="timed runs per run length (median)")
    p.add_argument("--lengths", default="1,4", help="the two chained run lengths N1,N2")
    p.add_argument("--rotate-mb", type=float, default=128.0,
                   help="rotate input copies over at least this many MB (above L2, so no run hits in cache)")
    p.add_argument("--quick", action="store_true",
                   help="a fast rough search: 2 candidates per tensor, 3 repeats, run lengths 1,3")
    return p.parse_args(argv)


def validate(a) -> None:
    from .config import BertConfig
    if a.config not in BertConfig.preset_names():
        raise ValueError(f"--config {a.config!r} is unknown; choose one of {BertConfig.preset_names()}")
    for name in ("seq_len", "batch_size", "repeats"):
        if getattr(a, name) <= 0:
            raise ValueError(f"--{name.replace('_', '-')}={getattr(a, name)} must be positive")
    a.vary = tuple(t for t in a.vary.split(",") if t)
    unknown = sorted(set(a.vary) - set(lc.LOGICAL))
    if unknown:
        raise ValueError(f"--vary={','.join(a.vary)!r}: unknown tensor name(s) {unknown}; known: {sorted(lc.LOGICAL)}")
    if a.max_candidates is not None and a.max_candidates <= 0:
        raise ValueError(f"--max-candidates={a.max_candidates} must be positive")
    try:
        n1, n2 = (int(v) for v in a.lengths.split(","))
    except ValueError:
        raise ValueError(f"--lengths={a.lengths!r} must be two integers N1,N2") from None
    if not 0 < n1 < n2:
        raise ValueError(f"--lengths={a.lengths!r} must satisfy 0 < N1 < N2")
    a.lengths = (n1, n2)


def main(argv=None) -> int:
    a = parse_args(argv)
    if a.quick:
        a.max_candidates, a.repeats, a.lengths = a.max_candidates or 2, min(a.repeats, 3), "1,3"
    try:
        validate(a)
        from .layout_timing import Timer
        timer = Timer(a)
    except ValueError as e:
        print(f"layout_search: error: {e}", file=sys.stderr)
        return 2
    cands = {t: (c[:a.max_candidates] if a.max_candidates else c) if t in a.vary else c[:1]
             for t, c in lc.CANDIDATES.items()}
    if timer.kernels == "pallas":  # the flash kernel never materialises the scores: their layout is moot
        cands["scores"] = (lc.LOGICAL["scores"],)
        # the packed order flash reads in place is the model's default qkv under pallas (layer.for_kernels): the
        # fixed order when qkv is not varied, else the first candidate (the default configuration is then a path)
        others = tuple(c for c in cands["qkv"] if c not in (FLASH_QKV, lc.LOGICAL["qkv"]))
        cands["qkv"] = (FLASH_QKV,) + (others if "qkv" in a.vary else ())
    problem, cands = build_problem(timer.kernels, cands)
    print(f"# layout search: {timer.device}, jax {timer.jax_version}, {a.config} B={a.batch_size} S={a.seq_len} "
          f"{a.dtype}, kernels={timer.kernels}; candidates: "
          + "; ".join(f"{t}={','.join(cands[t])}" for t in lc.LOGICAL), flush=True)

    table = {}
    work = [(op, cfg) for op in problem.ops for cfg in configurations(problem, op)]
    started = time.perf_counter()
    for i, (op, (reads, writes)) in enumerate(work, 1):
        t = timer.op_time(op.name, dict(zip(op.inputs, reads)), dict(zip(op.outputs, writes)))
        table[op.name, reads, writes] = t
        eta = (time.perf_counter() - started) / i * (len(work) - i)
        print(f"[{i}/{len(work)}] {op.name:8s} " + " ".join(f"{k}={v}" for k, v in zip(op.inputs, reads))
              + " -> " + " ".join(f"{k}={v}" for k, v in zip(op.outputs, writes))
              + f": {t * 1e6:9.1f} us   (eta {eta:.0f} s)", flush=True)
    transposes = {}
    for op in problem.ops:
        for tensor, allowed in op.reads.items():
            for src in problem.write_options(next(o for o in problem.ops if tensor in o.outputs), tensor):
                for dst in allowed:
                    if src != dst and (tensor, src, dst) not in transposes:
                        transposes[tensor, src, dst] = t = timer.transpose_time(tensor, src, dst)
                        print(f"[transpose] {tensor} {src} -> {dst}: {t * 1e6:9.1f} us", flush=True)

    # A timing below zero is noise around a negligible cost: count it as zero in the graph.
    problem.cost = lambda op, r, w: max(table.get((op.name, tuple(r), tuple(w)), math.inf), 0.0)
    problem.transpose = lambda t, s, d: max(transposes.get((t, s, d), math.inf), 0.0)
    solution = solve(problem)
    chosen = extract(problem, solution)
    default = layouts_for(lc.LayoutConfig(), timer.kernels == "pallas")  # what the model runs by default
    predicted_default = path_cost(problem, default, timer.kernels)
    print("\n# chosen path (operator: reads -> writes, transposes, cost)")
    for c in solution.choices:
        tr = "".join(f" +transpose {t} {s}->{d}" for t, s, d in c.transposes)
        print(f"  {c.op:8s} {c.reads} -> {c.writes}{tr}: {c.cost * 1e6:.1f} us")
    print(f"# predicted layer time (sum of operators): chosen {solution.total * 1e6:.1f} us, "
          f"default {predicted_default * 1e6:.1f} us")
    print(f"# chosen layouts: {chosen.to_dict()}", flush=True)

    t_chosen = timer.layer_time(chosen)
    t_default = t_chosen if chosen == default else timer.layer_time(default)
    print(f"# measured encoder layer fwd+bwd: chosen {t_chosen * 1e6:.1f} us, default {t_default * 1e6:.1f} us "
          f"({t_default / t_chosen if t_chosen > 0 else float('nan'):.3f}x)")
    out = Path(a.out) if a.out else lc.CONFIG_DIR / f"{slug(timer.device)}-{a.config}-s{a.seq_len}.json"
    meta = dict(device=timer.device, jax=timer.jax_version, preset=a.config, seq_len=a.seq_len,
                batch_size=a.batch_size, dtype=a.dtype, kernels=timer.kernels,
                date=datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
                command="python -m jaxformer.layout_search " + " ".join(sys.argv[1:] if argv is None else argv),
                predicted_us=dict(chosen=solution.total * 1e6, default=predicted_default * 1e6),
                measured_layer_us=dict(chosen=t_chosen * 1e6, default=t_default * 1e6))
    lc.save(chosen, out, meta)
    print(f"# wrote {out}  (use: BertConfig(layouts={str(out)!r}) or train.py --layouts {out})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
