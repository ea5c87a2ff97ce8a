"""Throughput of the jaxformer train step (forward, backward, AdamW update) on synthetic batches.

    PYTHONPATH=. python benchmarks/train_step.py --config large --seq-len 128 --batch-size 64
    PYTHONPATH=. python benchmarks/train_step.py --config large --batch-size 128 --mesh data=2   # on 2 GPUs
    PYTHONPATH=. python benchmarks/train_step.py --config large --batch-size 128 --mesh data=2 --kernels xla \
        --grad-compression topk-balanced --density 0.01   # compressed gradient exchange (train.py's flags)

Times `--steps` back-to-back steps after `--warmup` (the steps chain through the donated state, so the device
never waits for the host), repeated `--repeats` times; prints the median seq/s, ms/step and peak device memory
(per device, the largest). `--batch-size` is global; with `--mesh` the step runs on that mesh of all devices
(train.py's `--mesh/--microbatches/--pipeline-repeats`), without it on the default device, unsharded.

`--record [FILE]` also appends the result as one JSON line to FILE (default benchmarks/results/runs.jsonl) with the
date, the git commit and the compiled step's HLO counts (class flop/bytes and collective bytes, jaxformer.hlo_analysis)
for `python -m jaxformer.plan --validate`.
"""

import argparse
import collections
import datetime
import json
import os
import re
import statistics
import subprocess
from pathlib import Path

import jax

from jaxformer import sharding
from pallas_kernels.timing import time_steps
from jaxformer.cli import add_flags
from jaxformer.compression import make_steps
from jaxformer.config import COMPRESSION_FLAGS, XLA_GEMMS, XLA_OPT_LEVELS, TrainConfig
from jaxformer.data import synthetic_batch, synthetic_packed_batch
from jaxformer.hlo_analysis import analyze
from jaxformer.plan.workload import hlo_counts
from jaxformer.steps import build_model, make_optimizer

RUNS = "benchmarks/results/runs.jsonl"


def collective_summary(hlo: str) -> list[dict]:
    """The compiled step's collectives grouped by kind and trips per step (trips > 1: inside a loop, e.g. the layer
    scan), with their count and GB moved per step (jaxformer.hlo_analysis)."""
    groups = collections.defaultdict(lambda: [0, 0.0])
    for op in analyze(re.sub(r"/\*index=\d+\*/", "", hlo)).ops:  # the comments would hide every 5th operand
        if op.cls == "collective":
            g = groups[(op.kind, op.trips)]
            g[0] += 1
            g[1] += op.bytes / 1e9
    return [dict(kind=k, trips=t, count=n, gb_per_step=round(gb, 3)) for (k, t), (n, gb) in sorted(groups.items())]


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--config", default="large")
    ap.add_argument("--seq-len", type=int, default=128)
    ap.add_argument("--batch-size", type=int, default=64)
    ap.add_argument("--kernels", default="xla")
    ap.add_argument("--dropout", type=float, default=None)
    ap.add_argument("--remat", default="none")
    ap.add_argument("--scan-layers", action=argparse.BooleanOptionalAction, default=False,
                    help="the encoder layers in one lax.scan or a loop (BertConfig.scan_layers; default: the loop)")
    ap.add_argument("--mesh", default=None, help="e.g. data=2, tensor=2, pipeline=2 (default: one device)")
    ap.add_argument("--microbatches", type=int, default=1)
    ap.add_argument("--pipeline-repeats", type=int, default=1)
    ap.add_argument("--sequence-parallel", action="store_true")
    ap.add_argument("--xla-opt-level", default="auto", choices=XLA_OPT_LEVELS)
    ap.add_argument("--xla-gemm", default="auto", choices=XLA_GEMMS)
    ap.add_argument("--dump-hlo", default=None, metavar="FILE", help="write the compiled train step's HLO text here")
    ap.add_argument("--record", nargs="?", const=RUNS, default=None, metavar="FILE",
                    help=f"append the result (with date, commit, HLO counts) as a JSON line to FILE (default {RUNS})")
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--repeats", type=int, default=3)
    add_flags(ap, TrainConfig, only=COMPRESSION_FLAGS)  # train.py's --grad-compression, --density, ...
    add_flags(ap, TrainConfig, only=("pack", "pack_samples"))  # packed rows (synthetic_packed_batch)
    a = ap.parse_args()
    if a.grad_compression != "none" and not a.mesh:
        ap.error(f"--grad-compression {a.grad_compression} needs --mesh with data > 1 (e.g. --mesh data=2)")
    tc = TrainConfig(config=a.config, seq_len=a.seq_len, batch_size=a.batch_size, kernels=a.kernels,
                     dropout=a.dropout, remat=a.remat, scan_layers=a.scan_layers, steps=1000, warmup_steps=10,
                     mesh=a.mesh or "data=-1",
                     microbatches=a.microbatches, pipeline_repeats=a.pipeline_repeats,
                     sequence_parallel=a.sequence_parallel, xla_opt_level=a.xla_opt_level, xla_gemm=a.xla_gemm,
                     pack=a.pack, pack_samples=a.pack_samples,
                     **{f: getattr(a, f) for f in COMPRESSION_FLAGS})
    cfg = tc.model_config(30522)
    mesh = sharding.make_mesh(sharding.validate(tc.mesh, cfg, tc)) if a.mesh else None
    model = build_model(cfg, 0)
    steps = make_steps(model, make_optimizer(tc), tc, mesh)
    state = steps.place(steps.init_state(model, 0))
    del model
    p = max(1, round(0.15 * a.seq_len))

    def batch(seed):  # packed: BERT-like sample lengths packed up to tc.packing a row, masked per sample
        if tc.pack:
            return synthetic_packed_batch(cfg.vocab_size, a.batch_size, a.seq_len, tc.packing, seed=seed)
        return synthetic_batch(cfg.vocab_size, a.batch_size, a.seq_len, p, seed)
    batches = [steps.place_batch(batch(seed)) for seed in range(4)]
    collectives = counts = None
    if a.dump_hlo or a.record:
        hlo = steps.train_step.compile(state, batches[0]).as_text()
        if a.dump_hlo:
            with open(a.dump_hlo, "w") as f:
                f.write(hlo)
        collectives = collective_summary(hlo)
        counts = hlo_counts(hlo) if a.record else None
    state, m, compile_s, times = time_steps(steps.train_step, state, batches, a.steps, a.repeats, a.warmup)
    step_s = statistics.median(times)
    peaks = [(d.memory_stats() or {}).get("peak_bytes_in_use", 0) / 2**30 for d in jax.local_devices()]
    result = dict(device=jax.devices()[0].device_kind, jax=jax.__version__, config=a.config, seq_len=a.seq_len,
                  batch_size=a.batch_size, kernels=a.kernels, mesh=sharding.describe(mesh) if mesh else "1 device",
                  devices=mesh.size if mesh else 1, microbatches=a.microbatches, pipeline_repeats=a.pipeline_repeats,
                  dropout=cfg.hidden_dropout_prob, remat=a.remat, scan_layers=a.scan_layers,
                  sequence_parallel=a.sequence_parallel,
                  **({f: getattr(a, f) for f in COMPRESSION_FLAGS} if a.grad_compression != "none" else {}),
                  opt_level=steps.optimization_level(), compiler_options=steps.compiler_options(),
                  collectives=collectives,
                  ms_per_step=step_s * 1e3, seq_per_s=a.batch_size / step_s, compile_s=compile_s,
                  spread_ms=[round(x * 1e3, 2) for x in times], loss=float(m["loss"]),
                  peak_memory_gib=max(peaks), peak_memory_gib_per_device=[round(x, 2) for x in peaks])
    print(json.dumps(result))
    if a.record:
        record(a.record, result, counts)


def git_commit() -> str:
    """HEAD's hash, "+dirty" when the tree has uncommitted changes ("unknown" outside a git checkout);
    $JAXFORMER_COMMIT names it where the tree was copied without its history (a remote GPU machine)."""
    if os.environ.get("JAXFORMER_COMMIT"):
        return os.environ["JAXFORMER_COMMIT"]
    try:
        head = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True,
                              check=True).stdout.strip()
        dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], capture_output=True,
                               text=True).stdout.strip()
        return head + ("+dirty" if dirty else "")
    except (OSError, subprocess.CalledProcessError):
        return "unknown"


def record(path: str, result: dict, counts: dict | None) -> None:
    """Append `result` with the date, the commit and the HLO counts as one JSON line to `path`."""
    line = dict(result, date=datetime.datetime.now().isoformat(timespec="seconds"), commit=git_commit())
    if counts:
        line.update(hlo_classes=counts["classes"], hlo_collectives=counts["collectives"])
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    with open(path, "a") as f:
        f.write(json.dumps(line) + "\n")


if __name__ == "__main__":
    main()
