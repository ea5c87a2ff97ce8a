"""Fused operators of BERT, one folder each: `__init__.py` (the public functions), `impls.py` (the operator's
implementations in the order they are tried, and the per-shard call they judge), `kernel.py` (Triton kernels),
`kernel_mgpu.py` (Mosaic GPU kernels, Hopper+) and `reference.py` (pure jax.numpy, the ground truth).

`registry.py` chooses the implementation of every call (`python -m jaxformer.ops --table` lists them); `autotune.py`
may refine it by timing on the GPU; `timing.py` is the clock; `mesh.py` runs the kernels per shard.
"""
