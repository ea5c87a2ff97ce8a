"""`python -m jaxformer.ops`: which implementation each fused-operator call of a model runs, and why the ones before
it in the operator's order were skipped; computed for any device (`--gpu h200`) on any machine. `--table` prints the
operators' implementations."""

from __future__ import annotations

import argparse
import math
import sys

import pallas_kernels.attention as _attention
import pallas_kernels.bias_dropout_residual_layernorm as _bdrln
import pallas_kernels.bias_gelu as _bias_gelu
import pallas_kernels.embedding_layernorm as _embedding
import pallas_kernels.gelu_dense as _gelu_dense
import pallas_kernels.mlm_loss as _mlm_loss
from pallas_kernels import registry
from pallas_kernels.mesh import MESH_AXES, shard_counts

from ..config import BertConfig, MeshConfig
from . import KERNELS, resolve, table


def model_calls(cfg, batch: int, seq_len: int, mesh: dict[str, int], *, max_predictions: int, dropout: bool = True):
    """(call site, operator, per-shard call) of each fused-operator call of a BertConfig `cfg`'s train step at a
    global `batch` of `seq_len` on a mesh of these axis sizes, as the operators form them."""
    shards, tp = shard_counts(mesh, heads=True)
    b, s, p = batch // shards, seq_len, max_predictions
    d, f, n, dtype = cfg.hidden_size, cfg.intermediate_size, cfg.num_attention_heads, cfg.compute_dtype.name
    hidden = cfg.hidden_dropout_prob if dropout else 0.0
    attention = cfg.attention_probs_dropout_prob if dropout else 0.0
    bdrln = _bdrln.Call(b * s, d, dtype, dtype, hidden)
    calls = [
        ("embeddings", "embedding_layernorm",
         _embedding.Call(b * s, d, dtype, hidden, _embedding.impls.mesh_axes(mesh))),
        ("self-attention", "attention_qkv", _attention.impls.Call(b, s, s, n // tp, cfg.head_dim, dtype, attention,
                                                                  True)),
        ("attention output", "bias_dropout_residual_layernorm", bdrln),
        ("feed-forward", "gelu_dense", _gelu_dense.Call(b * s, f // tp, d, dtype)),
        ("feed-forward", "bias_gelu", _bias_gelu.Call(b * s, f // tp, dtype, 0.0)),  # no dropout: F split too
        ("feed-forward output", "bias_dropout_residual_layernorm", bdrln),
        ("MLM head", "bias_gelu", _bias_gelu.Call(b * p, d // tp, dtype, 0.0)),
        ("MLM head", "layer_norm", _bdrln.Call(b * p, d, dtype, dtype, 0.0, bias=False, residual=False)),
    ]
    if tp == 1:  # with the vocabulary split over `tensor` the MLM head keeps its logits (vocabulary-parallel)
        calls.append(("MLM loss", "mlm_cross_entropy", _mlm_loss.Call(b * p, cfg.padded_vocab_size, d, dtype)))
    return calls


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m jaxformer.ops", description=__doc__)
    ap.add_argument("--table", action="store_true", help="print the implementations of each operator and exit")
    ap.add_argument("--config", default="large", help="a BertConfig preset (default large)")
    ap.add_argument("--seq-len", type=int, default=128)
    ap.add_argument("--batch-size", type=int, default=64, help="global, over the mesh's batch axes")
    ap.add_argument("--max-predictions", type=int, default=None, help="masked positions per sequence "
                    "(default: 15%% of the sequence, as the data pipeline)")
    ap.add_argument("--dtype", default="bfloat16", help="compute dtype")
    ap.add_argument("--dropout", type=float, default=None, help="both dropout rates (default: the preset's)")
    ap.add_argument("--mesh", default="data=1", help="axis sizes, e.g. data=2,tensor=2 (no -1)")
    ap.add_argument("--gpu", default="current", help=f"the device: current or one of {sorted(registry.DEVICES)}")
    ap.add_argument("--kernels", default="auto", choices=KERNELS)
    a = ap.parse_args(argv)
    if a.table:
        print(table())
        return 0
    try:
        device = registry.Device.named(a.gpu)
        overrides = {} if a.dropout is None else dict(hidden_dropout_prob=a.dropout,
                                                      attention_probs_dropout_prob=a.dropout)
        cfg = BertConfig.preset(a.config, dtype=a.dtype, **overrides)
        mesh = MeshConfig.parse(a.mesh)
        sizes = {axis: getattr(mesh, axis) for axis in MESH_AXES}
        if any(v < 1 for v in sizes.values()):
            raise ValueError(f"--mesh {a.mesh!r}: every axis needs a size here (no -1)")
        shards = shard_counts(sizes)[0]
        if a.batch_size < 1 or a.batch_size % shards or a.seq_len < 8 or a.seq_len > cfg.max_position_embeddings:
            raise ValueError(f"--batch-size {a.batch_size} must be a positive multiple of the batch shards ({shards}) "
                             f"and --seq-len {a.seq_len} in [8, {cfg.max_position_embeddings}]")
        p = a.max_predictions or min(a.seq_len - 3, math.ceil(0.15 * a.seq_len))
        if not 1 <= p <= a.seq_len - 3:
            raise ValueError(f"--max-predictions {a.max_predictions} must be in [1, seq_len - 3]")
    except ValueError as e:
        print(f"python -m jaxformer.ops: {e}", file=sys.stderr)
        return 2
    kernels = resolve(a.kernels, device)
    print(f"{a.config}, S={a.seq_len}, batch {a.batch_size} on {a.mesh}, {a.dtype}, dropout "
          f"{cfg.hidden_dropout_prob}/{cfg.attention_probs_dropout_prob}; {device}: kernels={a.kernels} -> {kernels}")
    for site, op, call in model_calls(cfg, a.batch_size, a.seq_len, sizes, max_predictions=p):
        fields = ", ".join(f"{k}={v}" for k, v in vars(call).items())
        if kernels == "xla":
            print(f"{site:<20} {op:<32} runs xla ({fields})")
            continue
        choice = registry.choose(op, call, device, log_skips=False)
        print(f"{site:<20} {op:<32} runs {choice.impl.name} ({fields})")
        for name, skip in choice.skipped:
            print(f"{'':<20} {'':<32}   {name} skipped: {skip.reason}")
        if choice.config is not None:
            print(f"{'':<20} {'':<32}   blocks {choice.config}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
