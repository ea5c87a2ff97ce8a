"""Session 23: BDRLN's Mosaic GPU forward drawing each tile's dropout mask one step ahead (a loop carry,
`Blocks.fwd_mask_ahead`) or in the tile's own step, alternating over rounds, forward kernel device time on rotated
inputs, p = 0.1 (`session22/common.py`).

    PYTHONPATH=. python benchmarks/gpu_scripts/session23/ab_mask_ahead.py [--rounds 3] [--shapes 8192x768,...]
"""
import os
import sys

sys.path.insert(0, os.path.dirname(__file__))
from ab_fwd_steps import alternate  # noqa: E402


def main():
    alternate("the mask drawn", "fwd_mask_ahead", (False, True), ["in its step", "a step ahead"],
              shapes="2048x768,8192x768,8192x1024,32768x768,32768x1024", rate=0.1)


if __name__ == "__main__":
    main()
