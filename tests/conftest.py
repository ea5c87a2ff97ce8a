"""Test set-up: 8 virtual CPU devices (so sharding and pipelines are testable here) and the `gpu` marker."""

import os
import tempfile

# Must happen before JAX initialises its backends.
os.environ.setdefault("XLA_FLAGS", "")
# Kernels use their default block sizes in tests, never a user's autotune cache (tests/test_autotune.py sets its own).
os.environ.setdefault("JAXFORMER_AUTOTUNE", "off")
# Compiled programs go to a cache of this process's own (and its train.py subprocesses'), never the user's.
os.environ["JAX_COMPILATION_CACHE_DIR"] = tempfile.mkdtemp(prefix="jaxformer-test-xla-")
import jax  # noqa: E402

try:
    jax.config.update("jax_num_cpu_devices", 8)
except Exception:  # a backend already initialised (e.g. by a plugin): fall back to the XLA flag
    os.environ["XLA_FLAGS"] += " --xla_force_host_platform_device_count=8"

import pytest  # noqa: E402


def _has_gpu() -> bool:
    try:
        return any(d.platform == "gpu" for d in jax.devices())
    except RuntimeError:
        return False


def pytest_collection_modifyitems(config, items):
    if _has_gpu():
        return
    skip = pytest.mark.skip(reason="needs a GPU")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)
