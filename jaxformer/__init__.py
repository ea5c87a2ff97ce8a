"""jaxformer: BERT pre-training in JAX/XLA with data movement as the first-class cost.

Public API::

    from jaxformer import BertConfig, BertForPreTraining
    from jaxformer.hf import from_transformers, to_transformers

A training run starts at `train.py` -> `jaxformer.trainer.train`; a batch's path to the optimizer is described in
`jaxformer/trainer.py`. The names below load on first use, so `import jaxformer.config` (train.py's `--help`) does
not build the model code.
"""

__all__ = ["BertConfig", "BertForPreTraining", "PreTrainingOutput"]
__version__ = "0.1.0"

_LAZY = {"BertConfig": "config", "BertForPreTraining": "model", "PreTrainingOutput": "model"}


def __getattr__(name: str):
    if name in _LAZY:
        import importlib
        return getattr(importlib.import_module(f".{_LAZY[name]}", __name__), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
