"""Throughput of the jaxformer train step (forward, backward, AdamW update) on synthetic batches.

    PYTHONPATH=. python benchmarks/train_step.py --config large --seq-len 128 --batch-size 64
    PYTHONPATH=. python benchmarks/train_step.py --config large --batch-size 128 --mesh data=2   # on 2 GPUs
    PYTHONPATH=. python benchmarks/train_step.py --config large --batch-size 128 --mesh data=2 --kernels xla \
        --grad-compression topk-balanced --density 0.01   # compressed gradient exchange (train.py's flags)

Times `--steps` back-to-back steps after `--warmup` (the steps chain through the donated state, so the device
never waits for the host), repeated `--repeats` times; prints the median seq/s, ms/step and peak device memory
(per device, the largest), and the model's flop rate: `tflops` (the step's contractions counted from the model,
`model_flop`, per second), `mfu` (of the GPUs' datasheet bf16 dense peak, jaxformer.plan.hardware; null on a device
without a profile, the CPU included) and `mfu_measured` (of `--gemm`'s bf16 GEMM rate measured in the same
process). `--batch-size` is global (rows); with `--mesh` the step runs on that mesh of all devices (train.py's
`--mesh/--microbatches/--pipeline-repeats`), without it on the default device, unsharded.

Packed rows: `--pack` packs BERT-like sample lengths (`--lengths bert` unpacked: the same lengths one sample a row);
`tokens_per_s` counts real (non-padding) tokens, `samples_per_s` samples, `fill` the real share of the rows:

    PYTHONPATH=. python benchmarks/train_step.py --config large --kernels pallas --seq-len 512 --batch-size 16 \
        --lengths bert        # then the same with --pack

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
from jaxformer.hlo_analysis import COUNT_VERSION, analyze
from jaxformer.plan.calibrate import measure_gemm_rate
from jaxformer.plan.hardware import PROFILES
from jaxformer.plan.validate import gpu_key
from jaxformer.plan.workload import Strategy, Workload, hlo_counts, step_gemms
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


def model_flop(cfg, seq_len: int, batch_size: int) -> float:
    """The model flop of one train step on `batch_size` sequences of `seq_len` (round(0.15 S) masked positions, as
    below): every contraction of the forward and, twice that, the backward (input and weight gradients): the
    layers' GEMMs, attention's scores and context (4 B S^2 D per layer forward), the MLM transform and tied decoder
    at the masked positions (padded V), the pooler and NSP. Counted by jaxformer.plan.workload.step_gemms for one
    device without remat, so neither a recomputed forward nor a pipeline's filler ticks count (model flop, not
    hardware flop); on one device it matches the compiled step's HLO contraction flop under `--kernels xla`
    (tests/test_benchmarks.py), where the Pallas attention kernels hide theirs from the HLO."""
    return sum(g.flop for g in step_gemms(Workload(cfg, seq_len, batch_size), Strategy()))


def flop_rates(flop: float, step_s: float, devices: int, device_kind: str, gemm: dict | None) -> dict:
    """tflops, mfu against the datasheet bf16 dense peak of `devices` GPUs of `device_kind` (None without a profile:
    the CPU, an unknown GPU, PCIe/NVL parts whose peak differs), mfu_measured against `gemm`'s measured rate."""
    tflops = flop / step_s / 1e12
    key = gpu_key(device_kind)
    if any(w in device_kind.lower() for w in ("pcie", "nvl")):
        key = None
    peak = PROFILES[key].bf16_tflops if key else None
    gemm_tflops = gemm["flop_per_s"] / 1e12 if gemm else None
    return dict(model_tflop_per_step=flop / 1e12, flops_source="model (jaxformer.plan.workload.step_gemms)",
                tflops=tflops, peak_tflops=peak, mfu=tflops / (peak * devices) if peak else None,
                gemm_tflops=gemm_tflops, gemm_shape=[gemm[d] for d in "mkn"] if gemm else None,
                mfu_measured=tflops / (gemm_tflops * devices) if gemm_tflops else None)


def parse_gemm(text: str) -> tuple[int, int, int] | None:
    """`--gemm`: "M,K,N" -> (M, K, N); "none" -> None."""
    if text.lower() == "none":
        return None
    try:
        m, k, n = (int(x) for x in text.split(","))
    except ValueError:
        raise argparse.ArgumentTypeError(f"--gemm {text!r}: want M,K,N (e.g. 8192,1024,4096) or none") from None
    if min(m, k, n) < 1:
        raise argparse.ArgumentTypeError(f"--gemm {text!r}: sizes must be positive")
    return m, k, n


def main(argv: list[str] | None = None, quiet: bool = False) -> dict:
    """Run the benchmark with the command-line `argv` (default sys.argv); print (unless `quiet`) and return the
    result (benchmarks/compare_pytorch.py calls this)."""
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
    ap.add_argument("--gemm", type=parse_gemm, default=(8192, 1024, 4096), metavar="M,K,N",
                    help="the bf16 GEMM pair (M,K)@(K,N)@(N,K) whose measured rate mfu_measured divides by (default "
                         "8192,1024,4096: BERT-large's feed-forward on 8192 tokens; none: skip)")
    add_flags(ap, TrainConfig, only=COMPRESSION_FLAGS)  # train.py's --grad-compression, --density, ...
    add_flags(ap, TrainConfig, only=("pack", "pack_samples"))  # packed rows (synthetic_packed_batch)
    ap.add_argument("--lengths", choices=("full", "bert"), default=None,
                    help="sample lengths of the synthetic rows: full (every row all real tokens; the default "
                         "unpacked) or bert (BERT-like lengths, data.synthetic_packed_batch's; the default with "
                         "--pack): one sample a row without --pack, so tokens_per_s compares with packing")
    a = ap.parse_args(argv)
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

    lengths = a.lengths or ("bert" if tc.pack else "full")
    if tc.pack and lengths != "bert":
        ap.error("--pack packs BERT-like sample lengths (--lengths bert)")

    def batch(seed):  # packed: BERT-like sample lengths packed up to tc.packing a row, masked per sample
        if tc.pack:
            return synthetic_packed_batch(cfg.vocab_size, a.batch_size, a.seq_len, tc.packing, seed=seed)
        if lengths == "bert":  # the same lengths one sample a row, in the unpacked batch's keys
            b = synthetic_packed_batch(cfg.vocab_size, a.batch_size, a.seq_len, 1, seed=seed)
            return {k: v[:, 0] if k == "nsp_labels" else v for k, v in b.items()
                    if k not in ("segment_ids", "position_ids", "nsp_positions", "nsp_weights")}
        return synthetic_batch(cfg.vocab_size, a.batch_size, a.seq_len, p, seed)
    host = [batch(seed) for seed in range(4)]
    batches = [steps.place_batch(b) for b in host]
    # real (non-padding) tokens and samples per step, averaged over the batches the steps cycle through
    real_tokens = statistics.mean(float(b["attention_mask"].sum()) for b in host)
    samples = statistics.mean(float(b["nsp_weights"].sum()) if "nsp_weights" in b else a.batch_size for b in host)
    collectives = counts = None
    if a.dump_hlo or a.record:
        hlo = steps.train_step.compile(state, batches[0]).as_text()
        if a.dump_hlo:
            with open(a.dump_hlo, "w") as f:
                f.write(hlo)
        collectives = collective_summary(hlo)
        counts = hlo_counts(hlo)
    state, m, compile_s, times = time_steps(steps.train_step, state, batches, a.steps, a.repeats, a.warmup)
    step_s = statistics.median(times)
    gemm = measure_gemm_rate(*a.gemm) if a.gemm else None
    n_devices = mesh.size if mesh else 1
    rates = flop_rates(model_flop(cfg, a.seq_len, a.batch_size), step_s, n_devices, jax.devices()[0].device_kind,
                       gemm)
    if counts:  # the compiled step's own contraction flop (per device; x devices), beside the model's
        rates["hlo_contraction_tflop_per_step"] = counts["classes"]["contraction"]["flop"] * n_devices / 1e12
    peaks = [(d.memory_stats() or {}).get("peak_bytes_in_use", 0) / 2**30 for d in jax.local_devices()]
    result = dict(device=jax.devices()[0].device_kind, jax=jax.__version__, config=a.config, seq_len=a.seq_len,
                  batch_size=a.batch_size, kernels=a.kernels, mesh=sharding.describe(mesh) if mesh else "1 device",
                  devices=mesh.size if mesh else 1, microbatches=a.microbatches, pipeline_repeats=a.pipeline_repeats,
                  dropout=cfg.hidden_dropout_prob, remat=a.remat, scan_layers=a.scan_layers,
                  sequence_parallel=a.sequence_parallel,
                  **({f: getattr(a, f) for f in COMPRESSION_FLAGS} if a.grad_compression != "none" else {}),
                  opt_level=steps.optimization_level(), compiler_options=steps.compiler_options(),
                  collectives=collectives,
                  pack=tc.pack, samples_per_row=tc.packing if tc.pack else 1, lengths=lengths,
                  ms_per_step=step_s * 1e3, seq_per_s=a.batch_size / step_s, samples_per_s=samples / step_s,
                  tokens_per_s=real_tokens / step_s, fill=real_tokens / (a.batch_size * a.seq_len),
                  compile_s=compile_s,
                  spread_ms=[round(x * 1e3, 2) for x in times], loss=float(m["loss"]),
                  peak_memory_gib=max(peaks), peak_memory_gib_per_device=[round(x, 2) for x in peaks], **rates)
    if not quiet:
        print(json.dumps(result))
    if a.record:
        record(a.record, result, counts)
    return result


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
        line.update(hlo_classes=counts["classes"], hlo_collectives=counts["collectives"],
                    hlo_launches=counts["launches"], hlo_count_version=COUNT_VERSION)
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    with open(path, "a") as f:
        f.write(json.dumps(line) + "\n")


if __name__ == "__main__":
    main()
