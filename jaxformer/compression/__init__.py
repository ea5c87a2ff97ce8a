"""Compressed gradient exchange for data-parallel training (docs/compression.md).

    from jaxformer.compression import CompressionConfig, CompressedSteps, sparse_allreduce

    steps = CompressedSteps(model, make_optimizer(tc), tc, mesh, CompressionConfig(density=0.01))

* `config.py`: `CompressionConfig`, every option, validated when built.
* `selection.py`: per-row top-k with fixed capacity (exact, sampled threshold, reused threshold), compacted through
  a 32-entry admission bitmap in about one pass over the entries.
* `format.py`: the compact sparse format (wire-dtype values, 16-bit block offsets, per-block counts).
* `exchange.py`: the flat index space of a device's shards; the all-gather and balanced (Ok-Topk) exchanges.
* `transform.py`: `sparse_allreduce`, the optax transform with error feedback, momentum correction, local clipping.
* `frozen.py`: Adam's scaling with its second moment frozen after the dense steps (1-bit Adam; `make_optimizer`).
* `steps.py`: `CompressedSteps`, the train step with per-rank gradients inside a shard_map over `data`;
  `make_steps`, the dense or the compressed steps as a `TrainConfig`'s `grad_compression` says.

Only the `data` axis's gradient all-reduce is compressed: `fsdp`'s reduce-scatter stays dense (each device already
receives only its slice), and `tensor` and `pipeline` exchange activations, not gradients; selection works on each
device's own shards of those axes (docs/compression.md, Which axes).
"""

from .config import EXCHANGES, SELECTIONS, CompressionConfig
from .steps import CompressedSteps, make_steps, steady_train_step
from .transform import SparseAllReduceState, sparse_allreduce, state_shardings

__all__ = ["EXCHANGES", "SELECTIONS", "CompressionConfig", "CompressedSteps", "SparseAllReduceState", "make_steps",
           "sparse_allreduce", "state_shardings", "steady_train_step"]
