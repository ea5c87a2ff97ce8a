"""Run a script with the session-6 flash backward (the dK/dV + dQ kernel pair) as the default at every length, for
same-run A/B against the one-kernel backward: python pair_bwd.py SCRIPT ARGS..."""
import dataclasses
import runpy
import sys

import pallas_kernels.attention as attention
from pallas_kernels.attention import kernel

_default = kernel.default_block_sizes


def _pair(*a, **kw):
    return dataclasses.replace(_default(*a, **kw), fused_bwd=False)


kernel.default_block_sizes = attention.default_block_sizes = _pair
sys.argv = sys.argv[1:]
runpy.run_path(sys.argv[0], run_name="__main__")
