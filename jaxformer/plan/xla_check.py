"""The model against the compiled train step on CPU devices: XLA's memory analysis, the collectives' bytes and the
contraction flop of `Steps(...).train_step.compile(...)`, per strategy (what tests/test_plan.py asserts, and the
table in benchmarks/results/perfmodel.md, "Against the compiled train step").

    python -m jaxformer.plan.xla_check            # every case below, on 8 virtual CPU devices (~10 minutes)

What is compared: XLA's CPU memory analysis gives the step's arguments (the state and the batch), its outputs (they
alias the donated state) and its temporaries (the peak of everything else, after buffer sharing); the model's
total per device is compared with arguments + temporaries + the outputs not aliased. On the CPU XLA stores and
sends bf16 values as float32, so the model runs with its CPU backend (`workload.CPU`).
"""

from __future__ import annotations

import dataclasses
import os
import sys

from ..config import BertConfig
from .comm import by_kind, collectives
from .memory import memory
from .workload import CPU, Strategy, Workload, attention_in_kernel, hlo_counts, step_gemms


def compile_step(cfg: BertConfig, seq: int, batch: int, s: Strategy):
    """The train step of `cfg` on `batch` x `seq` under `s`, compiled from abstract shapes on the first devices."""
    import jax
    from flax import nnx

    from .. import sharding
    from ..config import TrainConfig
    from ..data import synthetic_batch
    from ..model import BertForPreTraining
    from ..compression import make_steps, steady_train_step
    from ..steps import make_optimizer

    compressed = dict(grad_compression="topk-balanced", density=s.density) if s.density is not None else {}
    tc = TrainConfig(config="tiny", seq_len=seq, batch_size=batch, kernels=s.kernels, remat=s.remat,
                     microbatches=s.microbatches, pipeline_repeats=s.repeats, mesh=s.mesh().spec(),
                     sequence_parallel=s.sequence_parallel, **compressed)
    mesh = sharding.make_mesh(sharding.validate(s.mesh(), cfg, tc, s.gpus), jax.devices()[:s.gpus])
    make = lambda: BertForPreTraining(cfg, rngs=nnx.Rngs(params=0, dropout=1))  # noqa: E731
    steps = make_steps(nnx.eval_shape(make), make_optimizer(tc), tc, mesh)
    state = jax.eval_shape(lambda: steps.init_state(make(), 0))
    batch_ = jax.eval_shape(lambda: synthetic_batch(cfg.vocab_size, batch, seq, max(1, round(0.15 * seq))))
    return steady_train_step(steps).compile(state, batch_)


@dataclasses.dataclass
class Check:
    workload: Workload
    strategy: Strategy
    memory_compiled: float
    memory_model: float
    comm_compiled: dict
    comm_model: dict
    flop_compiled: float
    flop_model: float
    hlo: str = dataclasses.field(default="", repr=False)  # the compiled step's HLO text

    @property
    def memory_error(self) -> float:
        return self.memory_model / self.memory_compiled - 1


def check(cfg: BertConfig, seq: int, batch: int, s: Strategy) -> Check:
    """Compile `s` and compare: memory, collective bytes per kind, contraction flop."""
    c = compile_step(cfg.replace(kernels=s.kernels, remat=s.remat), seq, batch, s)
    ma = c.memory_analysis()
    compiled = (ma.argument_size_in_bytes + ma.temp_size_in_bytes + ma.output_size_in_bytes
                - ma.alias_size_in_bytes)
    counts = hlo_counts(c.as_text())
    w = Workload(cfg, seq, batch)
    return Check(w, s, compiled, memory(w, s, CPU).total,
                 {k: v["bytes"] for k, v in counts["collectives"].items()}, by_kind(collectives(w, s, CPU)),
                 counts["classes"]["contraction"]["flop"],
                 sum(g.flop for g in step_gemms(w, s) if not attention_in_kernel(g, s)), c.as_text())


def independent_contractions(hlo: str, kind: str = "all-reduce") -> list[tuple[str, list[str]]]:
    """For each `kind` collective of the entry computation, in schedule order: its result shape and the result
    shapes of the contractions (dots, or fusions that contain one) that neither feed it nor use its result, the
    work it could overlap (tensor parallelism's backward all-reduces and the weight gradients beside them)."""
    import re
    comps, entry, cur = {}, None, None
    for line in hlo.splitlines():
        head = re.match(r"(ENTRY )?%?([\w.\-]+) .*\{$", line)
        if head and not line.startswith(" "):
            cur = head.group(2)
            comps[cur] = []
            entry = cur if head.group(1) else entry
        elif line.startswith("}"):
            cur = None
        elif cur and line.strip():
            comps[cur].append(re.sub(r"/\*.*?\*/", "", line.strip()))

    def contains_dot(name, seen):
        if name in seen or name not in comps:
            return False
        seen.add(name)
        return any(re.search(r"\b(dot|convolution)\(", x) or any(
            contains_dot(c, seen) for c in re.findall(r"calls=%([\w.\-]+)", x)) for x in comps[name])

    instrs = {}  # name -> (shape, opcode, operands, contraction)
    for x in comps[entry]:
        m = re.match(r"(?:ROOT )?%([\w.\-]+) = (.*?) ([\w\-]+)\((.*?)\)(?:, |$)", x)
        if m:
            name, shape, op, args = m.groups()
            dot = op in ("dot", "convolution") or any(contains_dot(c, set())
                                                       for c in re.findall(r"calls=%([\w.\-]+)", x))
            instrs[name] = (shape, op, [o for o in re.findall(r"%([\w.\-]+)", args)], dot)
    users = {n: [] for n in instrs}
    for n, (_, _, ops, _) in instrs.items():
        for o in ops:
            if o in users:
                users[o].append(n)

    def reach(start, step):
        seen, todo = set(), [start]
        while todo:
            for y in step(todo.pop()):
                if y not in seen:
                    seen.add(y)
                    todo.append(y)
        return seen

    out = []
    for n, (shape, op, _, _) in instrs.items():
        if op == kind:
            linked = reach(n, lambda x: [o for o in instrs[x][2] if o in instrs]) | reach(n, users.__getitem__)
            out.append((shape, [s_ for m_, (s_, _, _, d) in instrs.items() if d and m_ != n and m_ not in linked]))
    return out


def _custom(**fields) -> BertConfig:
    return BertConfig(vocab_size=1024, hidden_size=256, num_attention_heads=4, **fields)


T, M = BertConfig.preset("tiny"), BertConfig.preset("mini")
X = dict(kernels="xla")
CASES = [  # (config, seq, batch, strategy)
    (T, 64, 16, Strategy(**X)), (T, 64, 16, Strategy(dp=2, **X)), (T, 64, 16, Strategy(dp=4, **X)),
    (T, 64, 16, Strategy(dp=8, **X)), (T, 64, 16, Strategy(fsdp=2, **X)), (T, 64, 16, Strategy(fsdp=4, **X)),
    (T, 64, 16, Strategy(fsdp=8, **X)), (T, 64, 16, Strategy(tp=2, **X)), (T, 64, 16, Strategy(dp=2, tp=2, **X)),
    (T, 64, 16, Strategy(dp=4, tp=2, **X)), (T, 64, 16, Strategy(tp=2, sequence_parallel=True, **X)),
    (T, 64, 16, Strategy(remat="full", **X)), (T, 64, 16, Strategy(remat="dots", **X)),
    (T, 64, 16, Strategy(pp=2, microbatches=2, **X)), (T, 64, 16, Strategy(pp=2, microbatches=4, **X)),
    (T, 64, 16, Strategy(dp=2, microbatches=2, **X)), (T, 64, 16, Strategy(dp=2, pp=2, microbatches=2, **X)),
    (T, 64, 16, Strategy(dp=2, pp=2, microbatches=2, remat="full", **X)),
    (T, 64, 16, Strategy(tp=2, pp=2, microbatches=2, **X)), (T, 64, 16, Strategy(fsdp=2, pp=2, microbatches=2, **X)),
    (T, 64, 16, Strategy(dp=2, fsdp=2, tp=2, **X)),
    (T, 64, 16, Strategy(dp=4, density=0.01, **X)), (T, 64, 16, Strategy(dp=2, tp=2, density=0.01, **X)),
    (M, 128, 32, Strategy(**X)), (M, 128, 32, Strategy(remat="full", **X)), (M, 128, 32, Strategy(dp=8, **X)),
    (M, 128, 32, Strategy(fsdp=8, **X)), (M, 128, 32, Strategy(tp=4, **X)),
    (M, 128, 32, Strategy(pp=2, microbatches=4, **X)), (M, 128, 32, Strategy(pp=4, microbatches=4, **X)),
    (M, 128, 32, Strategy(pp=2, microbatches=4, repeats=2, **X)),
    (M, 128, 32, Strategy(pp=2, microbatches=4, remat="full", **X)),
    (_custom(num_hidden_layers=2, intermediate_size=1024), 128, 16, Strategy(**X)),
    (_custom(num_hidden_layers=4, intermediate_size=1024), 128, 16, Strategy(**X)),
    (_custom(num_hidden_layers=4, intermediate_size=512), 128, 16, Strategy(**X)),
    (_custom(num_hidden_layers=4, intermediate_size=1024), 64, 32, Strategy(**X)),
]


def _name(cfg: BertConfig) -> str:
    for preset in BertConfig.preset_names():
        if cfg == BertConfig.preset(preset):
            return preset
    return f"L={cfg.num_hidden_layers} D={cfg.hidden_size} F={cfg.intermediate_size} V={cfg.vocab_size}"


def main() -> int:
    os.environ.setdefault("JAXFORMER_AUTOTUNE", "off")
    import jax
    jax.config.update("jax_num_cpu_devices", 8)
    print("| model | S | B | strategy | compiled MB | model MB | error | collectives: model / compiled bytes | "
          "contraction flop: model / compiled |")
    print("|---|---|---|---|---|---|---|---|---|")
    errors = []
    for cfg, seq, batch, s in CASES:
        r = check(cfg, seq, batch, s)
        errors.append(abs(r.memory_error))
        comm = ", ".join(f"{k} {r.comm_model.get(k, 0) / 1e6:.3f} / {r.comm_compiled.get(k, 0) / 1e6:.3f} MB"
                         for k in sorted(set(r.comm_model) | set(r.comm_compiled))) or "none"
        print(f"| {_name(cfg)} | {seq} | {batch} | {s.label()} | {r.memory_compiled / 1e6:.1f} | "
              f"{r.memory_model / 1e6:.1f} | {r.memory_error * 100:+.1f}% | {comm} | "
              f"{r.flop_model / r.flop_compiled:.4f} |", flush=True)
    print(f"\nmemory: mean |error| {sum(errors) / len(errors) * 100:.1f}%, max {max(errors) * 100:.1f}% over "
          f"{len(errors)} compiled steps", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
