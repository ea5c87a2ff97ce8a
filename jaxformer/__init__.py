"""jaxformer: BERT pre-training in JAX/XLA with data movement as the first-class cost.

Public API::

    from jaxformer import BertConfig, BertForPreTraining
    from jaxformer.hf import from_transformers, to_transformers
"""

from .config import BertConfig
from .model import BertForPreTraining, PreTrainingOutput

__all__ = ["BertConfig", "BertForPreTraining", "PreTrainingOutput"]
__version__ = "0.1.0"
