"""The implementation each operator runs, and its default blocks, for every per-shard call of BERT's model.

`pinned_choices.json` holds what the rules chose for every BERT-base/large call (S = 128 and 512; batch 64, 16, 32 on
one device and on data=2; dropout 0 and 0.1; bfloat16 and float32) on an H200, an H100 and the CPU: the same kernels
with the same blocks must run after any change to how the choice is made.
"""

import contextlib
import dataclasses
import json
import math
import os

import jax
import jax.numpy as jnp
import pytest

PINNED = os.path.join(os.path.dirname(__file__), "pinned_choices.json")
DEVICE_KINDS = {"h200": "NVIDIA H200", "h100": "NVIDIA H100 80GB HBM3", "cpu": "cpu"}
PRESETS = {"base": (768, 12, 3072), "large": (1024, 16, 4096)}  # D, N, F
PADDED_VOCAB = 30592  # 30522 rounded up to a multiple of 128 (BertConfig.padded_vocab_size)


def model_calls():
    """(operator, per-shard call fields) of every fused-operator call the model makes, over the pinned grid."""
    calls = []
    for d, n, f in PRESETS.values():
        for s in (128, 512):
            p = min(s - 3, math.ceil(0.15 * s))  # masked positions per sequence (DataConfig.max_predictions)
            for batch in (64, 16, 32):
                for data in (1, 2):
                    b = batch // data
                    for rate in (0.0, 0.1):
                        for dtype in ("bfloat16", "float32"):
                            calls += [
                                ("embedding_layernorm", dict(rows=b * s, width=d, dtype=dtype, rate=rate)),
                                ("attention_qkv", dict(batch=b, seq=s, heads=n, head_dim=d // n, dtype=dtype,
                                                       rate=rate)),
                                ("bias_dropout_residual_layernorm", dict(rows=b * s, width=d, dtype=dtype,
                                                                         out_dtype=dtype, rate=rate)),
                                ("bias_gelu", dict(rows=b * s, width=f, dtype=dtype, rate=0.0)),  # feed-forward
                                ("bias_gelu", dict(rows=b * p, width=d, dtype=dtype, rate=0.0)),  # MLM head
                                ("layer_norm", dict(rows=b * p, width=d, dtype=dtype, out_dtype=dtype, rate=0.0)),
                                ("mlm_cross_entropy", dict(rows=b * p, vocab=PADDED_VOCAB, width=d, dtype=dtype)),
                            ]
    calls.append(("kernels", dict(kernels="auto")))
    return calls


def _key(op, call):
    return op + " " + " ".join(f"{k}={v}" for k, v in sorted(call.items()))


@contextlib.contextmanager
def _on(device, monkeypatch):
    """The current rules' view of `device`: its kind, and Hopper (compute capability 9.0) unless the CPU."""
    import pallas_kernels.bias_dropout_residual_layernorm as ln
    import pallas_kernels.bias_gelu as bg
    from pallas_kernels import _mgpu
    from pallas_kernels.attention import kernel_mgpu
    gpu = device != "cpu"
    with monkeypatch.context() as m:
        for module in (bg._k_mgpu, ln._k_mgpu, kernel_mgpu):
            m.setattr(module, "supported", lambda: gpu)
        m.setattr(_mgpu, "device_kind", lambda: DEVICE_KINDS[device])
        m.setattr(jax, "default_backend", lambda: "gpu" if gpu else "cpu")
        yield


def _asdict(blocks):
    return None if blocks is None else dataclasses.asdict(blocks)


def choice(op, call):
    """(implementation name, default blocks as a dict) that the rules pick for one call on the current device."""
    import pallas_kernels.bias_dropout_residual_layernorm as ln
    import pallas_kernels.bias_gelu as bg
    import pallas_kernels.embedding_layernorm as emb
    from jaxformer import ops
    from pallas_kernels.attention import kernel as att
    from pallas_kernels.mlm_loss import fused, kernel as mlm_kernel
    if op == "kernels":
        return ops.resolve(call["kernels"]), None
    dtype = jnp.dtype(call["dtype"])
    if op == "bias_gelu":
        (module, blocks), *_ = bg._PerShape.backends(jax.ShapeDtypeStruct((call["rows"], call["width"]), dtype),
                                                     call["rate"])
        return ("mosaic" if module is bg._k_mgpu else "triton"), _asdict(blocks)
    if op in ("bias_dropout_residual_layernorm", "layer_norm"):
        (module, blocks), *_ = ln._PerShape.backends(jax.ShapeDtypeStruct((call["rows"], call["width"]), dtype),
                                                     jnp.dtype(call["out_dtype"]), call["rate"])
        return ("mosaic" if module is ln._k_mgpu else "triton"), _asdict(blocks)
    if op == "attention_qkv":
        blocks = _asdict(att.default_block_sizes(call["seq"], call["head_dim"], call["seq"], dtype))
        mgpu_bwd, mgpu_fwd = blocks.pop("mgpu_bwd"), blocks.pop("mgpu_fwd")
        assert not mgpu_fwd
        return ("mosaic_bwd" if mgpu_bwd else "triton"), blocks
    if op == "mlm_cross_entropy":
        if fused.supported(dtype, call["vocab"], call["width"]):
            return "triton", _asdict(mlm_kernel.Blocks())
        return "chunked", None
    if op == "embedding_layernorm":
        assert not emb.tables_split(None)
        return "triton", _asdict(emb.kernel.default_blocks(call["rows"], call["width"], call["rate"]))
    raise KeyError(op)


@pytest.mark.parametrize("device", list(DEVICE_KINDS))
def test_every_model_call_runs_the_pinned_implementation_and_blocks(device, monkeypatch):
    with open(PINNED) as f:
        pinned = json.load(f)
    calls = {_key(op, call): (op, call) for op, call in model_calls()}
    assert set(calls) == set(pinned["choices"])  # the pin covers exactly the model's calls
    with _on(device, monkeypatch):
        for key, (op, call) in calls.items():
            impl, *blocks_id = pinned["choices"][key][device].split(" ")
            want = (impl, pinned["blocks"][blocks_id[0]] if blocks_id else None)
            assert choice(op, call) == want, key
