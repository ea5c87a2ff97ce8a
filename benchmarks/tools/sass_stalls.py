r"""Where a kernel stalls, per SASS instruction: reads ncu's per-instruction warp-stall samples and prints the
stall reasons' shares over the kernel, then the instructions with the most samples of one reason (with
`--context` instructions before each). Needs only Python; the CSV comes from Nsight Compute on the GPU machine, e.g.
for BDRLN's Mosaic GPU backward run once by `dump_kernels.py`:

    PYTHONPATH=. ncu --clock-control none -k regex:bdrln_bwd --section SourceCounters -o bwd \
        python benchmarks/tools/dump_kernels.py 0.1 ln_bwd@8192x1024
    ncu -i bwd.ncu-rep --page source --csv --print-source sass > bwd.csv
    python benchmarks/tools/sass_stalls.py bwd.csv [--reason stall_long_sb] [--top 8] [--context 3]
"""
import argparse
import csv


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("csv", help="ncu's source page as CSV (--page source --csv --print-source sass)")
    ap.add_argument("--reason", default="stall_long_sb", help="the stall reason whose top instructions to list")
    ap.add_argument("--top", type=int, default=8, help="instructions listed")
    ap.add_argument("--context", type=int, default=0, help="instructions shown before each listed one")
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
