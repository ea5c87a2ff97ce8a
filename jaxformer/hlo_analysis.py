"""Flop and bytes per operator class from the text of XLA's *optimized* HLO (after fusion); the report and its
command line are in `jaxformer.hlo_report`.

Every operator that XLA will launch (a top-level instruction of the entry computation, of `call`s, and of while
bodies times their trip count) is put into one of Ivanov et al.'s classes (DESIGN.md): tensor `contraction`,
statistical `normalization`, `elementwise`, plus `collective` and `other` (layout copies, transposes, slices).
Its bytes are what it reads and writes in device memory: a fusion counts only its own operands and results, since
its intermediates stay on chip. Its flop are 2*M*N*K for dots (also inside fusions), one per output element of an
element-wise op and one per input element of a reduce. The parser is `analyze(hlo_text)`, a pure function.
"""

from __future__ import annotations

import dataclasses
import math
import re

# Bumped when a class's flop or byte count changes: 2 counts a GEMM fused with its weight slice at 2mnk flop (1
# counted its output's elements); `benchmarks/train_step.py --record` stores it with the counts
COUNT_VERSION = 2
CLASSES = ("contraction", "normalization", "elementwise", "collective", "other")
COLLECTIVES = ("all-reduce", "all-gather", "reduce-scatter", "all-to-all", "collective-permute")
DTYPE_BYTES = {"pred": 1, "s4": 0.5, "u4": 0.5, "s8": 1, "u8": 1, "s16": 2, "u16": 2, "f16": 2, "bf16": 2,
               "s32": 4, "u32": 4, "f32": 4, "s64": 8, "u64": 8, "f64": 8, "c64": 8, "c128": 16}
# Instructions that move no bytes: they only name or regroup buffers (or their cost lives in called computations).
FREE = {"parameter", "constant", "tuple", "get-tuple-element", "bitcast", "after-all", "partition-id", "replica-id",
        "opt-barrier", "add-dependency", "while", "call", "conditional", "domain"}
# Data-layout operators: they move bytes but do no arithmetic; alone (or fused only with each other) they are `other`.
LAYOUT = {"copy", "transpose", "reshape", "broadcast", "slice", "dynamic-slice", "dynamic-update-slice",
          "concatenate", "pad", "reverse", "gather", "scatter", "copy-start", "copy-done", "bitcast",
          "parameter", "constant", "tuple", "get-tuple-element", "iota", "bitcast-convert"}
NORM_OPS = {"reduce", "reduce-window", "reduce-precision", "sort", "select-and-scatter"}
# Keywords in a custom call's name (Pallas/Triton kernels) -> class.
NORM_WORDS = ("layernorm", "layer_norm", "softmax", "bdrln", "attention", "flash", "norm", "lse")
ELEMENTWISE_WORDS = ("gelu", "bias", "dropout", "relu")
SHAPE_RE = re.compile(r"\b([a-z]+\d*(?:e\d+m\d+\w*)?)\[([^\]]*)\]")
INSTR_RE = re.compile(r"^\s*(?:ROOT\s+)?%?([\w.\-]+)\s*=\s*(.*)$")
HEADER_RE = re.compile(r"^(ENTRY\s+)?%?([\w.\-]+)\s*\(.*\{\s*$")


@dataclasses.dataclass
class Instr:
    """`type` is the result type's text ("f32[8,128]{1,0}", "(f32[2], s32[])"); `attrs` all after the operands."""
    name: str
    type: str
    opcode: str
    operands: list[str]
    attrs: str
    root: bool = False


@dataclasses.dataclass
class Op:
    """One launched operator; `trips` is how often it runs per step (bytes and flop are already multiplied)."""
    name: str
    opcode: str
    cls: str
    bytes: float
    flop: float
    shape: str
    trips: int = 1
    kind: str = ""  # collective kind, or custom-call target
    time_s: float | None = None  # measured seconds per step (`Report.attach_times`, from a profiler trace)


@dataclasses.dataclass
class Report:
    ops: list[Op]
    notes: list[str]
    # name of every instruction nested in a launched operator (fused, wrapped by an async start, called) -> the
    # launched operator's name: a profiler may annotate a kernel with the inner name
    inner: dict[str, str] = dataclasses.field(default_factory=dict)

    def classes(self) -> dict:
        """{class: {count (launches per step), flop, bytes}}, plus `time_s` (measured seconds per step) once
        `attach_times` has joined a profile."""
        timed = self.timed
        out = {c: dict(count=0, flop=0.0, bytes=0.0, **({"time_s": 0.0} if timed else {})) for c in CLASSES}
        for op in self.ops:
            c = out[op.cls]
            c.update(count=c["count"] + op.trips, flop=c["flop"] + op.flop, bytes=c["bytes"] + op.bytes)
            if timed:
                c["time_s"] += op.time_s or 0.0
        return out

    def attach_times(self, times_ns: dict[str, float], steps: int) -> float:
        """Join measured device time per HLO instruction name (summed over `steps` profiled steps) to the operators;
        returns the seconds per step that matched no operator of this module (reported in the notes)."""
        names = {op.name for op in self.ops}
        per_op: dict[str, float] = {}
        unmatched: dict[str, float] = {}
        for name, t in times_ns.items():
            # XLA names kernels after instructions; kernel names use "_" where instruction names have "."
            alt = re.sub(r"_(\d+)$", r".\1", name)
            target = next((n for n in (name, self.inner.get(name), alt, self.inner.get(alt)) if n in names), None)
            if target is None:
                unmatched[name] = t
            else:
                per_op[target] = per_op.get(target, 0.0) + t
        for op in self.ops:
            op.time_s = per_op.get(op.name, 0.0) / steps / 1e9
        lost = sum(unmatched.values()) / steps / 1e9
        total = sum(times_ns.values()) / steps / 1e9
        worst = sorted(unmatched.items(), key=lambda x: -x[1])[:8]
        self.notes.append(f"profile: {total * 1e3:.3f} ms of device time per step, {lost * 1e3:.3f} ms of it in "
                          f"operators not found in this module (not in the class table)"
                          + "".join(f"; {n} {t / steps / 1e6:.3f} ms" for n, t in worst))
        return lost

    def collectives(self) -> dict:
        """{kind: {count, bytes}}; bytes are operands + results, like every other operator's."""
        out = {k: dict(count=0, bytes=0.0) for k in COLLECTIVES}
        for op in (o for o in self.ops if o.cls == "collective" and o.kind in out):
            out[op.kind].update(count=out[op.kind]["count"] + op.trips, bytes=out[op.kind]["bytes"] + op.bytes)
        return out

    def to_json(self, top: int = 15) -> dict:
        classes = self.classes()
        timed = {"total_time_s": sum(c["time_s"] for c in classes.values())} if "time_s" in classes["other"] else {}
        return dict(classes=classes, collectives=self.collectives(),
                    total_bytes=sum(c["bytes"] for c in classes.values()),
                    total_flop=sum(c["flop"] for c in classes.values()), **timed,
                    top=[dataclasses.asdict(op) for op in self.top(top)], notes=self.notes)

    def launches(self, in_loops: bool | None = None) -> int:
        """Operators that launch work per step (trip-weighted): not the instructions that only name or regroup
        buffers (`FREE`) nor the waits that end an asynchronous operator (`*-done`). `in_loops`: only those inside
        while loops (True: run more than once per step) or only those outside them (False)."""
        return sum(op.trips for op in self.ops if op.opcode not in FREE and not op.opcode.endswith("-done")
                   and (in_loops is None or (op.trips > 1) == in_loops))

    @property
    def timed(self) -> bool:
        return any(op.time_s is not None for op in self.ops)

    def top(self, n: int) -> list[Op]:
        """The `n` operators that take the most measured time per step (by bytes without a profile)."""
        return sorted(self.ops, key=(lambda o: -o.time_s) if self.timed else (lambda o: -o.bytes))[:n]


# ----------------------------------------------------------------------------------------------- parsing
def _close(text: str, start: int) -> int:
    """Index just past the parenthesis that closes the one at `start`."""
    depth = 0
    for i in range(start, len(text)):
        depth += (text[i] == "(") - (text[i] == ")")
        if depth == 0:
            return i + 1
    return len(text)


def _parse_instr(line: str) -> Instr | None:
    m = INSTR_RE.match(line)
    if not m:
        return None
    name, rest = m.group(1), m.group(2)
    if rest.startswith("("):  # tuple result type
        end = _close(rest, 0)
    else:
        end = rest.index(" ") if " " in rest else len(rest)
    type_, rest = rest[:end], rest[end:].lstrip()
    om = re.match(r"([\w\-$]+)\(", rest)
    if not om:
        return None
    close = _close(rest, om.end() - 1)
    operands = []
    for tok in _split_top(rest[om.end():close - 1]):
        # older XLA prints "f32[2]{0} %x", newer just "%x"; wide instructions mark every fifth one "/*index=N*/%x"
        tok = re.sub(r"/\*.*?\*/", "", tok).strip().split(" ")[-1].lstrip("%")
        if tok:
            operands.append(tok)
    opcode = om.group(1)
    if opcode == "fusion-start":  # an asynchronously launched fusion (GPU): costs what the fusion costs
        opcode, type_ = "fusion", (_split_top(type_[1:-1])[1].strip() if type_.startswith("(") else type_)
    return Instr(name, type_, opcode, operands, rest[close:], line.lstrip().startswith("ROOT "))


def _split_top(text: str) -> list[str]:
    parts, depth, cur = [], 0, []
    for ch in text:
        depth += ch in "({[" and 1 or (ch in ")}]" and -1 or 0)
        if ch == "," and depth == 0:
            parts.append("".join(cur))
            cur = []
        else:
            cur.append(ch)
    parts.append("".join(cur))
    return parts


def parse_module(text: str) -> tuple[dict[str, list[Instr]], str | None]:
    """{computation name: instructions} and the entry computation's name."""
    comps: dict[str, list[Instr]] = {}
    entry, current = None, None
    for line in text.splitlines():
        if current is None:
            m = HEADER_RE.match(line)
            if m:
                current = m.group(2)
                comps[current] = []
                entry = current if m.group(1) else entry
        elif line.strip() == "}":
            current = None
        else:
            ins = _parse_instr(line)
            if ins is not None:
                comps[current].append(ins)
    return comps, entry


def shapes(type_: str) -> list[tuple[str, tuple[int, ...]]]:
    out = []
    for dt, dims in SHAPE_RE.findall(type_):
        if dt in DTYPE_BYTES:
            out.append((dt, tuple(int(d.replace("<=", "")) for d in dims.split(",") if d.strip())))
    return out


def nbytes(type_: str) -> float:
    return sum(DTYPE_BYTES[dt] * math.prod(d) for dt, d in shapes(type_))


def nelems(type_: str) -> int:
    s = shapes(type_)
    return math.prod(s[0][1]) if s else 0


def _attr(attrs: str, key: str) -> str | None:
    m = re.search(rf"\b{key}=\"?%?([\w.\-$]+)", attrs)
    return m.group(1) if m else None


def _dims(attrs: str, key: str) -> list[int]:
    m = re.search(rf"\b{key}=\{{([\d,]*)\}}", attrs)
    return [int(d) for d in m.group(1).split(",") if d] if m else []


# ----------------------------------------------------------------------------------------------- counting
def _is_gemm(target: str) -> bool:
    """Whether a custom call's target (or several, joined) is a GEMM library call (cuBLAS, cuBLASLt)."""
    return any(w in target.lower() for w in ("cublas", "gemm", "matmul"))


class _Analyzer:
    def __init__(self, text: str):
        self.comps, self.entry = parse_module(text)
        self.types = {c: {i.name: i.type for i in body} for c, body in self.comps.items()}
        self.ops: list[Op] = []
        self.notes: list[str] = []
        self.inner: dict[str, str] = {}
        self.inner_names: set[str] = set()

    def dot_flop(self, ins: Instr, comp: str) -> float:
        lhs = shapes(self.types[comp].get(ins.operands[0], ""))
        out = nelems(ins.type)
        if ins.opcode == "convolution":  # 2 * outputs * (kernel elements per output feature)
            rhs = shapes(self.types[comp].get(ins.operands[1], ""))
            m = re.search(r"dim_labels=\w+_(\w+)->", ins.attrs)
            if not (rhs and m and "o" in m.group(1)):
                return 2.0 * out
            dims = rhs[0][1]
            return 2.0 * out * math.prod(dims) / dims[m.group(1).index("o")]
        if ins.opcode == "custom-call":  # cuBLAS: dimension numbers live in backend_config; result is element 0
            m = re.search(r'lhs_contracting_dimensions\\?"\s*:\s*\[([^\]]*)\]', ins.attrs)
            contracting = [int(x) for x in re.findall(r"\d+", m.group(1))] if m else []
        else:
            contracting = _dims(ins.attrs, "lhs_contracting_dims")
        k = math.prod(lhs[0][1][d] for d in contracting) if lhs else 1
        return 2.0 * out * k

    def body_cost(self, comp: str) -> tuple[set[str], float]:
        """Opcodes (recursively through nested fusions) and flop of a fused computation."""
        ops, flop = set(), 0.0
        for ins in self.comps.get(comp, []):
            ops.add(ins.opcode)
            target = (_attr(ins.attrs, "custom_call_target") or "") if ins.opcode == "custom-call" else ""
            if ins.opcode in ("dot", "convolution") or _is_gemm(target):
                # a GEMM call inside a fusion (cuBLAS on a dynamic slice of the stacked weights) is a contraction
                flop += self.dot_flop(ins, comp)
            elif ins.opcode in ("reduce", "reduce-window"):
                flop += nelems(self.types[comp].get(ins.operands[0], ""))
            elif ins.opcode == "fusion":
                inner_ops, inner_flop = self.body_cost(_attr(ins.attrs, "calls") or "")
                ops |= inner_ops
                flop += inner_flop
            elif ins.opcode not in LAYOUT and ins.opcode not in FREE:
                flop += nelems(ins.type)
            if ins.opcode == "custom-call":
                ops.add("custom-call:" + (_attr(ins.attrs, "custom_call_target") or "").strip('"'))
        return ops, flop

    def fusion_bytes(self, ins: Instr, comp: str) -> float:
        """Operands + results, except that a parameter read only through (dynamic-)slices costs the slices, and a
        dynamic-update-slice result updated in place costs the update (as XLA's own cost analysis does)."""
        body = self.comps.get(_attr(ins.attrs, "calls") or "", [])
        by_name = {i.name: i for i in body}
        # a parameter instruction's "operand" is its number: parameter(0)
        params = {i.name: int(i.operands[0]) for i in body if i.opcode == "parameter"}
        users: dict[str, list[Instr]] = {}
        for i in body:
            for o in i.operands:
                users.setdefault(o, []).append(i)
        def through_bitcasts(name: str) -> list[tuple[str, Instr]]:
            """(the name it uses, user) pairs of `name`'s users, looking through bitcasts (free re-views)."""
            out = []
            for u in users.get(name, []):
                out += through_bitcasts(u.name) if u.opcode == "bitcast" else [(name, u)]
            return out

        read = {}
        for pname, idx in params.items():
            if idx >= len(ins.operands):
                continue
            full = nbytes(self.types[comp].get(ins.operands[idx], ""))
            us = through_bitcasts(pname)
            if us and all(u.opcode in ("slice", "dynamic-slice") for _, u in us):
                full = min(full, sum(nbytes(u.type) for _, u in us))
            elif us and all(u.opcode == "dynamic-update-slice" and u.operands[0] == n for n, u in us):
                full = 0.0  # aliased in place with the output
            read[ins.operands[idx]] = max(read.get(ins.operands[idx], 0.0), full)
        if not body:
            return sum(read.values()) + nbytes(ins.type)
        root = next((i for i in body if i.root), body[-1])
        roots = [by_name[o] for o in root.operands if o in by_name] if root.opcode == "tuple" else [root]
        written = sum(nbytes(by_name[r.operands[1]].type) if r.opcode == "dynamic-update-slice"
                      and r.operands[1] in by_name else nbytes(r.type) for r in roots)
        return sum(read.values()) + written

    def classify(self, ins: Instr, comp: str) -> tuple[str, float, str]:
        """(class, flop, kind) of one top-level instruction."""
        op = ins.opcode
        base = op[:-6] if op.endswith("-start") else op
        if base in COLLECTIVES:
            return "collective", 0.0, base
        if op == "async-start":  # a wrapped collective (GPU): the kind is the called computation's root
            called_name = _attr(ins.attrs, "calls") or ""
            called = self.comps.get(called_name, [])
            kind = called[-1].opcode if called else "async"
            if kind == "fusion":  # a wrapped fusion (e.g. a dynamic-slice fusion): classify what it computes
                return self.classify(called[-1], called_name)
            return ("collective" if kind in COLLECTIVES else "other"), 0.0, kind
        if op in ("dot", "convolution"):
            return "contraction", self.dot_flop(ins, comp), ""
        if op == "custom-call":
            target = (_attr(ins.attrs, "custom_call_target") or "").strip('"')
            # what it computes: its target, name and the jax op_name (not backend_config: a Triton call carries its
            # compiled IR there, whose bytes would match any keyword)
            op_name = re.search(r'op_name="([^"]*)"', ins.attrs)
            label = (target + " " + ins.name + " " + (op_name.group(1) if op_name else "")).lower()
            if _is_gemm(target):
                return "contraction", self.dot_flop(ins, comp), target
            if "cudnn" in target and "conv" in target:
                return "contraction", 0.0, target
            if any(w in label for w in NORM_WORDS):
                return "normalization", 0.0, target
            if any(w in label for w in ELEMENTWISE_WORDS):
                return "elementwise", 0.0, target
            return "other", 0.0, target
        if op == "fusion":
            called_name = _attr(ins.attrs, "calls") or ""
            ops, flop = self.body_cost(called_name)
            targets = " ".join(o for o in ops if o.startswith("custom-call:")).lower()
            if ops & {"dot", "convolution"} or _is_gemm(targets):
                return "contraction", flop, ""
            # A kernel fused with the slicing of its operands (a Pallas call on one layer's slice of the stacked
            # weights: XLA's dynamic-slice fusion) is what the kernel computes, not elementwise work.
            kernel = next((i for i in self.comps.get(called_name, []) if i.opcode == "custom-call"), None)
            if kernel is not None:
                return self.classify(kernel, called_name)
            if ops & NORM_OPS or any(w in targets for w in NORM_WORDS):
                return "normalization", flop, ""
            if ops - LAYOUT - FREE:
                return "elementwise", flop, ""
            return "other", flop, ""
        if op in NORM_OPS:
            return "normalization", float(nelems(self.types[comp].get(ins.operands[0], ""))), ""
        if op in LAYOUT or op in FREE or op.endswith("-done") or op.startswith("async-") \
                or op in ("send", "recv", "infeed", "outfeed", "rng-get-and-update-state"):
            return "other", 0.0, ""
        return "elementwise", float(nelems(ins.type)), ""

    def trip_count(self, ins: Instr) -> int | None:
        m = re.search(r'known_trip_count\\?"\s*:\s*\{\s*\\?"n\\?"\s*:\s*\\?"(\d+)', ins.attrs)
        if m:
            return int(m.group(1))
        # Fallback: a condition `i < constant` with one integer scalar constant (the scan's length).
        cond = self.comps.get(_attr(ins.attrs, "condition") or "", [])
        consts = [int(i.operands[0]) for i in cond if i.opcode == "constant" and re.match(r"[su]\d+\[\]", i.type)
                  and i.operands and i.operands[0].lstrip("-").isdigit()]
        lt = any(i.opcode == "compare" and "direction=LT" in i.attrs for i in cond)
        if lt and len(consts) == 1:
            self.notes.append(f"{ins.name}: trip count {consts[0]} read from its loop condition")
            return consts[0]
        return None

    def nested_names(self, ins: Instr, seen: set | None = None) -> set[str]:
        """Names of every instruction in the computations `ins` calls, recursively."""
        seen = set() if seen is None else seen
        for m in re.finditer(r"\b(?:calls|to_apply|called_computations)=\{?([%\w.\-$, ]+)\}?", ins.attrs):
            for comp in (c.strip().lstrip("%") for c in m.group(1).split(",")):
                if comp in self.comps and comp not in seen:
                    seen.add(comp)
                    for inner in self.comps[comp]:
                        self.inner_names.add(inner.name)
                        self.nested_names(inner, seen)
        return seen

    def walk(self, comp: str, trips: int) -> None:
        for ins in self.comps.get(comp, []):
            if ins.opcode == "while":
                n = self.trip_count(ins)
                if n is None:
                    self.notes.append(f"{ins.name}: trip count unknown, its body is counted once")
                self.walk(_attr(ins.attrs, "body") or "", trips * (n or 1))
                continue
            if ins.opcode == "call":
                self.walk(_attr(ins.attrs, "to_apply") or "", trips)
                continue
            if ins.opcode == "conditional":
                self.notes.append(f"{ins.name}: conditional branches are not counted")
            cls, flop, kind = self.classify(ins, comp)
            if ins.opcode in FREE or ins.opcode.endswith("-done") or ins.opcode in ("async-update",):
                b = 0.0
            elif ins.opcode in ("fusion", "async-start"):
                b = self.fusion_bytes(ins, comp)
            elif ins.opcode == "dynamic-update-slice":  # in place: read and write the update only
                b = 2 * nbytes(self.types[comp].get(ins.operands[1], ""))
            else:
                ins_bytes = sum(nbytes(self.types[comp].get(o, "")) for o in dict.fromkeys(ins.operands))
                out = shapes(ins.type)
                if cls == "contraction" and ins.opcode == "custom-call":
                    out = out[:1]  # cuBLAS/cuDNN: (result, scratch workspace); the workspace is not data
                b = ins_bytes + sum(DTYPE_BYTES[d] * math.prod(s) for d, s in out)
            self.inner_names = set()
            self.nested_names(ins)
            self.inner.update({n: ins.name for n in self.inner_names})
            self.ops.append(Op(ins.name, ins.opcode, cls, b * trips, flop * trips, ins.type.split("{")[0]
                               if not ins.type.startswith("(") else ins.type[:60], trips, kind))


def analyze(hlo_text: str) -> Report:
    """The report of an optimized HLO module's text (`jax.jit(f).lower(...).compile().as_text()`)."""
    a = _Analyzer(hlo_text)
    if a.entry is None:
        raise ValueError("no ENTRY computation in the HLO text")
    a.walk(a.entry, 1)
    return Report(a.ops, a.notes, a.inner)
