"""Multi-process (multi-host) runs: `jax.distributed` start-up, which process writes, and each process's batch rows.

One process per host (or per GPU): every process runs the same program on its own devices, reads only its rows of
each global batch, and XLA's collectives (NCCL on GPUs, gloo on CPUs) join them. The settings come from, in order:
`TrainConfig.coordinator` / `num_processes` / `process_id` (train.py `--coordinator --num-processes --process-id`),
the environment (`JAXFORMER_COORDINATOR`, `JAXFORMER_NUM_PROCESSES`, `JAXFORMER_PROCESS_ID`), or a SLURM step
(`srun` with more than one task: JAX's own SLURM detection). None of them: one process, nothing initialised.
"""

from __future__ import annotations

import dataclasses
import os
from typing import Mapping

import jax

ENV = {"coordinator": "JAXFORMER_COORDINATOR", "num_processes": "JAXFORMER_NUM_PROCESSES",
       "process_id": "JAXFORMER_PROCESS_ID"}
FLAGS = {"coordinator": "--coordinator", "num_processes": "--num-processes", "process_id": "--process-id"}


@dataclasses.dataclass(frozen=True)
class Spec:
    """How to start: `slurm` (jax.distributed.initialize() with JAX's detection) or the explicit three values."""

    coordinator: str | None = None
    num_processes: int | None = None
    process_id: int | None = None
    slurm: bool = False


def _int(field: str, value, source: str) -> int:
    if isinstance(value, bool):
        raise ValueError(f"{field}={value!r} ({source}) must be an integer")
    try:
        return int(value)
    except (TypeError, ValueError):
        raise ValueError(f"{field}={value!r} ({source}) must be an integer") from None


def check_fields(coordinator, num_processes, process_id, source: str = "TrainConfig") -> None:
    """Each given value on its own (and process_id against num_processes when both are given)."""
    if coordinator is not None:
        host, colon, port = str(coordinator).rpartition(":")
        if not (colon and host and port.isdigit() and 0 < int(port) < 65536):
            raise ValueError(f"coordinator={coordinator!r} ({source}) must look like HOST:PORT, e.g. node0:1234")
    if num_processes is not None and _int("num_processes", num_processes, source) < 1:
        raise ValueError(f"num_processes={num_processes!r} ({source}) must be >= 1")
    if process_id is not None and _int("process_id", process_id, source) < 0:
        raise ValueError(f"process_id={process_id!r} ({source}) must be >= 0")
    if num_processes is not None and process_id is not None and int(process_id) >= int(num_processes):
        raise ValueError(f"process_id={process_id} ({source}) is out of range for num_processes={num_processes} "
                         f"(0 .. {int(num_processes) - 1})")


def resolve(coordinator=None, num_processes=None, process_id=None,
            environ: Mapping[str, str] | None = None) -> Spec | None:
    """The start-up of this process, or None for a single process. Each value comes from its argument, else its
    JAXFORMER_* variable; given partially -> ValueError naming the missing ones. Nothing given and a SLURM step of
    more than one task -> `Spec(slurm=True)`. `num_processes=1` is one process (no coordinator needed)."""
    env = os.environ if environ is None else environ
    given = dict(coordinator=coordinator, num_processes=num_processes, process_id=process_id)
    source = {k: FLAGS[k] for k, v in given.items() if v is not None}
    for k, var in ENV.items():
        if given[k] is None and env.get(var, "").strip():
            given[k], source[k] = env[var].strip(), f"${var}"
    for k, v in given.items():
        if v is not None:
            check_fields(**{f: (v if f == k else None) for f in given}, source=source[k])
    if all(v is None for v in given.values()):
        steps = env.get("SLURM_NTASKS", "")
        # SLURM_STEP_NODELIST is set inside an `srun` step only, and JAX's detection needs it: a batch script that
        # runs python directly (one task) stays a single process.
        if env.get("SLURM_JOB_ID") and steps.isdigit() and int(steps) > 1 and env.get("SLURM_STEP_NODELIST"):
            return Spec(slurm=True)
        return None
    if given["num_processes"] is not None and given["process_id"] is not None:
        check_fields(None, given["num_processes"], given["process_id"],
                     source=f"{source['process_id']} / {source['num_processes']}")
    if given["num_processes"] is not None and int(given["num_processes"]) == 1:
        return None  # one process: nothing to coordinate
    missing = [f"{FLAGS[k]} (or ${ENV[k]})" for k, v in given.items() if v is None]
    if missing:
        have = ", ".join(f"{k}={v!r} from {source[k]}" for k, v in given.items() if v is not None)
        raise ValueError(f"multi-process settings are incomplete: {have} given but {', '.join(missing)} missing")
    return Spec(coordinator=str(given["coordinator"]), num_processes=int(given["num_processes"]),
                process_id=int(given["process_id"]))


def initialize(spec: Spec | None) -> None:
    """`jax.distributed.initialize` as `spec` says (nothing for None or when already initialised). Must run before
    anything asks JAX for its devices (device counts, meshes, arrays)."""
    if spec is None or jax.distributed.is_initialized():
        return
    try:
        # CPU processes exchange through gloo (jax's default since 0.4.3x; set explicitly in case someone turned it
        # off, since without it a multi-process CPU client has no cross-process collectives at all).
        if jax.config.jax_cpu_collectives_implementation is None:
            jax.config.update("jax_cpu_collectives_implementation", "gloo")
    except AttributeError:  # an option renamed in a later jax: its default applies
        pass
    if spec.slurm:
        jax.distributed.initialize()
    else:
        jax.distributed.initialize(spec.coordinator, spec.num_processes, spec.process_id)


def is_main() -> bool:
    """Whether this process writes logs, metrics, plots and the tokenizer (process 0)."""
    return jax.process_index() == 0


def barrier(name: str) -> None:
    """Every process waits here until all arrive (a no-op with one process)."""
    if jax.process_count() > 1:
        from jax.experimental import multihost_utils
        multihost_utils.sync_global_devices(name)


def any_process(flag: bool) -> bool:
    """Whether `flag` is set on any process (every process must call this at the same point)."""
    if jax.process_count() == 1:
        return bool(flag)
    import numpy as np
    from jax.experimental import multihost_utils
    return bool(np.asarray(multihost_utils.process_allgather(np.int32(bool(flag)))).any())


def broadcast_text(text: str, size: int = 256) -> str:
    """Process 0's `text` (at most `size` UTF-8 bytes) on every process."""
    if jax.process_count() == 1:
        return text
    import numpy as np
    from jax.experimental import multihost_utils
    raw = text.encode()[:size]
    buf = np.zeros(size + 1, np.int32)  # int32: no x64 needed; the last slot holds the length
    buf[:len(raw)], buf[-1] = np.frombuffer(raw, np.uint8), len(raw)
    out = np.asarray(multihost_utils.broadcast_one_to_all(buf))
    return bytes(out[:int(out[-1])].astype(np.uint8)).decode()


def batch_block(batch_sharding: jax.sharding.Sharding, batch_size: int) -> tuple[int, int]:
    """(i, k): this process's devices hold rows [i*B/k, (i+1)*B/k) of every global batch under `batch_sharding`,
    so it reads block i of k (`loader.train_batches(..., block=i, n_blocks=k)`). k is the process count when the batch
    axes span every process, fewer when processes replicate the batch (e.g. `tensor` or `pipeline` across hosts).

    `jax.make_array_from_process_local_data` fills this process's devices from its local rows in order, and does
    not check that they are the rows the data pipeline picked: so their being one aligned block is checked here.
    """
    index = batch_sharding.addressable_devices_indices_map((batch_size,))
    spans = [(s[0].start or 0, batch_size if s[0].stop is None else s[0].stop) for s in index.values()]
    return rows_block(spans, batch_size)


def rows_block(spans, batch_size: int) -> tuple[int, int]:
    """(i, k) of `batch_block` from the row spans [start, stop) of this process's devices; ValueError unless they
    cover one aligned block exactly (overlaps are replicas)."""
    spans = sorted(set(spans))
    lo, hi = spans[0][0], max(b for _, b in spans)
    covered = lo
    for a, b in spans:
        if a > covered:
            break
        covered = max(covered, b)
    n = hi - lo
    if covered != hi or batch_size % n or lo % n:
        raise ValueError(f"the batch sharding gives process {jax.process_index()} rows {spans} of batch_size="
                         f"{batch_size}, not one aligned block: lay out the mesh so that each process's devices "
                         f"hold neighbouring batch rows")
    return lo // n, batch_size // n
