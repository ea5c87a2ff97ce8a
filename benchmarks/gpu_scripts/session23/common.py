"""Session 23's scripts reuse session 22's device-time plumbing (`session22/common.py`: session 21's method, the
profiler's kernel time per call on rotated inputs)."""
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "session22"))
from common import (SHAPES, bdrln_inputs, cold_profile, copy_device_time, fwd_bwd_time, header, keys,  # noqa: E402,F401
                    parse, split)
