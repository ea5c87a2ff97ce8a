"""`floors.py`'s log as one markdown row per (op, shape, p): the rounds' range of the shipped operator (its
forward / backward / other kernels), the floor, XLA, the speed-ups, and what 85% of the copy probe allows. Needs only
Python.

    python benchmarks/tools/summarize.py floors.txt
"""
import argparse
import re
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


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("log", help="floors.py's output")
    lines = open(ap.parse_args().log).read().splitlines()
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
        if impl == "floor" and len(found) == 2:  # XLA's names: its forward kernel moves fewer arrays (the shorter)
            parts["fwd"], parts["bwd"] = sorted(us for _, us in found)
        elif impl == "floor":
            parts["other"] = sum(us for _, us in found)
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
    main()
