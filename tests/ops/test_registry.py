"""The implementation each operator runs, and its default blocks, for every per-shard call of BERT's model.

`pinned_choices.json` holds what the rules chose for every BERT-base/large call (S = 128 and 512; batch 64, 16, 32 on
one device and on data=2; dropout 0 and 0.1; bfloat16 and float32) on an H200, an H100 and the CPU: the same kernels
with the same blocks must run after any change to how the choice is made.
"""

import dataclasses
import json
import logging
import math
import os

import jax
import jax.numpy as jnp
import pytest

import pallas_kernels.attention as attention
import pallas_kernels.bias_dropout_residual_layernorm as bdrln
import pallas_kernels.bias_gelu as bias_gelu
import pallas_kernels.embedding_layernorm as embedding
import pallas_kernels.gelu_dense as gelu_dense
import pallas_kernels.mlm_loss as mlm_loss
from jaxformer import ops
from pallas_kernels import registry
from pallas_kernels.registry import Device

PINNED = os.path.join(os.path.dirname(__file__), "pinned_choices.json")
CALLS = {"embedding_layernorm": embedding.Call, "bias_dropout_residual_layernorm": bdrln.Call,
         "bias_gelu": bias_gelu.Call, "gelu_dense": gelu_dense.Call, "mlm_cross_entropy": mlm_loss.Call}
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
                                ("gelu_dense", dict(rows=b * s, width=f, depth=d, dtype=dtype)),  # feed-forward
                                ("bias_gelu", dict(rows=b * s, width=f, dtype=dtype, rate=0.0)),  # its split form
                                ("bias_gelu", dict(rows=b * p, width=d, dtype=dtype, rate=0.0)),  # MLM head
                                ("layer_norm", dict(rows=b * p, width=d, dtype=dtype, out_dtype=dtype, rate=0.0)),
                                ("mlm_cross_entropy", dict(rows=b * p, vocab=PADDED_VOCAB, width=d, dtype=dtype)),
                            ]
    calls.append(("kernels", dict(kernels="auto")))
    return calls


def _key(op, call):
    return op + " " + " ".join(f"{k}={v}" for k, v in sorted(call.items()))


def _asdict(blocks):
    return None if blocks is None else dataclasses.asdict(blocks)


def choice(op, call, device):
    """(implementation name, default blocks as a dict) that the registry picks for one call on `device`."""
    if op == "kernels":
        return ops.resolve(call["kernels"], device), None
    if op == "attention_qkv":
        call = attention.impls.Call(call["batch"], call["seq"], call["seq"], call["heads"], call["head_dim"],
                                    call["dtype"], call["rate"], packed=True)
    elif op == "layer_norm":
        call = bdrln.Call(**call, bias=False, residual=False)
    else:
        call = CALLS[op](**call)
    chosen = registry.choose(op, call, device, log_skips=False)
    return chosen.impl.name, _asdict(chosen.config)


@pytest.mark.parametrize("device", ["h200", "h100", "cpu"])
def test_every_model_call_runs_the_pinned_implementation_and_blocks(device):
    with open(PINNED) as f:
        pinned = json.load(f)
    calls = {_key(op, call): (op, call) for op, call in model_calls()}
    assert set(calls) == set(pinned["choices"])  # the pin covers exactly the model's calls
    for key, (op, call) in calls.items():
        impl, *blocks_id = pinned["choices"][key][device].split(" ")
        want = (impl, pinned["blocks"][blocks_id[0]] if blocks_id else None)
        assert choice(op, call, Device.named(device)) == want, key


def test_model_calls_are_the_calls_the_operators_form():
    """The calls `python -m jaxformer.ops` enumerates for a model are the ones its operators ask the registry about
    when the train step's forward and backward are traced under a data=2 mesh (per-shard rows and batch)."""
    from flax import nnx
    from jaxformer import BertConfig, BertForPreTraining, sharding
    from jaxformer.ops.__main__ import model_calls
    cfg = BertConfig.preset("tiny", dtype="bfloat16", vocab_size=200, max_position_embeddings=32, kernels="pallas")
    b, s, p = 4, 32, 5
    model = BertForPreTraining(cfg, rngs=nnx.Rngs(0))
    graphdef, params, rest = nnx.split(model, nnx.Param, ...)
    ids = jnp.zeros((b, s), jnp.int32)
    pos, labels = jnp.zeros((b, p), jnp.int32), jnp.zeros((b, p), jnp.int32)

    def loss(params):
        out = nnx.merge(graphdef, params, rest)(ids, ids, jnp.ones_like(ids), pos, deterministic=False,
                                         dropout_key=jax.random.key(0), masked_labels=labels)
        return jnp.sum(out.mlm_nll) + jnp.sum(out.nsp_logits)

    asked = []
    real = registry.choose
    record = lambda op, call, *a, **k: (asked.append((op, call)) if k.get("impl") is None else None,  # noqa: E731
                                         real(op, call, *a, **k))[1]
    with pytest.MonkeyPatch.context() as m, jax.set_mesh(sharding.make_mesh("data=2", jax.devices()[:2])):
        m.setattr(registry, "choose", record)
        jax.make_jaxpr(jax.grad(loss))(params)
        want = {(op, call) for _, op, call in model_calls(cfg, b, s, {"data": 2}, max_predictions=p)}
    assert set(asked) == want


# --- the chooser -----------------------------------------------------------------------------------------------------

def _row_call(rows=8192, width=1024, rate=0.1):
    return bdrln.Call(rows, width, "bfloat16", "bfloat16", rate)


def test_device_presets_and_the_current_device():
    assert Device.named("h200").hopper and Device.named("h100").hopper and not Device.named("cpu").hopper
    assert Device.current() == Device.named("current")
    if jax.default_backend() != "gpu":
        assert not Device.current().hopper
    with pytest.raises(ValueError, match="device 'a100' must be 'current' or one of"):
        Device.named("a100")


def test_the_first_supporting_implementation_runs_unless_one_is_named():
    op, h200 = "bias_dropout_residual_layernorm", Device.named("h200")
    choice = registry.choose(op, _row_call(), h200, log_skips=False)
    assert choice.impl.name == "mosaic" and choice.skipped == ()
    assert choice.config == bdrln.kernel_mgpu.default_blocks(8192, 1024, 0.1)
    named = registry.choose(op, _row_call(), h200, impl="triton")
    assert named.impl.name == "triton" and named.config == bdrln.kernel.default_blocks(8192, 1024, 0.1)
    assert registry.choose(op, _row_call(), h200, impl="xla").impl.fn is bdrln.reference.bias_dropout_residual_layernorm
    # A named implementation must run the call: a "slower" rule does not stop it, the device does unless interpreted.
    assert registry.choose(op, _row_call(rows=16), h200, impl="mosaic").impl.name == "mosaic"
    with pytest.raises(ValueError, match="impl='mosaic' does not run .* needs a Hopper"):
        registry.choose(op, _row_call(), Device.named("cpu"), impl="mosaic")
    assert registry.choose(op, _row_call(), Device.named("cpu"), impl="mosaic", interpret=True).impl.name == "mosaic"
    with pytest.raises(ValueError, match="impl='mosaic' does not run .* width=1000"):
        registry.choose(op, _row_call(width=1000), h200, impl="mosaic", interpret=True)
    with pytest.raises(ValueError, match=r"impl='cuda' must be one of \['mosaic', 'triton', 'xla'\]"):
        registry.choose(op, _row_call(), h200, impl="cuda")
    with pytest.raises(ValueError, match="operator 'gelu' must be one of"):
        registry.choose("gelu", _row_call(), h200)


def test_every_operator_ends_its_order_with_xla():
    """The reference always runs: the last resort of every order (the MLM loss tries its pure-JAX chunks before)."""
    for name, op in registry.operators().items():
        assert op.order[-1] == "xla" and op.implementation(op.order[0]).kernel, name
    with pytest.raises(ValueError, match="must be unique, include 'xla'"):
        registry.Operator("x", "", (bdrln.impls.TRITON,), ("triton",))


def test_a_fallback_is_logged_once_per_operator_and_reason(caplog, monkeypatch):
    """Leaving the Pallas kernels (the fused MLM loss at float32: the chunked loss) is a warning; a kernel skipped for
    another kernel (Mosaic GPU below its rows) is logged at info level; each reason once per process."""
    monkeypatch.setattr(registry, "_LOGGED", set())
    f32 = mlm_loss.Call(1280, 30592, 1024, "float32")
    with caplog.at_level(logging.INFO, logger="pallas_kernels"):
        for _ in range(3):
            assert registry.choose("mlm_cross_entropy", f32, Device.named("h100")).impl.name == "chunked"
            registry.choose("bias_dropout_residual_layernorm", _row_call(rows=4096), Device.named("h200"))
        registry.choose("mlm_cross_entropy", mlm_loss.Call(1280, 30592, 8, "bfloat16"), Device.named("h100"))
    records = [(r.levelno, r.getMessage()) for r in caplog.records]
    assert records == [
        (logging.WARNING, "mlm_cross_entropy: triton skipped (h.dtype=float32 must be bfloat16 or float16 (a Triton "
                          "dot on float32 rounds through TF32)); running chunked"),
        (logging.INFO, "bias_dropout_residual_layernorm: mosaic skipped (rows=4096 < 8192: Triton measured faster "
                       "there); running triton"),
        (logging.WARNING, "mlm_cross_entropy: triton skipped (width D=8 must be a multiple of 16 (a Triton dot's "
                          "smallest tile)); running chunked"),
    ]


def test_describe_says_what_runs_and_why():
    choice = registry.choose("layer_norm", bdrln.Call(1280, 1024, "bfloat16", "bfloat16", 0.0, False, False),
                             Device.named("h200"), log_skips=False)
    lines = registry.describe(choice)
    assert lines[0].startswith("runs triton with Blocks(") and lines[1:] == [
        "skipped mosaic: rows=1280 < 8192: Triton measured faster there"]


# --- jaxformer.ops ---------------------------------------------------------------------------------------------------

def test_select_gives_the_references_or_the_dispatching_entries():
    xla, pallas = ops.select("xla"), ops.select("pallas")
    assert xla.bias_gelu is bias_gelu.reference.bias_gelu and pallas.bias_gelu is bias_gelu.bias_gelu
    assert xla.attention is attention.reference.attention
    assert xla.mlm_cross_entropy is mlm_loss.reference.mlm_cross_entropy
    assert pallas.mlm_cross_entropy is mlm_loss.mlm_cross_entropy
    assert ops.select("auto").bias_gelu is ops.select(ops.resolve("auto")).bias_gelu
    with pytest.raises(ValueError, match="kernels='cuda' must be one of"):
        ops.select("cuda")


def test_auto_is_pallas_on_a_gpu_except_with_sequence_parallelism():
    from jaxformer import sharding
    gpu = Device.named("h100")
    assert ops.resolve("auto") == ("pallas" if jax.default_backend() == "gpu" else "xla")
    assert ops.resolve("auto", Device.named("cpu")) == "xla"
    assert ops.resolve("auto", gpu) == "pallas" and ops.resolve("xla", gpu) == "xla"
    with jax.set_mesh(sharding.make_mesh("data=4,pipeline=2", jax.devices()[:8])):
        # Pipelines too: batch_shard_map shard_maps them (measured faster: benchmarks/results/distributed-2xh200.md)
        assert ops.resolve("auto", gpu) == "pallas"
    with jax.set_mesh(sharding.make_mesh("data=8", jax.devices()[:8])):
        assert ops.resolve("auto", gpu) == "pallas"
        with sharding.sequence_parallel():  # S split over tensor: the kernels' shard_map splits only B
            assert ops.resolve("auto", gpu) == "xla"
            assert ops.resolve("pallas", gpu) == "pallas"  # an explicit choice is kept


def test_the_docstring_table_is_the_registrys():
    assert ops.table() in ops.__doc__


def test_cli_prints_what_each_call_runs_and_why(capsys):
    from jaxformer.ops.__main__ import main
    assert main(["--config", "large", "--seq-len", "128", "--batch-size", "64", "--gpu", "h100", "--mesh",
                 "data=2"]) == 0
    out = capsys.readouterr().out
    assert "NVIDIA H100" in out and "kernels=auto -> pallas" in out
    assert "attention_qkv                    runs mosaic_bwd (batch=32, seq_q=128" in out
    assert "layer_norm                       runs triton (rows=640," in out
    assert "mosaic skipped: rows=640 < 8192: Triton measured faster there" in out
    assert main(["--table"]) == 0 and capsys.readouterr().out.strip() == ops.table()
    assert main(["--gpu", "cpu", "--dtype", "float32"]) == 0
    assert "runs xla" in capsys.readouterr().out  # auto on the CPU: the references
    for bad in (["--mesh", "data=-1"], ["--batch-size", "63", "--mesh", "data=2"], ["--gpu", "a100"],
                ["--config", "huge"], ["--seq-len", "1024"]):
        assert main(bad) == 2, bad
        assert capsys.readouterr().err.startswith("python -m jaxformer.ops: ")
