"""Session 29: BDRLN's Mosaic GPU backward with its dropout mask drawn twice (`Blocks.bwd_redraw_mask`) against the
reference, compiled (tests/test_mgpu.py's `_bdrln_case`), at the A/B's shapes."""
import dataclasses
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "..", "..", "tests"))
import jax.numpy as jnp  # noqa: E402
import test_mgpu  # noqa: E402
from pallas_kernels.bias_dropout_residual_layernorm import kernel_mgpu  # noqa: E402

for rows, width in ((8192, 768), (8192, 1024), (16384, 768)):
    blocks = dataclasses.replace(kernel_mgpu.default_blocks(rows, width, rate=0.1), bwd_redraw_mask=True)
    test_mgpu._bdrln_case(rows, width, jnp.bfloat16, 0.1, 64, interpret=False, blocks=blocks)
    print(f"{rows}x{width} bwd_redraw_mask=True: matches the reference", flush=True)
