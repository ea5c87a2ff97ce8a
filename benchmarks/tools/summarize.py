"""Session 28: floors.py's log as one row per (op, shape, p): the two rounds' range of the shipped operator (its
forward / backward / other kernels), the floor, XLA, and what 85% of the copy probe allows.

    python benchmarks/gpu_scripts/session28/summarize.py logs/run5/floors.txt
"""
import re
import sys
from collections import defaultdict


def mean(rs) -> float:
    """The mean total of one case's rounds."""
    return sum(t for t, _ in rs) / len(rs)


def rng(rs) -> str:
    """The rounds' totals as a range ("30.8" or "39.9-40.0")."""
    return "-".join(sorted({f"{t:.1f}" for t, _ in rs}, key=float))


def parts_mean(rs) -> dict:
    """The rounds' mean forward / backward / other kernel time."""
    return {k: sum(x[k] for _, x in rs) / len(rs) for k in ("fwd", "bwd", "other")}


def main(path):
    lines = open(path).read().splitlines()
    gbs = float(re.search(r"copy probe (\d+) GB/s", lines[0]).group(1))
    runs = defaultdict(list)
    for line in lines[3:]:
        cells = [c.strip() for c in line.strip("|").split("|")]
        if len(cells) < 9:
            continue
        op, shape, p, impl, _, total, _, _, kernels = cells
        parts = {"fwd": 0.0, "bwd": 0.0, "other": 0.0}
        found = [(name, float(us)) for name, us in re.findall(r"([^,]+?) (\d+\.\d+)(?:,|$)", kernels)
                 if "MemcpyD2D" not in name]
        if impl == "floor":  # XLA's names: its forward kernel moves fewer arrays, so it is the shorter one
            parts["fwd"], parts["bwd"] = sorted(us for _, us in found)
        else:
            for name, us in found:
                parts["fwd" if "_fwd" in name else "bwd" if "_bwd" in name else "other"] += us
        runs[(op, shape, p, impl)].append((float(total), parts))
    print(f"copy probe {gbs:.0f} GB/s")
    print("| op | shape | p | shipped (fwd / bwd / other) | floor (fwd / bwd) | XLA | % of copy BW: shipped / floor | "
          "shipped / floor | XLA / shipped, XLA / floor | 85% allows | needed |")
    print("|---|---|---|---|---|---|---|---|---|---|---|")
    for (op, shape, p, impl), rs in runs.items():
        if impl != "auto":
            continue
        r, d = (int(v) for v in shape.split("x"))
        arrays = (8 if float(p) else 7) if op == "bdrln" else 5
        nbytes = arrays * r * d * 2
        allow = nbytes / (0.85 * gbs * 1e3)
        fl = runs[(op, shape, p, "floor")]
        xla = runs[(op, shape, p, "xla")]
        sp, fp = parts_mean(rs), parts_mean(fl)
        print(f"| {op} | {shape} | {p} | {rng(rs)} ({sp['fwd']:.1f} / {sp['bwd']:.1f} / {sp['other']:.1f}) | "
              f"{rng(fl)} ({fp['fwd']:.1f} / {fp['bwd']:.1f}) | {rng(xla)} | "
              f"{100 * nbytes / (mean(rs) * 1e-6) / (gbs * 1e9):.1f}% / "
              f"{100 * nbytes / (mean(fl) * 1e-6) / (gbs * 1e9):.1f}% | {mean(rs) / mean(fl):.2f} | "
              f"{mean(xla) / mean(rs):.2f}x, {mean(xla) / mean(fl):.2f}x | {allow:.1f} | "
              f"{max(0.0, mean(rs) - allow):.1f} |")


if __name__ == "__main__":
    main(sys.argv[1])
