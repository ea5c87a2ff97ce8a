"""An analytical performance and memory model of distributed BERT training (`python -m jaxformer.plan`).

Per strategy (data, fsdp, tensor, pipeline parallelism; microbatches and the circular schedule; remat; kernels) it
predicts the step time from the contractions and memory-bound bytes of a step, the collectives (alpha-beta over
NVLink and the inter-node network) and the pipeline bubble, and the memory per GPU (parameters, gradients,
optimizer state, activations, temporaries). docs/performance-model.md gives the equations and assumptions.
"""

from .hardware import PROFILES, Calibration, Hardware
from .memory import Memory
from .predict import Prediction, predict
from .search import Space, check, evaluate, search
from .workload import CPU, GPU, Backend, Strategy, Workload

__all__ = ["PROFILES", "Calibration", "Hardware", "Memory", "Prediction", "predict", "Space", "check",
           "evaluate", "search", "CPU", "GPU", "Backend", "Strategy", "Workload"]
