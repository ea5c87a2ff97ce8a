"""Session 22: the autotuner choosing BDRLN's backend under `backend="auto"` (JAXFORMER_AUTOTUNE=tune, a fresh cache
file): the rule's default and the other backend's are timed first, then the winner's candidates. Prints the cached
entry, then device time (session 21's method, `common.py`) of the rule's default and of the tuned choice.

    PYTHONPATH=. python benchmarks/gpu_scripts/session22/tune_backend.py [--shapes 32768x1024] [--rates 0.1]
"""
import json
import os
import tempfile

os.environ["JAXFORMER_AUTOTUNE"] = "tune"
os.environ["JAXFORMER_AUTOTUNE_CACHE"] = os.path.join(tempfile.mkdtemp(), "autotune.json")

import jax  # noqa: E402

from common import bdrln_inputs, fwd_bwd_time, header, keys, parse  # noqa: E402

import pallas_kernels.bias_dropout_residual_layernorm as bdrln  # noqa: E402


def main():
    a = parse("bdrln", shapes="32768x1024")
    key, seed = keys()
    for rows, d in a.shape_list:
        args = bdrln_inputs(key, rows, d)
        for rate in a.rate_list:
            def fn(*t, rate=rate, **kw):
                return bdrln.bias_dropout_residual_layernorm(*t, seed=seed, rate=rate, eps=1e-12, **kw)
            jax.block_until_ready(jax.jit(fn)(*args))  # traces, so tunes (progress on stderr)
            with open(os.environ["JAXFORMER_AUTOTUNE_CACHE"]) as f:
                entries = json.load(f)
            print(f"# {rows}x{d} p={rate}: cached {json.dumps(entries, sort_keys=True)}", flush=True)
            os.environ["JAXFORMER_AUTOTUNE"] = "off"  # the rule's default
            header("BDRLN fwd+bwd", a.calls, ["shape", "p", "blocks", "total", "fwd kernel", "bwd kernel"])
            for name, mode in (("the rule's default (off)", "off"), ("the tuned choice (cache)", "cache")):
                os.environ["JAXFORMER_AUTOTUNE"] = mode
                total, fwd, bwd, _ = fwd_bwd_time(fn, args, a.calls)
                print(f"| {rows}x{d} | {rate} | {name} | {total:.1f} | {fwd:.1f} | {bwd:.1f} |", flush=True)
            os.environ["JAXFORMER_AUTOTUNE"] = "tune"


if __name__ == "__main__":
    main()
