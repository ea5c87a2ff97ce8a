"""Hugging Face interop: parity of outputs, loading paths, round trips and bad checkpoints."""

import json
import warnings

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

from jaxformer import BertConfig, BertForPreTraining  # noqa: E402
from jaxformer.hf import from_transformers, to_transformers  # noqa: E402

CONFIGS = [
    # odd sizes: hidden 96 with 6 heads (H=16), FF not a multiple of hidden, 3 segment types
    dict(vocab_size=101, hidden_size=96, num_hidden_layers=3, num_attention_heads=6, intermediate_size=200,
         max_position_embeddings=40, type_vocab_size=3, layer_norm_eps=1e-7),
    dict(vocab_size=257, hidden_size=64, num_hidden_layers=2, num_attention_heads=4, intermediate_size=256,
         max_position_embeddings=64, initializer_range=0.2),  # large init: logits far from zero
    dict(vocab_size=50, hidden_size=40, num_hidden_layers=1, num_attention_heads=5, intermediate_size=72,
         max_position_embeddings=24),
]


def _hf_model(cfg, seed, cls=None):
    torch.manual_seed(seed)
    model = (cls or transformers.BertForPreTraining)(transformers.BertConfig(**cfg)).eval()
    # HF initialises biases and layernorms to 0/1; randomise them so the test sees every parameter's role.
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("bias") or "LayerNorm" in name:
                p.add_(0.1 * torch.randn_like(p))
    return model


def _inputs(cfg, seed, b=3, s=17):
    rng = np.random.RandomState(seed)
    ids = rng.randint(0, cfg["vocab_size"], (b, s))
    types = rng.randint(0, cfg.get("type_vocab_size", 2), (b, s))
    mask = np.ones((b, s), np.int64)
    mask[1, 11:] = 0
    mask[2, 4:] = 0
    return ids, types, mask


def _hf_logits(model, ids, types, mask):
    with torch.no_grad():
        out = model(input_ids=torch.tensor(ids), token_type_ids=torch.tensor(types),
                    attention_mask=torch.tensor(mask))
    return out.prediction_logits.numpy(), out.seq_relationship_logits.numpy()


def _ours(model, ids, types, mask):
    out = model(jnp.asarray(ids), jnp.asarray(types), jnp.asarray(mask))
    return np.asarray(out.mlm_logits), np.asarray(out.nsp_logits)


def _assert_match(ours, theirs, mask):
    (mlm, nsp), (hf_mlm, hf_nsp) = ours, theirs
    real = mask.astype(bool)  # HF's outputs at padded positions are also defined; compare everything
    assert np.abs(hf_mlm).max() > 0.1  # non-trivial logits
    np.testing.assert_allclose(mlm, hf_mlm, atol=1e-4, rtol=0)
    np.testing.assert_allclose(nsp, hf_nsp, atol=1e-4, rtol=0)
    assert real.sum() > 0


@pytest.mark.slow
@pytest.mark.parametrize("index", range(len(CONFIGS)))
def test_parity_object_and_directory(index, tmp_path):
    cfg = CONFIGS[index]
    hf = _hf_model(cfg, seed=100 + index)
    ids, types, mask = _inputs(cfg, seed=index)
    theirs = _hf_logits(hf, ids, types, mask)
    _assert_match(_ours(from_transformers(hf, dtype=jnp.float32), ids, types, mask), theirs, mask)
    hf.save_pretrained(tmp_path)
    assert (tmp_path / "model.safetensors").exists()
    model = from_transformers(tmp_path, dtype=jnp.float32)
    assert model.config.hidden_size == cfg["hidden_size"] and model.config.dtype == "float32"
    _assert_match(_ours(model, ids, types, mask), theirs, mask)


def test_pytorch_bin_directory(tmp_path):
    cfg = CONFIGS[0]
    hf = _hf_model(cfg, seed=7)
    hf.config.to_json_file(tmp_path / "config.json")
    torch.save(hf.state_dict(), tmp_path / "pytorch_model.bin")
    ids, types, mask = _inputs(cfg, seed=7)
    _assert_match(_ours(from_transformers(tmp_path, dtype=jnp.float32), ids, types, mask),
                  _hf_logits(hf, ids, types, mask), mask)


@pytest.mark.slow
def test_round_trip_is_exact(tmp_path):
    cfg = BertConfig(**CONFIGS[0], dtype="float32")
    model = BertForPreTraining(cfg, rngs=nnx.Rngs(3))
    # Non-trivial values everywhere (biases and layernorms start at 0/1).
    state = nnx.state(model, nnx.Param)
    leaves = jax.tree.leaves(state)
    keys = jax.random.split(jax.random.key(4), len(leaves))
    nnx.update(model, jax.tree.unflatten(jax.tree.structure(state),
                                         [x + 0.1 * jax.random.normal(k, x.shape) for k, x in zip(keys, leaves)]))
    to_transformers(model, tmp_path)
    hf = transformers.BertForPreTraining.from_pretrained(tmp_path).eval()
    back = from_transformers(hf, dtype=jnp.float32)
    for (path, a), (_, b) in zip(jax.tree_util.tree_leaves_with_path(nnx.state(model, nnx.Param)),
                                 jax.tree_util.tree_leaves_with_path(nnx.state(back, nnx.Param))):
        a, b = np.asarray(a), np.asarray(b)
        if a.shape[0] == cfg.padded_vocab_size != cfg.vocab_size:  # the padded vocabulary rows are not exported
            np.testing.assert_array_equal(b[cfg.vocab_size:], 0, err_msg=str(path))
            a, b = a[:cfg.vocab_size], b[:cfg.vocab_size]
        np.testing.assert_array_equal(a, b, err_msg=str(path))
    ids, types, mask = _inputs(CONFIGS[0], seed=9)
    _assert_match(_ours(model, ids, types, mask), _hf_logits(hf, ids, types, mask), mask)


@pytest.mark.parametrize("cls,missing", [("BertForMaskedLM", "pooler, NSP head"),
                                          ("BertModel", "MLM head, NSP head")])
def test_missing_heads_are_named_and_encoder_matches(cls, missing):
    cfg = CONFIGS[2]
    hf = _hf_model(cfg, seed=5, cls=getattr(transformers, cls))
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        model = from_transformers(hf, dtype=jnp.float32)
    assert any(missing in str(w.message) for w in caught), [str(w.message) for w in caught]
    ids, types, mask = _inputs(cfg, seed=5)
    with torch.no_grad():
        kwargs = dict(input_ids=torch.tensor(ids), token_type_ids=torch.tensor(types),
                      attention_mask=torch.tensor(mask))
        base = hf.bert if cls == "BertForMaskedLM" else hf
        hidden = base(**kwargs).last_hidden_state.numpy()
    ours = model(jnp.asarray(ids), jnp.asarray(types), jnp.asarray(mask)).hidden_states
    np.testing.assert_allclose(np.asarray(ours), hidden, atol=1e-4)


def test_not_bert_and_bad_shapes_are_named(tmp_path):
    hf = _hf_model(CONFIGS[2], seed=1)
    hf.save_pretrained(tmp_path)
    config = json.loads((tmp_path / "config.json").read_text())

    (tmp_path / "config.json").write_text(json.dumps({**config, "model_type": "gpt2"}))
    with pytest.raises(ValueError, match="model_type='gpt2'"):
        from_transformers(tmp_path)

    (tmp_path / "config.json").write_text(json.dumps({**config, "intermediate_size": 80}))
    with pytest.raises(ValueError, match=r"intermediate\.dense\.weight.*\(72, 40\).*\(80, 40\)"):
        from_transformers(tmp_path)

    (tmp_path / "config.json").write_text(json.dumps({**config, "hidden_act": "relu"}))
    with pytest.raises(ValueError, match="hidden_act='relu'"):
        from_transformers(tmp_path)

    with pytest.raises(FileNotFoundError, match="config.json"):
        from_transformers(tmp_path / "nowhere")


def test_unknown_keys_are_named(tmp_path):
    from safetensors.numpy import save_file

    hf = _hf_model(CONFIGS[2], seed=2)
    hf.config.to_json_file(tmp_path / "config.json")
    tensors = {k: v.numpy() for k, v in hf.state_dict().items() if k != "cls.predictions.decoder.weight"}
    tensors["bert.encoder.layer.0.attention.self.rotary.weight"] = np.zeros((2, 2), np.float32)
    save_file(tensors, str(tmp_path / "model.safetensors"))
    with pytest.raises(ValueError, match="rotary"):
        from_transformers(tmp_path)


def test_bad_config_json_and_non_finite_weights_are_named(tmp_path):
    from safetensors.numpy import save_file

    config_file = tmp_path / "config.json"
    config_file.write_text("[1, 2]")
    with pytest.raises(ValueError, match=r"config\.json holds a JSON list, not an object"):
        from_transformers(tmp_path)
    config_file.write_text('{"model_type": "bert",')
    with pytest.raises(ValueError, match=r"config\.json is not valid JSON"):
        from_transformers(tmp_path)
    config_file.write_text(json.dumps({"model_type": "gpt2"}))  # no weights either: the config is named first
    with pytest.raises(ValueError, match="model_type='gpt2'"):
        from_transformers(tmp_path)

    hf = _hf_model(CONFIGS[2], seed=3)
    hf.config.to_json_file(config_file)
    tensors = {k: v.numpy().copy() for k, v in hf.state_dict().items() if k != "cls.predictions.decoder.weight"}
    tensors["bert.encoder.layer.0.output.dense.weight"][3, 4] = np.nan
    save_file(tensors, str(tmp_path / "model.safetensors"))
    with pytest.raises(ValueError, match=r"NaN or infinite values in 1 tensor\(s\).*layer\.0\.output\.dense\.weight"):
        from_transformers(tmp_path)
