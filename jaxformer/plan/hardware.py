"""GPU profiles (datasheet figures), the calibration file, and the cost of a GEMM, a memory-bound operator and a
collective on them.

Costs:
* GEMM: `t0 + flop / rate` (a fixed launch-and-tail cost plus the large-GEMM rate), fitted to the calibration's
  measured BERT-shaped GEMMs; without a calibration `rate = gemm_efficiency x peak x width_efficiency(D)`, `t0`
  6 us.
* memory-bound operator: `bytes / (copy_efficiency x HBM bandwidth)`, or the calibration's measured copy rate.
* launching: a least time per launched operator, inside while loops and in the straight line (measured).
* collective (alpha-beta, ring algorithms): `steps x alpha + wire_bytes / beta`. Inside a node beta is the NVLink
  bandwidth per GPU and direction, alpha its per-step latency; a group spanning nodes runs hierarchically (NCCL):
  reduce-scatter inside the node, the inter-node collective on 1/g of the data over the node's network link shared
  by its GPUs (an all-reduce with a tree's 2 log2(nodes) latency steps), all-gather inside the node. The
  calibration replaces the NVLink alpha and beta per collective kind.
"""

from __future__ import annotations

import dataclasses
import json
import math
from pathlib import Path


# `calibrate.measure_launch` on an H200 host (jax 0.11.2; benchmarks/results/perfmodel.md, "Launching"): microseconds
# per launched operator when operators are too small to keep the GPU busy, in a loop / in a straight line
LAUNCH_US = (2.86, 3.75)


@dataclasses.dataclass(frozen=True)
class GPUProfile:
    """Datasheet figures of one GPU and its node. Bandwidths: HBM TB/s, NVLink GB/s per GPU per direction, the
    node's inter-node network Gb/s (all its NICs together), latencies in microseconds."""

    name: str
    bf16_tflops: float
    hbm_tbps: float
    hbm_gib: float
    nvlink_gbps: float
    nvlink_us: float
    inter_node_gbps: float
    inter_node_us: float
    gpus_per_node: int = 8
    gemm_efficiency: float = 0.72  # large bf16 GEMMs: ~700 of 989 TFLOP/s measured (DESIGN.md, "Anchors")
    copy_efficiency: float = 0.9  # streaming copies: 3.0 of 3.35 TB/s (H100), 4.3 of 4.8 (H200) measured
    usable_gib: float = 0.0  # what XLA may allocate (0: 90% of hbm_gib)
    alu_scale: float = 1.0  # element-wise arithmetic time relative to an H100 (SMs x clock)
    # the least time a launched operator costs, inside a while loop and in the step's straight line (microseconds):
    # an H200 host's (`calibrate.measure_launch`), taken for every GPU (it is mostly the host's)
    launch_us: tuple[float, float] = LAUNCH_US

    @property
    def memory_bytes(self) -> float:
        return (self.usable_gib or 0.9 * self.hbm_gib) * 2**30


# NVIDIA datasheets: H100 SXM5 / H200 SXM (989 dense bf16 TFLOP/s, 3.35 / 4.8 TB/s, 80 / 141 GB, NVLink 4 at
# 900 GB/s both directions), A100 SXM 80GB (312 TFLOP/s, 2.039 TB/s, NVLink 3 at 600 GB/s); DGX nodes of 8 GPUs with
# one 400 Gb/s (H100/H200, ConnectX-7) or 200 Gb/s (A100, HDR) InfiniBand NIC per GPU.
PROFILES = {
    "h100": GPUProfile("NVIDIA H100 SXM", 989.0, 3.35, 80.0, 450.0, 5.0, 8 * 400.0, 10.0),
    "h200": GPUProfile("NVIDIA H200 SXM", 989.0, 4.8, 141.0, 450.0, 5.0, 8 * 400.0, 10.0),
    "a100": GPUProfile("NVIDIA A100 SXM 80GB", 312.0, 2.039, 80.0, 300.0, 6.0, 8 * 200.0, 10.0,
                       gemm_efficiency=0.75, alu_scale=1.7),  # 108 SMs at 1.41 GHz vs 132 at 1.98
}
# What XLA's collectives reach of the NVLink datasheet bandwidth without a calibration: a 16.8 MB bf16 all-reduce on
# two H200s took ~0.125 ms, ~134 GB/s bus bandwidth of 450 (benchmarks/dp_overlap.py, 2026-11-22, code of ed11862).
NVLINK_EFFICIENCY = 0.33

# The GEMM rate by the model's width D, relative to BERT-large's (the profile's `gemm_efficiency` is anchored on
# 1024-wide GEMMs). Source: the H200 GEMMs recorded in benchmarks/results/perfmodel/calibration-h200.json at 8192
# rows: BERT-base's forward layer shapes (k x n = 768 x 2304, 768 x 768, 768 x 3072, 3072 x 768) ran at 601 TFLOP/s
# (flop-weighted harmonic mean), BERT-large's (1024 x 3072, 1024 x 1024, 1024 x 4096, 4096 x 1024) at 653, once
# the recording chain's extra pass over each output is taken off at the measured copy rate (465 against 527, 0.88,
# without that). Linear in D between the two, held beyond them.
WIDTH_EFFICIENCY = {768: 0.92, 1024: 1.0}


def width_efficiency(width: int) -> float:
    (w0, e0), (w1, e1) = sorted(WIDTH_EFFICIENCY.items())
    x = min(max((width - w0) / (w1 - w0), 0.0), 1.0)
    return e0 + x * (e1 - e0)


COLLECTIVE_KINDS = ("all-reduce", "all-gather", "reduce-scatter", "all-to-all", "collective-permute")


def ring_steps(kind: str, n: int) -> int:
    """Sequential steps of the ring algorithm for `kind` on `n` devices (what alpha is paid for)."""
    if n <= 1:
        return 0
    return {"all-reduce": 2 * (n - 1), "collective-permute": 1}.get(kind, n - 1)


def wire_fraction(kind: str, n: int) -> float:
    """Bytes each device sends, per byte of the collective's buffer (all-gather: result; reduce-scatter: operand)."""
    if n <= 1:
        return 0.0
    return {"all-reduce": 2 * (n - 1) / n, "collective-permute": 1.0}.get(kind, (n - 1) / n)


@dataclasses.dataclass(frozen=True)
class Calibration:
    """Measured on the GPUs (`python -m jaxformer.plan --calibrate FILE`): GEMM time = t0 + flop / rate, copy
    bandwidth, and per collective kind alpha (s per ring step) and beta (bytes/s per GPU) over NVLink."""

    device: str
    gemm_rate: float  # flop/s
    gemm_t0: float  # s
    copy_bps: float  # bytes/s (read + write counted)
    collectives: dict  # kind -> {"alpha": s, "beta": bytes/s}
    launch_s: dict = dataclasses.field(default_factory=dict)  # {"loop": s, "straight": s} per launched operator
    raw: dict = dataclasses.field(default_factory=dict, compare=False)

    @classmethod
    def load(cls, path: str | Path) -> "Calibration":
        d = json.loads(Path(path).read_text())
        fit = d["fit"]
        return cls(device=d["device"], gemm_rate=fit["gemm_rate"], gemm_t0=fit["gemm_t0"], copy_bps=fit["copy_bps"],
                   collectives=fit.get("collectives", {}), launch_s=fit.get("launch_s", {}), raw=d)


@dataclasses.dataclass(frozen=True)
class Hardware:
    """A GPU profile, optionally calibrated, and the cluster shape."""

    profile: GPUProfile
    gpus_per_node: int
    inter_node_gbps: float
    calibration: Calibration | None = None

    @classmethod
    def make(cls, gpu: str = "h100", gpus_per_node: int | None = None, inter_node_gbps: float | None = None,
             calibration: Calibration | None = None) -> "Hardware":
        if gpu not in PROFILES:
            raise ValueError(f"gpu={gpu!r} is unknown; choose one of {sorted(PROFILES)}")
        p = PROFILES[gpu]
        return cls(p, gpus_per_node or p.gpus_per_node,
                   p.inter_node_gbps if inter_node_gbps is None else inter_node_gbps, calibration)

    # -- compute
    @property
    def gemm_rate(self) -> float:
        c = self.calibration
        return c.gemm_rate if c else self.profile.gemm_efficiency * self.profile.bf16_tflops * 1e12

    @property
    def gemm_t0(self) -> float:
        return self.calibration.gemm_t0 if self.calibration else 6e-6

    @property
    def copy_bps(self) -> float:
        c = self.calibration
        return c.copy_bps if c else self.profile.copy_efficiency * self.profile.hbm_tbps * 1e12

    def gemm_time(self, flop: float, count: float = 1.0, width: int | None = None) -> float:
        """Seconds for `count` GEMMs of `flop` each; `width` (the model's D) scales the profile's rate
        (`width_efficiency`; a calibration's fitted rate already holds its shapes)."""
        rate = self.gemm_rate
        if width is not None and self.calibration is None:
            rate *= width_efficiency(width)
        return count * self.gemm_t0 + count * flop / rate

    def memory_time(self, nbytes: float) -> float:
        return nbytes / self.copy_bps

    def launch_time(self, loop_ops: float, straight_ops: float) -> float:
        """The least time to launch these operators (inside while loops, in the straight line) one after another:
        the step's time when its operators are too small to keep the GPU busy."""
        c = self.calibration
        loop, straight = ((c.launch_s["loop"], c.launch_s["straight"]) if c and c.launch_s
                          else (self.profile.launch_us[0] * 1e-6, self.profile.launch_us[1] * 1e-6))
        return loop_ops * loop + straight_ops * straight

    # -- communication
    def _nvlink(self, kind: str) -> tuple[float, float]:
        c = self.calibration
        if c and kind in c.collectives:
            return c.collectives[kind]["alpha"], c.collectives[kind]["beta"]
        return self.profile.nvlink_us * 1e-6, NVLINK_EFFICIENCY * self.profile.nvlink_gbps * 1e9

    def collective_time(self, kind: str, nbytes: float, group: int, span: int) -> float:
        """One collective of `kind` on a per-device buffer of `nbytes` over `group` devices whose members lie in
        `span` consecutive device indices (mesh order: tensor innermost), on this cluster."""
        if group <= 1:
            return 0.0
        g_in = max(1, min(group, self.gpus_per_node * group // max(span, 1)))  # members per node
        nodes = math.ceil(group / g_in)
        alpha, beta = self._nvlink(kind)
        if nodes == 1:
            return ring_steps(kind, group) * alpha + wire_fraction(kind, group) * nbytes / beta
        inter_alpha = self.profile.inter_node_us * 1e-6
        inter_beta = self.inter_node_gbps / 8 * 1e9 / self.gpus_per_node  # bytes/s per GPU: the NICs are shared
        if kind == "collective-permute":
            return inter_alpha + nbytes / inter_beta
        # hierarchical: inside the node on the full buffer, across nodes on 1/g_in of it, inside again
        inner = 0.0
        if g_in > 1:
            inner_kind = "reduce-scatter" if kind in ("all-reduce", "reduce-scatter") else "all-gather"
            inner = ring_steps(inner_kind, g_in) * alpha + wire_fraction(inner_kind, g_in) * nbytes / beta
            if kind == "all-reduce":
                inner *= 2  # reduce-scatter before, all-gather after
        # NCCL's all-reduce across nodes pays a tree's latency (2 log2 steps), a ring's bandwidth
        steps = 2 * math.ceil(math.log2(nodes)) if kind == "all-reduce" else ring_steps(kind, nodes)
        across = steps * inter_alpha + wire_fraction(kind, nodes) * (nbytes / g_in) / inter_beta
        return inner + across
