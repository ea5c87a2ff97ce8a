"""Measured time per operator for the data-movement report (`python -m jaxformer.hlo_report --profile`).

Runs the compiled train step on real (synthetic) arrays under `jax.profiler`, reads the trace's XSpace with
`jax.profiler.ProfileData`, and sums the duration of every device event that XLA annotated with its HLO instruction
(`hlo_op`) and module (`hlo_module`). `Report.attach_times` then joins those times to the report's operators by
instruction name, which gives each class's share of *runtime* next to its share of flop: Ivanov et al.'s Table 1.

On a GPU the events are the kernels on the device's stream lines (the time the GPU spent in each operator,
without host gaps); on a CPU they are the thunk executor's host events (useful only to test the plumbing).
"""

from __future__ import annotations

import collections
import glob
import re
import tempfile
import time
from typing import Callable

import jax


def module_name(hlo_text: str) -> str:
    m = re.match(r"\s*HloModule\s+([\w.\-]+)", hlo_text)
    if not m:
        raise ValueError("the HLO text does not start with 'HloModule <name>'")
    return m.group(1)


def op_times(xplane_path: str, module: str, by: str = "hlo_op") -> tuple[dict[str, float], str]:
    """{HLO instruction name: total ns} of `module`'s device events in one XSpace file, and where they came from.

    `by="kernel"` keys the times by the event (kernel) name instead, e.g. `flash_attention_dkdv` or a cuBLAS GEMM;
    `by="both"` by "instruction: kernel".
    Several devices (one process, several GPUs): their times are averaged, so the result is per device."""
    from jax.profiler import ProfileData

    if by not in ("hlo_op", "kernel", "both"):
        raise ValueError(f"by={by!r} must be 'hlo_op', 'kernel' or 'both'")
    planes = list(ProfileData.from_file(xplane_path).planes)
    gpus = [p for p in planes if p.name.startswith("/device:GPU")]
    use = gpus or [p for p in planes if p.name.startswith("/host:CPU")]
    per_plane = []
    for plane in use:
        lines = list(plane.lines)
        # GPU planes also carry lines derived from annotations ("XLA Ops", "XLA Modules"...): count each kernel
        # once, from the stream lines, when there are any.
        streams = [ln for ln in lines if ln.name.startswith("Stream")] if gpus else []
        times: collections.Counter = collections.Counter()
        for line in streams or lines:
            for e in line.events:
                stats = dict(e.stats)
                mod = str(stats.get("hlo_module", ""))
                if "hlo_op" in stats and (mod == module or mod.startswith(module + "(")):
                    op = str(stats["hlo_op"])
                    times[op if by == "hlo_op" else e.name if by == "kernel" else f"{op}: {e.name}"] += e.duration_ns
        if times:
            per_plane.append(times)
    if not per_plane:
        found = sorted({f"{p.name}: {ln.name}" for p in use for ln in p.lines})[:20]
        raise RuntimeError(f"no profiler events of module {module!r} with an hlo_op annotation; "
                           f"planes/lines seen: {found}")
    total: collections.Counter = collections.Counter()
    for t in per_plane:
        total.update(t)
    source = "device kernels" if gpus else "host (CPU thunk) events"
    return {k: v / len(per_plane) for k, v in total.items()}, source


def busy_ns(intervals) -> tuple[int, int, int]:
    """(span, busy, gaps) of (start, end) intervals in ns: from the first start to the last end, the length of their
    union, and how many stretches of nothing running lie between (overlapping kernels of several streams count
    once)."""
    ivs = sorted(intervals)
    if not ivs:
        return 0, 0, 0
    busy = gaps = 0
    lo, hi = ivs[0]
    for s, e in ivs[1:]:
        if s > hi:
            busy, gaps, lo, hi = busy + hi - lo, gaps + 1, s, e
        else:
            hi = max(hi, e)
    return max(e for _, e in ivs) - ivs[0][0], busy + hi - lo, gaps


def device_busy(xplane_path: str) -> tuple[float, float, float] | None:
    """(span, busy, gaps) per device (`busy_ns` of every event on the GPU planes' stream lines, averaged over the
    GPUs) of one XSpace file; None without GPU planes (on a CPU)."""
    from jax.profiler import ProfileData

    per = []
    for plane in ProfileData.from_file(xplane_path).planes:
        if plane.name.startswith("/device:GPU"):
            per.append(busy_ns([(e.start_ns, e.start_ns + e.duration_ns) for ln in plane.lines
                                if ln.name.startswith("Stream") for e in ln.events]))
    per = [p for p in per if p[0]]
    return tuple(sum(p[i] for p in per) / len(per) for i in range(3)) if per else None


def profile_compiled(compiled: Callable, args: tuple, steps: int, *, warmup: int = 2,
                     carry: Callable | None = None, log=print, by: str = "hlo_op") -> dict[str, float]:
    """Run `compiled(*args)` `warmup` + `steps` times, the last `steps` under the profiler; `carry(out, args)` gives
    the next call's arguments (the train step donates its state). Returns `op_times(..., by=by)` of the trace."""
    text = compiled.as_text()
    module = module_name(text)
    for _ in range(warmup):
        out = compiled(*args)
        args = carry(out, args) if carry else args
    jax.block_until_ready(args)
    with tempfile.TemporaryDirectory() as d:
        t0 = time.perf_counter()
        jax.profiler.start_trace(d)
        for _ in range(steps):
            out = compiled(*args)
            args = carry(out, args) if carry else args
        jax.block_until_ready(out)
        jax.profiler.stop_trace()
        wall = (time.perf_counter() - t0) / steps
        files = glob.glob(f"{d}/**/*.xplane.pb", recursive=True)
        if not files:
            raise RuntimeError(f"the profiler wrote no .xplane.pb under {d}")
        times, source = op_times(files[0], module, by)
    log(f"profile: {steps} steps of {module}, {wall * 1e3:.2f} ms per step on the host clock "
        f"(with tracing), times from {source}")
    return times
