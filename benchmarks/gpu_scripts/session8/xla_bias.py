"""Run a script with the Q/K/V bias added by XLA to the projection's output (the code before session 8's AIB fusion)
instead of inside flash attention: `python xla_bias.py SCRIPT ARGS...` (an A/B of the fusion, same everything else)."""
import runpy
import sys

from layouts import layer
from layouts.einsum import Annotated, expand

_attention = layer.attention


def _attention_bias_by_xla(f, pallas, qkv, mask, L, *, seed, rate, qkv_bias=None):
    if qkv_bias is not None:  # exactly qkv_projection's add, in the stored qkv layout
        qkv = Annotated(qkv.array + expand(qkv_bias, "CNH", qkv.layout), qkv.layout)
    return _attention(f, pallas, qkv, mask, L, seed=seed, rate=rate)


layer.attention = _attention_bias_by_xla
print("Q/K/V bias added by XLA (not in flash attention)", file=sys.stderr)
sys.argv = sys.argv[1:]
runpy.run_path(sys.argv[0], run_name="__main__")
