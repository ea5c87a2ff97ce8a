"""Hugging Face interop: load `transformers` BERT weights into `BertForPreTraining`, and write them back.

Checkpoints are data, not code: a directory is read from `model.safetensors` (single or sharded, read with
`safetensors.numpy`, no torch needed) or, failing that, `pytorch_model.bin` through
`torch.load(..., weights_only=True)`. Weights are written as safetensors.
"""

from __future__ import annotations

import json
import os
import warnings
from pathlib import Path
from typing import Any, Callable

import jax.numpy as jnp
import numpy as np
from flax import nnx

from .config import BertConfig
from .model import BertForPreTraining

# Hugging Face config fields that carry over to BertConfig unchanged.
_CONFIG_FIELDS = ("vocab_size", "hidden_size", "num_hidden_layers", "num_attention_heads", "intermediate_size",
                  "max_position_embeddings", "type_vocab_size", "layer_norm_eps", "hidden_dropout_prob",
                  "attention_probs_dropout_prob", "initializer_range")

_Array = np.ndarray


def _per_layer_table(cfg: BertConfig):
    """(jaxformer path under encoder.layers, HF key under encoder.layer.{l}, to_jax, to_hf) for one layer."""
    d, n, h = cfg.hidden_size, cfg.num_attention_heads, cfg.head_dim
    # torch Linear stores W as (out, in) and computes x @ W.T.
    return [
        (("attention", "out_kernel"), "attention.output.dense.weight",
         lambda w: w.T.reshape(n, h, d), lambda k: k.reshape(n * h, d).T),
        (("attention", "out_bias"), "attention.output.dense.bias", None, None),
        (("attention", "layer_norm", "scale"), "attention.output.LayerNorm.weight", None, None),
        (("attention", "layer_norm", "bias"), "attention.output.LayerNorm.bias", None, None),
        (("feed_forward", "in_kernel"), "intermediate.dense.weight", np.transpose, np.transpose),
        (("feed_forward", "in_bias"), "intermediate.dense.bias", None, None),
        (("feed_forward", "out_kernel"), "output.dense.weight", np.transpose, np.transpose),
        (("feed_forward", "out_bias"), "output.dense.bias", None, None),
        (("feed_forward", "layer_norm", "scale"), "output.LayerNorm.weight", None, None),
        (("feed_forward", "layer_norm", "bias"), "output.LayerNorm.bias", None, None),
    ]


# (jaxformer path, HF key without the "bert." prefix of the encoder part, to_jax, to_hf, group)
_GLOBAL_TABLE = [
    (("embeddings", "word"), "bert.embeddings.word_embeddings.weight", None, None, "embeddings"),
    (("embeddings", "position"), "bert.embeddings.position_embeddings.weight", None, None, "embeddings"),
    (("embeddings", "token_type"), "bert.embeddings.token_type_embeddings.weight", None, None, "embeddings"),
    (("embeddings", "layer_norm", "scale"), "bert.embeddings.LayerNorm.weight", None, None, "embeddings"),
    (("embeddings", "layer_norm", "bias"), "bert.embeddings.LayerNorm.bias", None, None, "embeddings"),
    (("pooler", "kernel"), "bert.pooler.dense.weight", np.transpose, np.transpose, "pooler"),
    (("pooler", "bias"), "bert.pooler.dense.bias", None, None, "pooler"),
    (("mlm_head", "kernel"), "cls.predictions.transform.dense.weight", np.transpose, np.transpose, "MLM head"),
    (("mlm_head", "bias"), "cls.predictions.transform.dense.bias", None, None, "MLM head"),
    (("mlm_head", "layer_norm", "scale"), "cls.predictions.transform.LayerNorm.weight", None, None, "MLM head"),
    (("mlm_head", "layer_norm", "bias"), "cls.predictions.transform.LayerNorm.bias", None, None, "MLM head"),
    (("mlm_head", "output_bias"), "cls.predictions.bias", None, None, "MLM head"),
    (("nsp_head", "kernel"), "cls.seq_relationship.weight", np.transpose, np.transpose, "NSP head"),
    (("nsp_head", "bias"), "cls.seq_relationship.bias", None, None, "NSP head"),
]

# Parameters stored with padded_vocab_size rows (BertConfig.padded_vocab_size); Hugging Face has vocab_size rows.
_VOCAB_PADDED = (("embeddings", "word"), ("mlm_head", "output_bias"))

# Keys Hugging Face keeps that carry no information of their own: buffers and the decoder tied to the embeddings.
_IGNORED = ("bert.embeddings.position_ids", "cls.predictions.decoder.weight", "cls.predictions.decoder.bias")


def _normalise_key(key: str) -> str:
    """Map any BERT checkpoint's key onto BertForPreTraining's naming (`bert.` prefix, weight/bias names)."""
    if not key.startswith(("bert.", "cls.")):
        key = "bert." + key  # BertModel saves its keys without the prefix
    return key.replace("LayerNorm.gamma", "LayerNorm.weight").replace("LayerNorm.beta", "LayerNorm.bias")


def _read_json(path: Path) -> dict[str, Any]:
    """A JSON object from `path`; ValueError naming the file if it is not one."""
    try:
        value = json.loads(path.read_text())
    except ValueError as e:  # JSONDecodeError and UnicodeDecodeError
        raise ValueError(f"{path} is not valid JSON: {e}") from None
    if not isinstance(value, dict):
        raise ValueError(f"{path} holds a JSON {type(value).__name__}, not an object")
    return value


def _read_config(path: Path) -> dict[str, Any]:
    config_file = path / "config.json"
    if not config_file.is_file():
        raise FileNotFoundError(f"{str(path)!r} has no config.json: not a Hugging Face model directory")
    return _read_json(config_file)


def _read_weights(path: Path) -> dict[str, _Array]:
    single, index, torch_bin = path / "model.safetensors", path / "model.safetensors.index.json", \
        path / "pytorch_model.bin"
    if single.is_file() or index.is_file():
        from safetensors.numpy import load_file
        weight_map = {} if single.is_file() else _read_json(index).get("weight_map")
        if not single.is_file() and not isinstance(weight_map, dict):
            raise ValueError(f"{index} has no \"weight_map\" object")
        files = [single] if single.is_file() else sorted({path / f for f in weight_map.values()})
        tensors = {}
        for f in files:
            tensors.update(load_file(str(f)))
    elif torch_bin.is_file():
        import torch  # only for pytorch_model.bin (a pickle), loaded without executing code from it

        state = torch.load(str(torch_bin), map_location="cpu", weights_only=True)
        tensors = {k: v.float().numpy() for k, v in state.items()}
    else:
        raise FileNotFoundError(f"{str(path)!r} has neither model.safetensors nor pytorch_model.bin")
    return tensors


def _read_object(model) -> tuple[dict[str, Any], dict[str, _Array]]:
    config = model.config.to_dict()
    tensors = {k: v.detach().cpu().float().numpy() for k, v in model.state_dict().items()}
    return config, tensors


def _config_from_hf(hf: dict[str, Any], overrides: dict[str, Any]) -> BertConfig:
    if hf.get("model_type") != "bert":
        raise ValueError(f"model_type={hf.get('model_type')!r}: not a BERT checkpoint")
    if hf.get("hidden_act", "gelu") != "gelu":
        raise ValueError(f"hidden_act={hf['hidden_act']!r} is not supported: jaxformer's BERT uses exact 'gelu'")
    if hf.get("position_embedding_type", "absolute") != "absolute":
        raise ValueError(f"position_embedding_type={hf['position_embedding_type']!r} is not supported "
                         "(only 'absolute')")
    if hf.get("is_decoder") or hf.get("add_cross_attention"):
        raise ValueError("is_decoder/add_cross_attention: only encoder BERT checkpoints are supported")
    fields = {k: hf[k] for k in _CONFIG_FIELDS if k in hf}
    fields.update(overrides)
    return BertConfig(**fields)


def _check_tensors(tensors: dict[str, _Array], expected: dict[str, tuple[int, ...]]):
    if "bert.embeddings.word_embeddings.weight" not in tensors:
        raise ValueError("not a BERT checkpoint: no embeddings.word_embeddings.weight among its keys "
                         f"(found e.g. {sorted(tensors)[:8]})")
    bad = [f"{k}: checkpoint {tuple(tensors[k].shape)} vs config {shape}"
           for k, shape in expected.items() if k in tensors and tuple(tensors[k].shape) != shape]
    if bad:
        raise ValueError("checkpoint shapes disagree with its config: " + "; ".join(bad))
    unknown = sorted(set(tensors) - set(expected) - set(_IGNORED))
    if unknown:
        raise ValueError(f"checkpoint has keys this BERT does not know: {unknown[:10]}"
                         f"{' ...' if len(unknown) > 10 else ''}")


def _hf_layout(cfg: BertConfig) -> dict[str, tuple[tuple, Callable | None, Callable | None, tuple[int, ...], str]]:
    """HF key -> (jaxformer path, to_jax, to_hf, HF shape, group). One entry per layer for the encoder."""
    d, f = cfg.hidden_size, cfg.intermediate_size
    shapes = {
        "bert.embeddings.word_embeddings.weight": (cfg.vocab_size, d),
        "bert.embeddings.position_embeddings.weight": (cfg.max_position_embeddings, d),
        "bert.embeddings.token_type_embeddings.weight": (cfg.type_vocab_size, d),
        "bert.pooler.dense.weight": (d, d), "cls.predictions.transform.dense.weight": (d, d),
        "cls.predictions.bias": (cfg.vocab_size,), "cls.seq_relationship.weight": (2, d),
        "cls.seq_relationship.bias": (2,),
    }
    layout = {}
    for path, key, to_jax, to_hf, group in _GLOBAL_TABLE:
        layout[key] = (path, to_jax, to_hf, shapes.get(key, (d,)), group)
    layer_shapes = {"attention.output.dense.weight": (d, d), "intermediate.dense.weight": (f, d),
                    "intermediate.dense.bias": (f,), "output.dense.weight": (d, f)}
    for layer in range(cfg.num_hidden_layers):
        prefix = f"bert.encoder.layer.{layer}."
        for path, key, to_jax, to_hf in _per_layer_table(cfg):
            layout[prefix + key] = (("encoder", "layers") + path, to_jax, to_hf,
                                    layer_shapes.get(key, (d,)), f"layer {layer}")
        for c, name in enumerate(("query", "key", "value")):
            for kind, shape in (("weight", (d, d)), ("bias", (d,))):
                layout[f"{prefix}attention.self.{name}.{kind}"] = (
                    ("encoder", "layers", "attention", f"qkv_{'kernel' if kind == 'weight' else 'bias'}"),
                    None, None, shape, f"layer {layer}")
    return layout


def from_transformers(src, *, seed: int = 0, **overrides) -> BertForPreTraining:
    """A `BertForPreTraining` holding the weights of a Hugging Face BERT.

    Args:
      src: a `transformers` `BertForPreTraining`, `BertForMaskedLM` or `BertModel` object, or the path of a directory
        written by `save_pretrained` (config.json with model.safetensors, or pytorch_model.bin).
      seed: seeds the initialisation of any head the checkpoint lacks (a `UserWarning` names them).
      **overrides: BertConfig fields to change, e.g. `dtype=jnp.float32` or `kernels="pallas"`.
    """
    if isinstance(src, (str, os.PathLike)):  # the config is checked before any weights are read
        config = _config_from_hf(_read_config(Path(src)), overrides)
        raw = _read_weights(Path(src))
    elif hasattr(src, "state_dict") and hasattr(src, "config"):
        fields, raw = _read_object(src)
        config = _config_from_hf(fields, overrides)
    else:
        raise TypeError(f"src must be a transformers BERT model or a directory path, got {type(src).__name__}")
    tensors = {_normalise_key(k): np.asarray(v, np.float32) for k, v in raw.items()}
    non_finite = sorted(k for k, v in tensors.items() if not np.isfinite(v).all())
    if non_finite:
        raise ValueError(f"checkpoint has NaN or infinite values in {len(non_finite)} tensor(s): {non_finite[:5]}"
                         f"{' ...' if len(non_finite) > 5 else ''}")
    layout = _hf_layout(config)
    _check_tensors(tensors, {k: v[3] for k, v in layout.items()})
    decoder = tensors.get("cls.predictions.decoder.weight")
    if decoder is not None and not np.array_equal(decoder, tensors["bert.embeddings.word_embeddings.weight"]):
        raise ValueError("cls.predictions.decoder.weight differs from bert.embeddings.word_embeddings.weight: "
                         "jaxformer ties the MLM decoder to the word embeddings")

    model = BertForPreTraining(config, rngs=nnx.Rngs(seed))
    state = nnx.state(model, nnx.Param)
    pure = nnx.to_pure_dict(state)
    missing_groups: list[str] = []
    updates: dict[tuple, Any] = {}
    for key, (path, to_jax, _, _, group) in layout.items():
        if key not in tensors:
            if group not in missing_groups:
                missing_groups.append(group)
            continue
        value = tensors[key] if to_jax is None else to_jax(tensors[key])
        if key.startswith("bert.encoder.layer."):
            layer = int(key.split(".")[3])
            if ".attention.self." in key:  # query/key/value -> component c of the DCNH / CNH arrays
                c = ("query", "key", "value").index(key.split(".")[-2])
                d, n, h = config.hidden_size, config.num_attention_heads, config.head_dim
                if key.endswith("weight"):
                    _stacked(updates, pure, path)[layer, :, c] = value.T.reshape(d, n, h)
                else:
                    _stacked(updates, pure, path)[layer, c] = value.reshape(n, h)
            else:
                _stacked(updates, pure, path)[layer] = value
        else:
            updates[path] = value
    if any(g.startswith("layer ") or g == "embeddings" for g in missing_groups):
        raise ValueError(f"checkpoint lacks encoder weights: {missing_groups}")
    for path, value in updates.items():
        if path in _VOCAB_PADDED:  # zero rows past vocab_size, as the model initialises them (no token reads them)
            pad = np.zeros((config.padded_vocab_size - config.vocab_size, *value.shape[1:]), value.dtype)
            value = np.concatenate([value, pad])
        _set_node(pure, path, jnp.asarray(value, config.parameter_dtype))
    nnx.replace_by_pure_dict(state, pure)
    nnx.update(model, state)
    if missing_groups:
        warnings.warn(f"from_transformers: the checkpoint has no {', '.join(missing_groups)}; "
                      f"initialised from seed {seed}", stacklevel=2)
    return model


def _stacked(updates, pure, path):
    """The writable numpy copy of the stacked (leading L axis) parameter at `path`, made once."""
    if path not in updates:
        updates[path] = _node(pure, path)
    return updates[path]


def _node(tree, path):
    for p in path:
        tree = tree[p]
    return np.array(tree)


def _set_node(tree, path, value):
    for p in path[:-1]:
        tree = tree[p]
    tree[path[-1]] = value


def hf_config(cfg: BertConfig) -> dict[str, Any]:
    """The Hugging Face `config.json` fields of `cfg` (`transformers.BertConfig(**hf_config(cfg))` builds the same
    architecture: what `to_transformers` writes, and benchmarks/compare_pytorch.py's PyTorch model)."""
    config = {k: getattr(cfg, k) for k in _CONFIG_FIELDS}
    config.update(model_type="bert", architectures=["BertForPreTraining"], hidden_act="gelu",
                  position_embedding_type="absolute", pad_token_id=0, tie_word_embeddings=True, dtype="float32")
    return config


def to_transformers(model: BertForPreTraining, directory) -> Path:
    """Write `model` as a directory that `transformers.BertForPreTraining.from_pretrained` loads.

    Writes `config.json` and `model.safetensors` (float32). Returns the directory's path.
    """
    from safetensors.numpy import save_file

    cfg = model.config
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    pure = nnx.to_pure_dict(nnx.state(model, nnx.Param))
    d, n, h = cfg.hidden_size, cfg.num_attention_heads, cfg.head_dim
    tensors: dict[str, _Array] = {}
    for key, (path, _, to_hf, _, _) in _hf_layout(cfg).items():
        value = _node(pure, path).astype(np.float32)
        if path in _VOCAB_PADDED:
            value = value[:cfg.vocab_size]
        if key.startswith("bert.encoder.layer."):
            value = value[int(key.split(".")[3])]
            if ".attention.self." in key:
                c = ("query", "key", "value").index(key.split(".")[-2])
                value = value[:, c].reshape(d, n * h).T if key.endswith("weight") else value[c].reshape(n * h)
        tensors[key] = np.ascontiguousarray(value if to_hf is None else to_hf(value))
    config = hf_config(cfg)
    # Write to temporary names first so an interrupted export never leaves a half-written model behind.
    tmp_weights, tmp_config = directory / "model.safetensors.tmp", directory / "config.json.tmp"
    save_file(tensors, str(tmp_weights), metadata={"format": "pt"})
    tmp_config.write_text(json.dumps(config, indent=2, sort_keys=True) + "\n")
    os.replace(tmp_weights, directory / "model.safetensors")
    os.replace(tmp_config, directory / "config.json")
    return directory
