"""Compressed gradient exchange for data-parallel training (docs/compression.md).

    from jaxformer.compression import CompressionConfig, CompressedSteps, sparse_allreduce

    steps = CompressedSteps(model, make_optimizer(tc), tc, mesh, CompressionConfig(density=0.01))

* `config.py`: `CompressionConfig`, every option, validated when built.
* `selection.py`: per-row top-k with fixed capacity (exact, sampled threshold, reused threshold).
* `format.py`: the compact sparse format (wire-dtype values, 16-bit block offsets, per-block counts).
* `exchange.py`: the flat index space of a device's shards; the all-gather and balanced (Ok-Topk) exchanges.
* `transform.py`: `sparse_allreduce`, the optax transform with error feedback, momentum correction, local clipping.
* `steps.py`: `CompressedSteps`, the train step with per-rank gradients inside a shard_map over `data`.
"""

from .config import EXCHANGES, SELECTIONS, CompressionConfig
from .steps import CompressedSteps
from .transform import SparseAllReduceState, sparse_allreduce, state_shardings

__all__ = ["EXCHANGES", "SELECTIONS", "CompressionConfig", "CompressedSteps", "SparseAllReduceState",
           "sparse_allreduce", "state_shardings"]
