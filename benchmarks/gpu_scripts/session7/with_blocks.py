"""Run a script with the flash attention block sizes of a JSON file {T: BlockSizes fields} (fused_tune.py's
best_blocks.json) as the defaults at those key lengths: python with_blocks.py FILE SCRIPT ARGS..."""
import json
import runpy
import sys

import pallas_kernels.attention as attention
from pallas_kernels.attention import kernel

_default = kernel.default_block_sizes
_chosen = {int(t): kernel.BlockSizes(**kw) for t, kw in json.load(open(sys.argv[1])).items()}


def _blocks(s, h, t=None):
    t = s if t is None else t
    return _chosen.get(t) if t == s and h == 64 and t in _chosen else _default(s, h, t)


kernel.default_block_sizes = attention.default_block_sizes = _blocks
print(f"flash block sizes from {sys.argv[1]}: {_chosen}", file=sys.stderr)
sys.argv = sys.argv[2:]
runpy.run_path(sys.argv[0], run_name="__main__")
