"""Fused operators of BERT, one folder each: `__init__.py` (public function), `kernel.py` (Pallas kernel bodies,
added with the kernel work) and `reference.py` (pure jax.numpy, the ground truth).

`jaxformer.ops` is the one table that chooses an implementation for each operator.
"""
