"""`python -m jaxformer.plan --validate [FILE]`: predict every run recorded by `benchmarks/train_step.py --record`
(one JSON object per line) and compare with what was measured: step time, peak memory per GPU, and, where the record
carries the compiled step's HLO counts, the collectives' bytes and the contraction flop."""

from __future__ import annotations

import dataclasses
import json
import math
import sys
from pathlib import Path

from ..config import BertConfig, MeshConfig
from . import comm as _comm
from .hardware import PROFILES, Hardware
from .predict import predict
from .workload import CPU, GPU, Strategy, Workload, attention_in_kernel, step_gemms

# the hlo_analysis count version whose contraction flop the model's can be compared with (a GEMM fused with its
# weight slice at 2mnk); earlier records counted such a GEMM's output elements
FLOP_COUNT_VERSION = 2


def gpu_key(device: str) -> str | None:
    """The profile of a JAX device_kind ("NVIDIA H100 80GB HBM3", "NVIDIA H200", "NVIDIA A100-SXM4-80GB")."""
    d = device.lower()
    return next((k for k in PROFILES if k in d), None)


def run_to_case(rec: dict) -> tuple[Workload, Strategy]:
    """The workload and strategy of a recorded run (train_step.py's JSON fields)."""
    cfg = BertConfig.preset(rec["config"])
    mesh = MeshConfig() if rec.get("mesh", "1 device") == "1 device" else MeshConfig.parse(rec["mesh"])
    kernels = rec.get("kernels", "xla")
    if kernels == "auto":  # jaxformer/ops.py on a GPU: pallas, except under sequence parallelism
        kernels = "xla" if rec.get("sequence_parallel") else "pallas"
    s = Strategy(dp=mesh.data, fsdp=mesh.fsdp, tp=mesh.tensor, pp=mesh.pipeline,
                 microbatches=rec.get("microbatches", 1), repeats=rec.get("pipeline_repeats", 1),
                 remat=rec.get("remat", "none"), kernels=kernels,
                 sequence_parallel=bool(rec.get("sequence_parallel", False)))
    return Workload(cfg, rec["seq_len"], rec["batch_size"]), s


@dataclasses.dataclass
class Row:
    label: str
    device: str
    time_pred: float
    time_meas: float
    mem_pred: float
    mem_meas: float
    comm: dict  # kind -> (predicted, hlo) bytes
    flop: tuple | None  # (predicted, hlo, comparable) contraction flop

    @property
    def time_err(self) -> float:
        return self.time_pred / self.time_meas - 1

    @property
    def mem_err(self) -> float:
        return self.mem_pred / self.mem_meas - 1 if self.mem_meas else float("nan")


def read_runs(path: str | Path) -> list[dict]:
    runs = []
    for i, line in enumerate(Path(path).read_text().splitlines(), 1):
        if line.strip():
            try:
                runs.append(json.loads(line))
            except json.JSONDecodeError as e:
                raise ValueError(f"{path}:{i}: not a JSON line ({e})") from None
    if not runs:
        raise ValueError(f"{path}: no recorded runs")
    return runs


def compare(runs: list[dict], hw: Hardware) -> list[Row]:
    rows = []
    for rec in runs:
        w, s = run_to_case(rec)
        key = gpu_key(rec.get("device", ""))
        h = hw
        if key and (hw.calibration is None or gpu_key(hw.calibration.device) != key):
            h = Hardware.make(key, hw.gpus_per_node, hw.inter_node_gbps)  # the run's GPU, uncalibrated
        backend = CPU if rec.get("device", "").lower() == "cpu" else GPU  # XLA's CPU backend stores bf16 as f32
        p = predict(w, s, h, backend)
        colls = _comm.by_kind(p.collectives)
        hlo = rec.get("hlo_collectives")
        comm = {k: (colls.get(k, 0.0), hlo.get(k, {}).get("bytes", 0.0)) for k in set(colls) | set(hlo)
                if colls.get(k) or hlo.get(k, {}).get("bytes")} if hlo is not None else {}
        flop = None
        if rec.get("hlo_classes"):
            pred_flop = sum(g.flop for g in step_gemms(w, s) if not attention_in_kernel(g, s))
            flop = (pred_flop, rec["hlo_classes"]["contraction"]["flop"],
                    rec.get("hlo_count_version", 1) >= FLOP_COUNT_VERSION)
        rows.append(Row(f"{rec['config']} S={rec['seq_len']} B={rec['batch_size']} {s.label()}",
                        rec.get("device", "?"), p.step_time_s, rec["ms_per_step"] / 1e3, p.memory.total,
                        rec.get("peak_memory_gib", 0.0) * 2**30, comm, flop))
    return rows


def summary(errors: list[float]) -> tuple[float, float]:
    errors = [abs(e) for e in errors if math.isfinite(e)]
    return (sum(errors) / len(errors), max(errors)) if errors else (float("nan"), float("nan"))


def plot(rows: list[Row], path: str) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(10, 4.5))
    for ax, pred, meas, unit, scale in ((axes[0], "time_pred", "time_meas", "ms per step", 1e3),
                                        (axes[1], "mem_pred", "mem_meas", "GiB per GPU (peak)", 2**-30)):
        xs = [getattr(r, meas) * scale for r in rows]
        ys = [getattr(r, pred) * scale for r in rows]
        top = max(xs + ys) * 1.1
        ax.plot([0, top], [0, top], color="gray", lw=1)
        ax.fill_between([0, top], [0, top * 0.9], [0, top * 1.1], color="gray", alpha=0.15, label="±10%")
        ax.scatter(xs, ys, s=18)
        ax.set_xlabel(f"measured {unit}")
        ax.set_ylabel(f"predicted {unit}")
        ax.set_xlim(0, top)
        ax.set_ylim(0, top)
        ax.legend(loc="upper left")
    mt, xt = summary([r.time_err for r in rows])
    mm, xm = summary([r.mem_err for r in rows])
    axes[0].set_title(f"step time: mean {mt * 100:.1f}%, max {xt * 100:.1f}% error")
    axes[1].set_title(f"memory: mean {mm * 100:.1f}%, max {xm * 100:.1f}% error")
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def validate(path: str, hw: Hardware, plot_path: str | None = None, as_json: bool = False, out=None) -> int:
    out = out or sys.stdout
    rows = compare(read_runs(path), hw)
    mt, xt = summary([r.time_err for r in rows])
    mm, xm = summary([r.mem_err for r in rows])
    if as_json:
        print(json.dumps(dict(runs=[dict(dataclasses.asdict(r), time_err=r.time_err, mem_err=r.mem_err)
                                    for r in rows],
                              time_error=dict(mean=mt, max=xt), memory_error=dict(mean=mm, max=xm))), file=out)
    else:
        print(f"{'run':<58}{'ms pred':>9}{'ms meas':>9}{'err':>8}{'GiB pred':>10}{'GiB meas':>10}{'err':>8}",
              file=out)
        stale = 0
        for r in rows:
            print(f"{r.label[:57]:<58}{r.time_pred * 1e3:>9.2f}{r.time_meas * 1e3:>9.2f}{r.time_err * 100:>7.1f}%"
                  f"{r.mem_pred / 2**30:>10.2f}{r.mem_meas / 2**30:>10.2f}{r.mem_err * 100:>7.1f}%", file=out)
            for kind, (pb, hb) in sorted(r.comm.items()):
                print(f"    {kind:<20} predicted {pb / 1e9:9.3f} GB, compiled {hb / 1e9:9.3f} GB", file=out)
            if r.flop and r.flop[2]:
                print(f"    contraction flop     predicted {r.flop[0] / 1e12:9.3f} TF, compiled {r.flop[1] / 1e12:9.3f}"
                      f" TF", file=out)
            elif r.flop:
                stale += 1
        if stale:
            print(f"({stale} runs' recorded contraction flop not compared: counted before hlo_analysis counted a GEMM "
                  f"fused with its weight slice at 2mnk flop, about half the true flop of the layer loop)", file=out)
        print(f"step time error: mean {mt * 100:.1f}%, max {xt * 100:.1f}% ({len(rows)} runs); memory error: mean "
              f"{mm * 100:.1f}%, max {xm * 100:.1f}%", file=out)
    if plot_path:
        plot(rows, plot_path)
        print(f"wrote {plot_path}", file=sys.stderr)
    return 0
