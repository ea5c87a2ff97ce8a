"""The strategy search: every mesh (data x fsdp x tensor x pipeline = the GPU count) with its schedules, checked
by the project's own rules (`jaxformer.sharding.validate`) and against the GPU's memory, predicted and ranked."""

from __future__ import annotations

import dataclasses
import itertools
import types
from typing import Iterable, Iterator

from .. import sharding
from .hardware import Hardware
from .predict import Prediction, predict
from .workload import Backend, GPU, Strategy, Workload


@dataclasses.dataclass(frozen=True)
class Space:
    """Which strategies to try: kernels, remat policies, microbatch counts (None: powers of two from the stage
    count up to the local batch), circular repeats, sequence parallelism, and a gradient-compression density."""

    kernels: tuple[str, ...] = ("pallas",)
    remat: tuple[str, ...] = ("none", "full")
    microbatches: tuple[int, ...] | None = None
    repeats: tuple[int, ...] = (1, 2)
    sequence_parallel: tuple[bool, ...] = (False,)
    density: float | None = None
    max_microbatches: int = 64
    pipeline_style: str = "jaxformer"


def factorizations(n: int, parts: int) -> Iterator[tuple[int, ...]]:
    """Every ordered tuple of `parts` positive integers whose product is `n`."""
    if parts == 1:
        yield (n,)
        return
    for d in range(1, n + 1):
        if n % d == 0:
            for rest in factorizations(n // d, parts - 1):
                yield (d,) + rest


def strategies(w: Workload, gpus: int, space: Space = Space()) -> Iterator[Strategy]:
    for dp, fsdp, tp, pp in factorizations(gpus, 4):
        local = w.global_batch // (dp * fsdp) if w.global_batch % (dp * fsdp) == 0 else 0
        if pp == 1:
            micro = (1,)
        elif space.microbatches is not None:
            micro = space.microbatches
        else:
            micro = tuple(m for m in (2 ** i for i in range(12)) if pp <= m <= min(local, space.max_microbatches)
                          ) or (pp,)
        for m, r, remat, kernels, sp in itertools.product(micro, space.repeats if pp > 1 else (1,), space.remat,
                                                          space.kernels, space.sequence_parallel):
            if sp and tp == 1:
                continue
            yield Strategy(dp=dp, fsdp=fsdp, tp=tp, pp=pp, microbatches=m, repeats=r, remat=remat, kernels=kernels,
                           sequence_parallel=sp, density=space.density, pipeline_style=space.pipeline_style)


def check(w: Workload, s: Strategy, gpus: int) -> str:
    """Why `s` cannot run `w` on `gpus` devices ("" if it can), by sharding.validate's rules."""
    tc = types.SimpleNamespace(batch_size=w.global_batch, seq_len=w.seq_len, microbatches=s.microbatches,
                               pipeline_repeats=s.repeats, sequence_parallel=s.sequence_parallel, kernels=s.kernels,
                               grad_compression="none", compression_config=lambda: None)
    try:
        sharding.validate(s.mesh(), w.model, tc, gpus)
    except ValueError as e:
        return str(e)
    return ""


def evaluate(w: Workload, s: Strategy, hw: Hardware, gpus: int, backend: Backend = GPU,
             overlap_grads: bool = False) -> Prediction:
    """A prediction for `s`, or an infeasible one naming the reason (a rule, or the memory)."""
    reason = check(w, s, gpus)
    if reason:
        return Prediction(w, s, False, reason)
    p = predict(w, s, hw, backend, overlap_grads)
    limit = hw.profile.memory_bytes
    if p.memory.total > limit:
        p.feasible = False
        p.reason = (f"does not fit: {p.memory.total / 2**30:.1f} GiB per GPU > {limit / 2**30:.1f} GiB usable on "
                    f"{hw.profile.name}")
    return p


def search(w: Workload, hw: Hardware, gpus: int, space: Space = Space(), backend: Backend = GPU,
           overlap_grads: bool = False, progress: bool = False) -> list[Prediction]:
    """Every strategy, feasible ones first by step time, then infeasible ones with their reasons."""
    cands: Iterable[Strategy] = list(strategies(w, gpus, space))
    if progress and len(cands) > 200:  # a progress line for large searches
        from tqdm import tqdm
        cands = tqdm(cands, desc="strategies", unit="strategy", leave=False)
    preds = [evaluate(w, s, hw, gpus, backend, overlap_grads) for s in cands]
    return sorted(preds, key=lambda p: (not p.feasible, p.step_time_s if p.feasible else 0.0))


def table(preds: list[Prediction], top: int | None = None, show_infeasible: int = 10) -> str:
    """The ranked strategies with their breakdown, then (some of) the infeasible ones and why."""
    feas = [p for p in preds if p.feasible]
    lines = [f"{'#':>3} {'strategy':<38}{'ms/step':>9}{'seq/s':>10}{'compute':>9}{'comm':>8}{'launch':>8}{'bubble':>8}"
             f"{'comm GB':>9}{'mem GiB':>9} {'(params/grads/opt/act/tmp)'}"]
    for i, p in enumerate(feas[:top] if top else feas, 1):
        m = p.memory
        lines.append(f"{i:>3} {p.strategy.label():<38}{p.step_time_s * 1e3:>9.2f}{p.seq_per_s:>10.1f}"
                     f"{p.compute_s * 1e3:>9.2f}{p.comm_s * 1e3:>8.2f}"
                     f"{max(0.0, p.step_time_s - p.compute_s - p.comm_s) * 1e3:>8.2f}{p.bubble * 100:>7.1f}%"
                     f"{p.comm_bytes / 1e9:>9.3f}{m.total / 2**30:>9.2f} "
                     f"({m.params / 2**30:.2f}/{m.grads / 2**30:.2f}/{m.optimizer / 2**30:.2f}/"
                     f"{m.activations / 2**30:.2f}/{m.temporaries / 2**30:.2f})"
                     + (f"  [{'; '.join(p.notes)}]" if p.notes else ""))
    if not feas:
        lines.append("    (no feasible strategy)")
    bad = [p for p in preds if not p.feasible]
    if bad and show_infeasible:
        lines += ["", f"infeasible: {len(bad)} (first {min(show_infeasible, len(bad))}):"]
        lines += [f"    {p.strategy.label():<38} {p.reason}" for p in bad[:show_infeasible]]
    return "\n".join(lines)
