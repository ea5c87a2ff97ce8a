"""Session 6: the optimized HLO of the encoder layer's fwd+bwd (kernels=pallas, BERT-large, B64 S128), written to
$OUT, and the defining lines of the non-GEMM, non-Pallas operators the profile showed (to name what they move)."""
import os
import re
import sys

import jax
import jax.numpy as jnp
from flax import nnx

from jaxformer import BertConfig
from jaxformer.model import EncoderLayer

b, s = int(sys.argv[1]), int(sys.argv[2])
key = jax.random.split(jax.random.key(0), 4)
x = jax.random.normal(key[0], (b, s, 1024), jnp.bfloat16)
mask = jnp.arange(s)[None, :] < jax.random.randint(key[1], (b, 1), s // 2, s + 1)
cfg = BertConfig.preset("large", dtype="bfloat16", kernels="pallas")
graphdef, state = nnx.split(EncoderLayer(cfg, rngs=nnx.Rngs(0)))


def step(x, state, dy):
    def f(x, state):
        return nnx.merge(graphdef, state)(x, mask, key=key[2], deterministic=False)
    y, vjp = jax.vjp(f, x, state)
    return vjp(dy)


text = jax.jit(step).lower(x, state, x).compile().as_text()
open(os.path.join(os.environ.get("OUT", "."), f"layer_pallas_B{b}_S{s}.hlo.txt"), "w").write(text)
entry = text[text.index("ENTRY"):]
want = re.compile(r"^\s*(\S*(transpose|slice|add|reduce|convert|copy|concatenate)\S*) = ")
for line in entry.splitlines():
    if want.match(line):
        print(line.strip()[:400])
