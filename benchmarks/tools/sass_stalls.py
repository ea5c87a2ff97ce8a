"""Session 26: read ncu's per-instruction stall samples (`ncu -i REP --page source --csv --print-source sass`, the
SourceCounters section): the stall reasons' shares over the kernel, and the instructions with the most samples of
one reason, with a few instructions of context before each.

    python benchmarks/gpu_scripts/session26/sass_stalls.py logs/run2/bwd1024_sass.csv [--reason stall_long_sb] [--top 8]
"""
import argparse
import csv


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("csv")
    ap.add_argument("--reason", default="stall_long_sb")
    ap.add_argument("--top", type=int, default=8)
    ap.add_argument("--context", type=int, default=0)
    a = ap.parse_args()
    rows = list(csv.reader(open(a.csv)))
    hdr = rows[1]
    data = rows[2:]
    ix = {h: i for i, h in enumerate(hdr)}

    def g(r, k):
        try:
            return int(r[ix[k]])
        except (ValueError, IndexError, KeyError):  # a reason this ncu does not report counts 0
            return 0

    total = sum(g(r, "Warp Stall Sampling (All Samples)") for r in data)
    print(f"{len(data)} instructions, {total} samples")
    reasons = [h for h in hdr if h.startswith("stall_") and "Not Issued" not in h]
    for c, v in sorted(((c, sum(g(r, c) for r in data)) for c in reasons), key=lambda kv: -kv[1])[:8]:
        print(f"  {c:24s} {v:5d} {100 * v / total:5.1f}%")
    print(f"top {a.top} by {a.reason}:")
    top = sorted(range(len(data)), key=lambda i: -g(data[i], a.reason))[:a.top]
    for i in sorted(top):
        for j in range(max(0, i - a.context), i + 1):
            r = data[j]
            print(f"  {j:5d} {r[1].strip()[:64]:64s} all {g(r, 'Warp Stall Sampling (All Samples)'):4d} "
                  f"{a.reason} {g(r, a.reason):4d} executed {g(r, 'Instructions Executed')}")


if __name__ == "__main__":
    main()
