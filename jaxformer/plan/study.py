"""Lu et al.'s findings (arXiv 2407.02081) reproduced with the model: `python -m jaxformer.plan.study --out DIR`
writes the plots of benchmarks/results/perfmodel.md ("Findings") to DIR and prints their tables.

1. Pipeline vs data parallelism for BERT-base, BERT-large and a ~3B-parameter encoder, 2 to 1024 H100s, on 25,
   100 and 400 Gb/s node links (weak scaling: 32 sequences of 128 tokens per GPU).
2. The memory of a poor pipeline partition (Megatron-style stages, 1F1B).
3. Message size: effective collective bandwidth by message size, gradient bucket size, microbatch size.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from ..config import BertConfig
from .hardware import Hardware
from .memory import stage_memories
from .predict import predict
from .search import evaluate
from .workload import GPU, Strategy, Workload

MODELS = {
    "BERT-base": BertConfig.preset("base"),
    "BERT-large": BertConfig.preset("large"),
    # ~3.1B parameters: 32 layers of width 2816 (32 heads of 88), F = 4D
    "BERT-3B": BertConfig(hidden_size=2816, num_hidden_layers=32, num_attention_heads=32, intermediate_size=11264),
}
LINKS = (25.0, 100.0, 400.0)  # a node's network, Gb/s
GPUS = tuple(2 ** i for i in range(1, 11))
PER_GPU_BATCH, SEQ = 32, 128


def _best(preds):
    ok = [p for p in preds if p.feasible]
    return min(ok, key=lambda p: p.step_time_s) if ok else None


def families(w: Workload, n: int, hw: Hardware) -> dict:
    """The fastest feasible strategy of each family on `n` GPUs: data parallelism (data x fsdp), and pipelines
    (jaxformer's and Megatron-style) over data x fsdp, remat none or full, 2 or 4 microbatches per stage."""
    L = w.model.num_hidden_layers
    data = [evaluate(w, Strategy(dp=n // f, fsdp=f, remat=r), hw, n)
            for f in (1, n) for r in ("none", "full")]
    out = {"data parallel": _best(data)}
    for style in ("megatron", "jaxformer"):
        cands = []
        for p in (q for q in GPUS if q <= n and L % q == 0):
            rest = n // p
            local = w.global_batch // rest
            for f in {1, rest}:
                for m in (2 * p, 4 * p):
                    if m <= local:
                        for r in ("none", "full"):
                            cands.append(evaluate(w, Strategy(dp=rest // f, fsdp=f, pp=p, microbatches=m, remat=r,
                                                              pipeline_style=style), hw, n))
        out[f"pipeline ({style})"] = _best(cands)
    return out


def scaling(log=print) -> dict:
    """{model: {link: {family: [(gpus, seq/s or None, label)]}}}."""
    res = {}
    for name, cfg in MODELS.items():
        res[name] = {}
        for link in LINKS:
            hw = Hardware.make("h100", 8, link)
            series: dict = {}
            for n in GPUS:
                w = Workload(cfg, SEQ, PER_GPU_BATCH * n)
                for fam, p in families(w, n, hw).items():
                    series.setdefault(fam, []).append((n, p.seq_per_s if p else None, p.strategy.label() if p else ""))
            res[name][link] = series
            log(f"study: {name} at {link:g} Gb/s done")
    return res


def plot_scaling(res: dict, path: Path) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(len(MODELS), len(LINKS), figsize=(13, 10), sharex=True)
    styles = {"data parallel": ("C0", "o"), "pipeline (megatron)": ("C3", "s"), "pipeline (jaxformer)": ("C2", "^")}
    for i, name in enumerate(MODELS):
        for j, link in enumerate(LINKS):
            ax = axes[i][j]
            for fam, pts in res[name][link].items():
                xs = [n for n, v, _ in pts if v]
                ys = [v / n for n, v, _ in pts if v]
                ax.plot(xs, ys, color=styles[fam][0], marker=styles[fam][1], ms=4, label=fam)
            ax.set_xscale("log", base=2)
            ax.set_yscale("log")
            ax.set_title(f"{name}, {link:g} Gb/s per node", fontsize=10)
            if j == 0:
                ax.set_ylabel("sequences/s per GPU")
            if i == len(MODELS) - 1:
                ax.set_xlabel("GPUs (H100, 8 per node)")
            ax.grid(alpha=0.3)
    axes[0][0].legend(fontsize=8)
    fig.suptitle(f"Predicted throughput per GPU, {PER_GPU_BATCH} sequences of {SEQ} tokens per GPU")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def balanced(w: Workload, s: Strategy, layers: list[int]) -> list[int]:
    """A partition whose fullest stage holds the least: move one layer at a time off the fullest stage while
    that lowers the maximum."""
    layers = list(layers)
    while True:
        mem = [m.total for m in stage_memories(w, s, GPU, layers)]
        worst = max(range(len(mem)), key=mem.__getitem__)
        best, best_max = None, max(mem)
        for j in range(len(layers)):
            if j != worst and layers[worst] > 1:
                trial = list(layers)
                trial[worst] -= 1
                trial[j] += 1
                peak = max(m.total for m in stage_memories(w, s, GPU, trial))
                if peak < best_max:
                    best, best_max = trial, peak
        if best is None:
            return layers
        layers = best


def partitions(cfg: BertConfig, p: int, m: int, batch: int, seq: int) -> dict:
    """Per-stage memory (GiB) of Megatron-style partitions of `cfg` over `p` stages under 1F1B: equal layers, the
    partition that minimises the fullest stage, and a poor one that piles layers onto the first stages (which keep
    the most microbatches in flight)."""
    L = cfg.num_hidden_layers
    k = L // p
    even = [k] * p
    poor = [k + 2 if i < p // 2 else k - 2 for i in range(p)]
    w = Workload(cfg, seq, batch)
    s = Strategy(pp=p, microbatches=m, pipeline_style="megatron")
    out = {}
    for name, layers in (("equal layers", even), ("balanced memory", balanced(w, s, even)),
                         ("front-loaded", poor)):
        mems = stage_memories(w, s, GPU, layers)
        out[name] = (layers, [x.total / 2**30 for x in mems])
    return out


def plot_partitions(parts: dict, title: str, path: Path) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(8, 4))
    width = 0.8 / len(parts)
    for i, (name, (layers, gib)) in enumerate(parts.items()):
        xs = [x + i * width for x in range(len(gib))]
        ax.bar(xs, gib, width, label=f"{name} {layers}: max {max(gib):.1f}, sum {sum(gib):.1f} GiB")
    ax.set_xlabel("pipeline stage")
    ax.set_ylabel("GiB per GPU")
    ax.set_title(title, fontsize=10)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def message_sizes(path: Path) -> dict:
    """Effective bus bandwidth of an all-reduce by message size (NVLink inside a node, 64 GPUs across nodes);
    BERT-large's data-parallel step on 64 GPUs by gradient bucket size; a pipeline's step by microbatch count."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    sizes = [2 ** i for i in range(10, 31)]
    res: dict = {"sizes": sizes, "busbw": {}, "buckets": {}, "microbatches": {}}
    fig, axes = plt.subplots(1, 3, figsize=(15, 4))
    for label, n, span, link in (("8 GPUs, NVLink", 8, 8, 400.0), ("64 GPUs, 400 Gb/s", 64, 64, 400.0),
                                 ("64 GPUs, 100 Gb/s", 64, 64, 100.0), ("64 GPUs, 25 Gb/s", 64, 64, 25.0)):
        hw = Hardware.make("h100", 8, link)
        bw = [2 * (n - 1) / n * m / hw.collective_time("all-reduce", m, n, span) / 1e9 for m in sizes]
        res["busbw"][label] = bw
        axes[0].plot(sizes, bw, label=label)
    axes[0].set_xscale("log", base=2)
    axes[0].set_yscale("log")
    axes[0].set_xlabel("all-reduce message (bytes per GPU)")
    axes[0].set_ylabel("bus bandwidth (GB/s)")
    axes[0].legend(fontsize=8)
    axes[0].set_title("alpha-beta: latency dominates below ~1 MB", fontsize=10)

    # data parallelism: the step's gradient bytes sent in buckets of B bytes, each paying its latency
    w = Workload(MODELS["BERT-large"], SEQ, PER_GPU_BATCH * 64)
    buckets = [2 ** i for i in range(14, 31)]
    for link in LINKS:
        hw = Hardware.make("h100", 8, link)
        p = predict(w, Strategy(dp=64), hw)
        grad = sum(c.bytes for c in p.collectives if c.what.startswith("grad"))
        compute = p.compute_s
        times = []
        for bucket in buckets:
            nb = max(1, -(-grad // bucket))
            times.append(compute + nb * hw.collective_time("all-reduce", min(bucket, grad), 64, 64))
        res["buckets"][link] = (grad, times)
        axes[1].plot(buckets, [t * 1e3 for t in times], label=f"{link:g} Gb/s")
    axes[1].set_xscale("log", base=2)
    axes[1].set_xlabel("gradient bucket (bytes)")
    axes[1].set_ylabel("ms per step")
    axes[1].set_title("BERT-large, 64 GPUs data parallel, no overlap", fontsize=10)
    axes[1].legend(fontsize=8)

    # pipelines: more microbatches shrink the bubble, but each tick's GEMMs and messages get smaller
    w = Workload(MODELS["BERT-3B"], SEQ, PER_GPU_BATCH * 64)
    for link in LINKS:
        hw = Hardware.make("h100", 8, link)
        ms, ts = [], []
        for m in (8, 16, 32, 64, 128, 256):
            p = evaluate(w, Strategy(dp=8, pp=8, microbatches=m, pipeline_style="megatron"), hw, 64)
            if p.feasible:
                ms.append(m)
                ts.append(p.step_time_s * 1e3)
        res["microbatches"][link] = list(zip(ms, ts))
        axes[2].plot(ms, ts, marker="o", label=f"{link:g} Gb/s")
    axes[2].set_xscale("log", base=2)
    axes[2].set_xlabel("microbatches per step")
    axes[2].set_ylabel("ms per step")
    axes[2].set_title("BERT-3B, dp=8 x pp=8 (Megatron-style), 64 GPUs", fontsize=10)
    axes[2].legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return res


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m jaxformer.plan.study", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", default="benchmarks/results/perfmodel", help="folder for the PNG plots")
    a = ap.parse_args(argv)
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    log = lambda m: print(m, file=sys.stderr, flush=True)  # noqa: E731

    res = scaling(log)
    plot_scaling(res, out / "scaling.png")
    print("## Pipeline vs data parallelism (predicted seq/s; best strategy of each family)\n")
    for name in MODELS:
        print(f"| {name} | Gb/s | " + " | ".join(f"{n}" for n in GPUS) + " |")
        print("|---|---|" + "---|" * len(GPUS))
        for link in LINKS:
            series = res[name][link]
            for fam, pts in series.items():
                print(f"| {fam} | {link:g} | " + " | ".join(f"{v:.0f}" if v else "—" for _, v, _ in pts) + " |")
        print()
    for name in MODELS:
        for link in LINKS:
            pts = res[name][link]
            print(f"- {name}, {link:g} Gb/s, 1024 GPUs: data {pts['data parallel'][-1][2]!r}, pipeline "
                  f"{pts['pipeline (megatron)'][-1][2]!r}, ours {pts['pipeline (jaxformer)'][-1][2]!r}")
    print()

    print("## Pipeline partitions (GiB per stage, Megatron-style 1F1B)\n")
    for name, p, m, batch, seq in (("BERT-3B", 8, 16, 128, 512), ("BERT-large", 4, 8, 64, 512)):
        parts = partitions(MODELS[name], p, m, batch, seq)
        plot_partitions(parts, f"{name}, {p} stages (Megatron-style, 1F1B), {m} microbatches of {batch // m}, "
                               f"S={seq}", out / f"partition-{name.lower()}.png")
        for pname, (layers, gib) in parts.items():
            print(f"- {name} {pname} {layers}: " + ", ".join(f"{g:.2f}" for g in gib)
                  + f" (max {max(gib):.2f}, sum {sum(gib):.2f})")
    print()

    msg = message_sizes(out / "message-size.png")
    print("## Message size\n")
    for label, bw in msg["busbw"].items():
        at = {m: b for m, b in zip(msg["sizes"], bw)}
        print(f"- all-reduce {label}: " + ", ".join(f"{m // 1024} KiB {at[m]:.1f} GB/s" for m in (2**12, 2**16,
                                                                                               2**20, 2**24, 2**28)))
    for link, (grad, times) in msg["buckets"].items():
        print(f"- BERT-large dp=64 at {link:g} Gb/s ({grad / 1e9:.2f} GB of gradients): 16 KiB buckets "
              f"{times[0] * 1e3:.0f} ms, 1 MiB {times[6] * 1e3:.0f} ms, 64 MiB {times[12] * 1e3:.0f} ms per step")
    for link, pts in msg["microbatches"].items():
        print(f"- BERT-3B dp=8 pp=8 at {link:g} Gb/s: " + ", ".join(f"m={m} {t:.0f} ms" for m, t in pts))
    log(f"study: wrote {out}/scaling.png, partition-*.png, message-size.png")
    return 0


if __name__ == "__main__":
    sys.exit(main())
