"""Session 14: what XLA made of the layer loop's 24-way gradient concatenates (2.05 ms of BERT-large's S=128 step at
~0.6 TB/s, session 13 run 6). Reads the compiled step's HLO text (train_step.py --dump-hlo) and prints each fusion
whose computation holds a concatenate of 24 operands: its call site, the fused computation's instructions, and the
entry-computation definitions of its first operands (their layouts say whether the concatenate also transposes).

    python benchmarks/gpu_scripts/session14/concat_hlo.py step.hlo.txt
"""
import re
import sys

text = open(sys.argv[1]).read()
comps, name, body = {}, None, []
for line in text.splitlines():
    m = re.match(r"^(?:ENTRY )?%?([\w.\-]+) .*\{$", line)
    if m and not line.startswith(" "):
        name, body = m.group(1), []
        if line.startswith("ENTRY"):
            comps["__entry__"] = body
        comps[name] = body
    elif line.startswith("}"):
        name = None
    elif name:
        body.append(line.strip())
defs = {}
for line in comps["__entry__"]:
    m = re.match(r"^(?:ROOT )?%?([\w.\-]+) = ", line)
    if m:
        defs[m.group(1)] = line
N = int(sys.argv[2]) if len(sys.argv) > 2 else 20  # operands of the concatenates to show


def operands(line):
    return re.findall(r"%([\w.\-]+)", line.split("(", 1)[1].split("), ")[0])


def size(line):
    dims = re.search(r"= \w+\[([\d,]*)\]", line).group(1)
    return eval("*".join(dims.split(",")) or "1")


found = [(cname, lines, ln) for cname, lines in comps.items() if cname == "__entry__" or lines is not comps["__entry__"]
         for ln in lines if " concatenate(" in ln and len(operands(ln.split(" concatenate", 1)[1])) >= N]
shown = 0
for cname, lines, ln in sorted(found, key=lambda f: -size(f[2])):
    if True:
        print(f"=== in {cname} ({len(lines)} instructions)")
        print("  CONCAT", ln[:400])
        if cname != "__entry__":
            calls = [c for c in comps["__entry__"] if re.search(rf"calls=%?{re.escape(cname)}\b", c)]
            for c in calls[:1]:
                print("  CALL", c[:500])
                for op in operands(c.split(" fusion", 1)[1])[:2]:
                    print("  OPERAND", defs.get(op, "?")[:400])
            for f in lines:
                if "parameter(" not in f:
                    print("   ", f[:250])
        else:
            for op in operands(ln.split(" concatenate", 1)[1])[:2]:
                print("  OPERAND", defs.get(op, "?")[:400])
        shown += 1
        if shown >= 5:
            sys.exit()
