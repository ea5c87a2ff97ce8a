"""Session 14: what XLA made of the layer loop's 24-way gradient concatenates (2.05 ms of BERT-large's S=128 step,
session 13 run 6). Reads the compiled step's HLO text (train_step.py --dump-hlo) with `jaxformer.hlo_analysis` and
prints the five largest concatenates of at least N operands: for one inside a fusion, the fusion's call site, the
entry-computation definitions of its first operands and the fused computation's instructions.

    PYTHONPATH=. python benchmarks/gpu_scripts/session14/concat_hlo.py step.hlo.txt [N=20]

(Run 2's `logs/run2/concat_fusions.txt` came from this script's first version, which parsed the HLO itself; this one
uses the project's parser and prints the same concatenates, call sites and operands, in a shorter format.)
"""
import re
import sys

from jaxformer.hlo_analysis import nelems, parse_module

comps, entry = parse_module(open(sys.argv[1]).read())
n_min = int(sys.argv[2]) if len(sys.argv) > 2 else 20
defs = {ins.name: ins for ins in comps[entry]}
callers = {m.group(1): ins for ins in comps[entry] if (m := re.search(r"calls=%?([\w.\-]+)", ins.attrs))}
found = [(comp, ins) for comp, body in comps.items() for ins in body
         if ins.opcode == "concatenate" and len(ins.operands) >= n_min]
for comp, ins in sorted(found, key=lambda f: -nelems(f[1].type))[:5]:
    print(f"=== in {comp} ({len(comps[comp])} instructions)")
    print(f"  CONCAT {ins.name} = {ins.type} concatenate({len(ins.operands)} operands)")
    if comp == entry:
        shown = ins.operands
    else:
        call = callers.get(comp)
        shown = call.operands if call else []
        if call:
            print(f"  CALL {call.name} = {call.type} {call.opcode}({len(call.operands)} operands)")
    for op in shown[:2]:
        d = defs.get(op)
        print(f"  OPERAND {op}" + (f" = {d.type} {d.opcode}({', '.join(d.operands)}) {d.attrs[:200]}" if d else ""))
    if comp != entry:
        for f in comps[comp]:
            if f.opcode != "parameter":
                print(f"    {f.name} = {f.type} {f.opcode}({', '.join(f.operands)[:150]})")
