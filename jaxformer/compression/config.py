"""`CompressionConfig`: every option of compressed gradient exchange, checked when it is built (before any compile)."""

from __future__ import annotations

import dataclasses
import math

from pallas_kernels.mesh import MESH_AXES

EXCHANGES = ("allgather", "balanced")
SELECTIONS = ("exact", "sampled", "reused")
VALUE_DTYPES = ("bfloat16", "float32")


def _number(name: str, value, low: float, high: float, *, low_open: bool = False, high_open: bool = False) -> None:
    ok = isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)
    ok = ok and (value > low if low_open else value >= low) and (value < high if high_open else value <= high)
    if not ok:
        lo, hi = ("(" if low_open else "[") + f"{low}", f"{high}" + (")" if high_open else "]")
        raise ValueError(f"{name}={value!r} must be a number in {lo}, {hi}")


def _count(name: str, value, low: int) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < low:
        raise ValueError(f"{name}={value!r} must be an integer >= {low}")


@dataclasses.dataclass(frozen=True)
class CompressionConfig:
    """Sparse gradient exchange over the `axis` mesh axis (the data-parallel one).

    * `density`: the fraction of each tensor's entries a rank sends per step (top-k per tensor, per layer for the
      stacked encoder weights); tensors whose rows have fewer than `min_size` entries are sent whole.
    * `exchange`: "allgather" (every rank gathers every rank's entries: volume grows with the number of ranks) or
      "balanced" (Ok-Topk: the index space is split among the ranks, an all-to-all reduces each region on its owner,
      an all-gather spreads the reduced regions; volume about 2k whatever the number of ranks).
    * `selection`: how the top-k threshold is found: "exact" (`lax.top_k`), "sampled" (DGC: the threshold of a
      random sample, refined among the candidates it admits), "reused" (Ok-Topk: last step's threshold, adapted by
      the count it admitted, recomputed exactly every `refresh_every` steps).
    * `value_dtype`: the wire dtype of values; what rounding loses stays in the residual ("float32": exact sums).
    * `momentum`: DGC's momentum correction (> 0: the momentum is accumulated before selection and masked where
      sent; the optimizer after the exchange must then have no momentum of its own, e.g. plain SGD). 0: plain error
      feedback, the choice for AdamW or LAMB.
    * `clip_norm`: DGC's local gradient clipping: each rank clips its own gradient's norm at
      `clip_norm / sqrt(ranks)` before accumulating it (None: off).
    * `warmup_steps`: DGC's density warm-up: the steps before `density` is reached, split evenly among the levels
      `warmup_start`, `warmup_start / 4`, ... above `density`; each level is its own compiled step.
    * `freeze_variance_after`: 1-bit Adam's dense warm-up: the first this many steps all-reduce the dense
      gradient, then the optimizer's second moment is frozen (`make_optimizer`: AdamW's or LAMB's) and the compressed
      exchange (after any `warmup_steps` levels) starts. A frozen second moment makes the update linear in the
      exchanged gradient, so what error feedback delays still moves the parameters as far; an adaptive one divides
      each coordinate's bursts down (docs/compression.md, With Adam). Then `clip_norm` is the trainer's `--clip-norm`:
      clipping moves before the exchange, where error feedback sees it. 0: off.
    * `sample_fraction`: the sample per row for "sampled" (at least enough for about 60 sampled candidates).
    * `refresh_every`: "reused" recomputes the exact threshold every this many steps (Ok-Topk: 128).
    * `rebalance_every`: "balanced" moves the region boundaries to the ranks' mean index quantiles every this many
      steps. Ok-Topk rebalances every 64 steps because it needs an extra all-reduce; here the quantiles ride on
      the all-gather, so every step (the default) costs nothing more.
    * `send_slack`: "balanced": each all-to-all buffer holds `send_slack` times an even share of a rank's entries;
      what overflows stays in the sender's residual.
    * `gather_factor`: "balanced": each owner sends back at most `gather_factor` times an even share of k reduced
      entries (Ok-Topk's global top-k); the rest of its region's sums stays in the owner's residual.
    * `seed`: the sampling key of "sampled".
    """

    density: float = 0.01
    exchange: str = "balanced"
    selection: str = "sampled"  # H200, BERT-large: 20.6 ms (select_reference) against exact 117 ms, recall 1.0
    min_size: int = 16384
    value_dtype: str = "bfloat16"
    momentum: float = 0.0
    clip_norm: float | None = None
    warmup_steps: int = 0
    warmup_start: float = 0.25
    freeze_variance_after: int = 0
    sample_fraction: float = 0.01
    refresh_every: int = 128
    rebalance_every: int = 1
    send_slack: float = 1.25
    gather_factor: float = 1.0
    axis: str = "data"
    seed: int = 0

    def __post_init__(self):
        _number("density", self.density, 0.0, 1.0, low_open=True)
        if self.exchange not in EXCHANGES:
            raise ValueError(f"exchange={self.exchange!r} is unknown; choose one of {EXCHANGES}")
        if self.selection not in SELECTIONS:
            raise ValueError(f"selection={self.selection!r} is unknown; choose one of {SELECTIONS}")
        if self.value_dtype not in VALUE_DTYPES:
            raise ValueError(f"value_dtype={self.value_dtype!r} must be one of {VALUE_DTYPES}")
        _count("min_size", self.min_size, 1)
        _number("momentum", self.momentum, 0.0, 1.0, high_open=True)
        if self.clip_norm is not None:
            _number("clip_norm", self.clip_norm, 0.0, math.inf, low_open=True, high_open=True)
        _count("warmup_steps", self.warmup_steps, 0)
        _number("warmup_start", self.warmup_start, 0.0, 1.0, low_open=True)
        _count("freeze_variance_after", self.freeze_variance_after, 0)
        if self.freeze_variance_after and self.momentum:
            raise ValueError(f"momentum={self.momentum!r} with freeze_variance_after="
                             f"{self.freeze_variance_after!r}: a frozen-variance Adam has momentum of its own")
        _number("sample_fraction", self.sample_fraction, 0.0, 1.0, low_open=True)
        _count("refresh_every", self.refresh_every, 1)
        _count("rebalance_every", self.rebalance_every, 1)
        _number("send_slack", self.send_slack, 1.0, 64.0)
        _number("gather_factor", self.gather_factor, 0.0, 64.0, low_open=True)
        if not isinstance(self.axis, str) or not self.axis:
            raise ValueError(f"axis={self.axis!r} must name a mesh axis")
        _count("seed", self.seed, 0)

    def levels(self) -> tuple[tuple[int, float], ...]:
        """((first step, density), ...) from step 0: a dense level (density 1) for `freeze_variance_after` steps,
        then the warm-up levels, then `density`."""
        warm = []
        d = self.warmup_start
        while self.warmup_steps and d > self.density * (1 + 1e-9):
            warm.append(d)
            d /= 4
        dense = ((0, 1.0),) if self.freeze_variance_after else ()
        start = self.freeze_variance_after
        if not warm:
            return dense + ((start, self.density),)
        starts = [start + i * self.warmup_steps // len(warm) for i in range(len(warm))]
        return dense + tuple(zip(starts, warm)) + ((start + self.warmup_steps, self.density),)

    @property
    def steady_step(self) -> int:
        """The first step at `density` (after the dense and the warm-up levels)."""
        return self.levels()[-1][0]

    def density_at(self, step: int) -> float:
        """The density of step `step` (0-based) under the warm-up."""
        return [d for start, d in self.levels() if start <= step][-1]

    def check_mesh(self, mesh) -> None:
        """Raise ValueError unless `mesh` (a Mesh, a resolved MeshConfig or {axis: size}) has the compressed axis with
        more than one device."""
        if isinstance(mesh, dict) or mesh is None:
            shape = dict(mesh or {})
        elif hasattr(mesh, "shape"):
            shape = dict(mesh.shape)
        else:
            shape = {a: getattr(mesh, a) for a in MESH_AXES}
        size = shape.get(self.axis, 1)
        if size < 2:
            described = ",".join(f"{a}={n}" for a, n in shape.items()) or "one device"
            raise ValueError(f"gradient compression over axis={self.axis!r} needs that mesh axis to have more than "
                             f"one device (mesh {described}); use e.g. --mesh data=2 or turn compression off")

    def replace(self, **changes) -> "CompressionConfig":
        return dataclasses.replace(self, **changes)
