"""What every operator's tests share: tolerances by dtype, the comparison of an implementation's forward and VJP with
the reference's on fresh random inputs, and the implementations that can run a call on this machine.

On the CPU the Pallas kernels run in interpret mode (the math, not the lowering): Triton's always, Mosaic GPU's where
this jax has its interpret mode. The `gpu`-marked tests compile them.
"""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from pallas_kernels import _mgpu, registry
from pallas_kernels.registry import Device

TOL = {jnp.float32: 2e-5, jnp.bfloat16: 2e-2}
ON_GPU = jax.default_backend() == "gpu"
MOSAIC_INTERPRET = _mgpu.interpret_available()  # Mosaic GPU's interpret mode on the CPU
interpret_mosaic = pytest.mark.skipif(not MOSAIC_INTERPRET, reason="needs Mosaic GPU interpret mode on the CPU")
needs_hopper = pytest.mark.skipif(not Device.current().hopper, reason="needs a Hopper-or-newer GPU")


def rel(a, b) -> float:
    """Relative L2 error of `a` against `b` (in float64); `a` must be finite."""
    a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
    assert np.isfinite(a).all(), "non-finite values"
    return float(np.linalg.norm(a - b) / max(np.linalg.norm(b), 1e-30))


def check_vjp(fused, ref, args, dtype, key, tol=None):
    """Forward and VJP (a random cotangent from `key`) of `fused` equal `ref`'s on `args`, within the dtype's
    tolerance: the same dtypes and shapes, relative L2 error below `tol` (default `TOL[dtype]`)."""
    tol = TOL[dtype] if tol is None else tol
    with jax.default_matmul_precision("highest"):
        y, vjp = jax.vjp(fused, *args)
        y_ref, vjp_ref = jax.vjp(ref, *args)
        g = jax.random.normal(key, y.shape, y.dtype)
        grads, grads_ref = vjp(g), vjp_ref(g)
    assert y.dtype == y_ref.dtype and y.shape == y_ref.shape
    assert rel(y, y_ref) < tol, f"forward: {rel(y, y_ref)}"
    for i, (a, b) in enumerate(zip(grads, grads_ref)):
        assert a.shape == b.shape and a.dtype == b.dtype, i
        assert rel(a, b) < tol, f"gradient {i}: {rel(a, b)}"


def kernels_here(op: str, call) -> list[str]:
    """The names of `op`'s kernel implementations that can run `call` here: compiled on a GPU they support, or on the
    CPU in interpret mode where they support the call on an H200 (Mosaic GPU's only where this jax has it)."""
    names = []
    for name in registry.operator(op).order:
        impl = registry.operator(op).implementation(name)
        device = Device.current() if ON_GPU else registry.DEVICES["h200"]
        skip = impl.supports(call, device)
        if impl.kernel and (skip is None or skip.kind == "slower") and (
                ON_GPU or not name.startswith("mosaic") or MOSAIC_INTERPRET):
            names.append(name)
    return names
