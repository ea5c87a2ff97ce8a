"""Instructions per basic block of `nvdisasm -c` listings (from `dump_sass.sh`): for each .sass file under the
directories given, its total and, for each block of more than `--min` instructions, the count and the opcode
histogram. The main loop is the largest block; divided by the elements each thread handles per step it gives the
instructions per element (benchmarks/results/kernels-h200.md, bias+GELU). Needs only Python.

    python benchmarks/tools/sass_counts.py DIR... [--min 60]
"""
import argparse
import collections
import pathlib
import re

_LABEL = re.compile(r"\.(L_x_\d+):")
_INSTR = re.compile(r"\s*/\*[0-9a-f]{4,}\*/\s+(@!?U?P\w+\s+)?([A-Z][A-Z0-9_.]+)")


def blocks(path):
    """[(label, [opcode, ...]), ...] in listing order (predicates and modifiers dropped)."""
    out, name, cur = [], "entry", []
    for line in open(path):
        if m := _LABEL.match(line.strip()):
            out.append((name, cur))
            name, cur = m.group(1), []
        elif m := _INSTR.match(line):
            cur.append(m.group(2).split(".")[0])
    return out + [(name, cur)]


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("dirs", nargs="+", help="directories holding .sass listings")
    ap.add_argument("--min", type=int, default=60, help="list blocks of more than this many instructions")
    a = ap.parse_args()
    for d in a.dirs:
        for f in sorted(pathlib.Path(d).rglob("*.sass")):
            bs = blocks(f)
            print(f, sum(len(b) for _, b in bs))
            for name, b in bs:
                if len(b) > a.min:
                    top = collections.Counter(b).most_common(16)
                    print(f"  {name} {len(b)} " + " ".join(f"{op}:{n}" for op, n in top))


if __name__ == "__main__":
    main()
