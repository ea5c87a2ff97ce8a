"""The global layout choice as a shortest path (Ivanov et al., MLSys 2021, section 5.2).

A `Problem` is a sequence of operators over named tensors. Every tensor has candidate layouts; an operator reads
each input in one layout and writes each output in one layout, at a cost that depends on all of them (measured by
`jaxformer/layout_search.py`; `inf` for a combination the operator cannot run). An operator reads an input in the layout the
tensor is live in, unless `Op.reads` lists the layouts it may read it in: then reading it in another one inserts a
transpose (`Problem.transpose(tensor, src, dst)`, a cost) and the tensor stays live in the new layout.

The graph: node = (operator position, layouts of the tensors live there); an edge = one configuration of the next
operator (its read and write layouts) plus the transposes it needs; a path from the start (one node per layout of
the graph inputs) to the end is one global layout choice, its length the total time. The graph is a DAG layered by
position, so one DP pass per layer finds the shortest path. `ties` pairs a graph output with a graph input that must
end in the same layout (the layer's output is the next layer's input: the scan carry).
"""

from __future__ import annotations

import dataclasses
import itertools
import math
from typing import Callable, Mapping


@dataclasses.dataclass(frozen=True)
class Op:
    """One operator: `inputs` read (in order), `outputs` written; `reads[t]`: the layouts it may read input t in
    (missing: only the layout t is live in, no transpose); `writes[t]`: the layouts it may write t in (missing: all
    of t's candidates)."""

    name: str
    inputs: tuple[str, ...]
    outputs: tuple[str, ...]
    reads: Mapping[str, tuple[str, ...]] = dataclasses.field(default_factory=dict)
    writes: Mapping[str, tuple[str, ...]] = dataclasses.field(default_factory=dict)


@dataclasses.dataclass
class Problem:
    candidates: Mapping[str, tuple[str, ...]]  # tensor -> candidate layouts
    ops: list[Op]
    inputs: tuple[str, ...]  # graph inputs (live at the start, in any candidate layout)
    outputs: tuple[str, ...]  # graph outputs (live at the end)
    cost: Callable[[Op, tuple[str, ...], tuple[str, ...]], float]  # (op, read layouts, write layouts) -> seconds
    transpose: Callable[[str, str, str], float] = lambda t, a, b: math.inf
    ties: Mapping[str, str] = dataclasses.field(default_factory=dict)  # output tensor -> input tensor

    def read_options(self, op: Op, tensor: str, live: str) -> tuple[str, ...]:
        return op.reads.get(tensor, (live,))

    def write_options(self, op: Op, tensor: str) -> tuple[str, ...]:
        return op.writes.get(tensor, self.candidates[tensor])

    def live_after(self) -> list[tuple[str, ...]]:
        """For each position i, the tensors live after operator i (produced so far and needed later)."""
        out = []
        for i in range(len(self.ops)):
            made = set(self.inputs).union(*(op.outputs for op in self.ops[:i + 1]))
            needed = set(self.outputs).union(*(op.inputs for op in self.ops[i + 1:]))
            out.append(tuple(sorted(made & needed)))
        return out


@dataclasses.dataclass
class Choice:
    """One operator's configuration on the chosen path."""

    op: str
    reads: dict[str, str]
    writes: dict[str, str]
    transposes: list[tuple[str, str, str]]  # (tensor, from, to) inserted before the operator
    cost: float  # operator + transposes


@dataclasses.dataclass
class Solution:
    total: float
    inputs: dict[str, str]  # the graph inputs' layouts at the start
    choices: list[Choice]


def _edges(problem: Problem, op: Op, state: dict[str, str]):
    """Every configuration of `op` from live layouts `state`: (reads, writes, transposes, cost)."""
    read_sets = [problem.read_options(op, t, state[t]) for t in op.inputs]
    write_sets = [problem.write_options(op, t) for t in op.outputs]
    for reads in itertools.product(*read_sets):
        trans, t_cost, seen = [], 0.0, {}
        for t, r in zip(op.inputs, reads):
            if seen.setdefault(t, r) != r:  # the same tensor read twice must be read in one layout
                break
            if r != state[t] and (t, state[t], r) not in trans:
                trans.append((t, state[t], r))
                t_cost += problem.transpose(t, state[t], r)
        else:
            for writes in itertools.product(*write_sets):
                c = problem.cost(op, reads, writes) + t_cost
                if c < math.inf:
                    yield reads, writes, trans, c


def solve(problem: Problem) -> Solution:
    """The cheapest global choice (DP over the layered DAG); ValueError when no choice is feasible."""
    live = problem.live_after()
    best: Solution | None = None
    for start in itertools.product(*(problem.candidates[t] for t in problem.inputs)):
        init = dict(zip(problem.inputs, start))
        # layer: key = sorted live (tensor, layout) pairs -> (cost, previous key, Choice)
        layer = {tuple(sorted(init.items())): (0.0, None, None)}
        history = []
        for op, live_next in zip(problem.ops, live):
            nxt = {}
            for key, (c0, _, _) in layer.items():
                state = dict(key)
                for reads, writes, trans, c in _edges(problem, op, state):
                    after = dict(state)
                    after.update(zip(op.inputs, reads))
                    after.update(zip(op.outputs, writes))
                    new_key = tuple(sorted((t, after[t]) for t in live_next))
                    total = c0 + c
                    if new_key not in nxt or total < nxt[new_key][0]:
                        choice = Choice(op.name, dict(zip(op.inputs, reads)), dict(zip(op.outputs, writes)),
                                        trans, c)
                        nxt[new_key] = (total, key, choice)
            history.append(nxt)
            layer = nxt
        finals = [(v[0], k) for k, v in layer.items()
                  if all(dict(k)[out] == init[inp] for out, inp in problem.ties.items())]
        if not finals:
            continue
        total, key = min(finals)
        if best is None or total < best.total:
            choices = []
            for nxt in reversed(history):
                _, prev, choice = nxt[key]
                choices.append(choice)
                key = prev
            best = Solution(total, init, choices[::-1])
    if best is None:
        raise ValueError("no feasible layout choice: every path has an infinite cost or breaks a tie")
    return best


def brute_force(problem: Problem) -> float:
    """The optimum by enumerating every sequence of operator configurations (for tests; exponential)."""
    best = math.inf

    def walk(i, state, init, total):
        nonlocal best
        if i == len(problem.ops):
            if all(state[out] == init[inp] for out, inp in problem.ties.items()):
                best = min(best, total)
            return
        op = problem.ops[i]
        for reads, writes, _, c in _edges(problem, op, state):
            after = dict(state)
            after.update(zip(op.inputs, reads))
            after.update(zip(op.outputs, writes))
            walk(i + 1, after, init, total + c)

    for start in itertools.product(*(problem.candidates[t] for t in problem.inputs)):
        init = dict(zip(problem.inputs, start))
        walk(0, dict(init), init, 0.0)
    return best
