"""Timing of the encoder layer's operators in given layouts (forward + backward), for `jaxformer.layout_search`.

Each operator is the model's own function from `jaxformer/layer.py` (or, for the XLA attention's three parts, the
same einsums and softmax that `pallas_kernels/attention/reference.py` runs), on random inputs of the preset's
shapes, with dropout on as in training, timed by `pallas_kernels.timing` (the autotuner's and the kernel
benchmarks' clock) as a forward + backward step.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from layouts import config as lc
from layouts.einsum import annotate, einsum, relayout
from pallas_kernels.dropout import seed_from_key
from pallas_kernels.softmax.reference import scaled_masked_softmax
from pallas_kernels.timing import grads_as_carry, time_step

from . import layer, ops
from .config import BertConfig
from .layer import EncoderLayer

# Which logical letters each graph tensor has (x1, x2 are stored like x; probs like scores).
LETTERS = dict(lc.LOGICAL, x1="BSD", x2="BSD", probs="BNST")


class Timer:
    def __init__(self, a):
        self.kernels = a.kernels or ops.resolve("auto")
        self.cfg = BertConfig.preset(a.config, dtype=a.dtype, kernels=self.kernels)
        if a.seq_len > self.cfg.max_position_embeddings:
            raise ValueError(f"--seq-len={a.seq_len} exceeds max_position_embeddings="
                             f"{self.cfg.max_position_embeddings}")
        cfg = self.cfg
        self.repeats, self.lengths, self.rotate = a.repeats, a.lengths, max(1, int(a.rotate_mb * 2**20))
        self.device, self.jax_version = jax.devices()[0].device_kind, jax.__version__
        self.dt = cfg.compute_dtype
        self.f = ops.select(self.kernels)
        self.pallas = self.kernels == "pallas"
        d, n, h, ff = cfg.hidden_size, cfg.num_attention_heads, cfg.head_dim, cfg.intermediate_size
        self.sizes = dict(B=a.batch_size, S=a.seq_len, T=a.seq_len, D=d, N=n, H=h, F=ff, C=3)
        # numpy's generator: one jax.random call per shape would compile a kernel per shape (seconds on a CPU).
        self.rng = np.random.default_rng(0)
        p = lambda *shape: jnp.asarray(0.02 * self.rng.standard_normal(shape), cfg.parameter_dtype)  # noqa: E731
        self.params = dict(qkv_kernel=p(d, 3, n, h), qkv_bias=p(3, n, h), out_kernel=p(n, h, d), out_bias=p(d),
                           in_kernel=p(d, ff), in_bias=p(ff), out2_kernel=p(ff, d), out2_bias=p(d),
                           ln_scale=1 + p(d), ln_bias=p(d))
        lengths = self.rng.integers(max(1, a.seq_len // 2), a.seq_len + 1, (a.batch_size, 1))
        self.mask = jnp.asarray(np.arange(a.seq_len)[None, :] < lengths)  # BT
        self.layer_key = jax.random.key(1)
        self.seed = seed_from_key(self.layer_key)
        self.attn_rate, self.hidden_rate = cfg.attention_probs_dropout_prob, cfg.hidden_dropout_prob

    def act(self, tensor: str, layout: str):
        """A random activation of graph tensor `tensor` stored in `layout`."""
        assert sorted(layout) == sorted(LETTERS[tensor]), (tensor, layout)
        return jnp.asarray(self.rng.standard_normal([self.sizes[c] for c in layout], np.float32), self.dt)

    def measure(self, fn, args) -> float:
        """Seconds per forward + backward of `fn` (every argument differentiable)."""
        return time_step(grads_as_carry(fn, len(args)), tuple(args), lengths=self.lengths, repeats=self.repeats,
                         rotate_bytes=self.rotate, max_copies=None, nan_on_failure=False)

    def op_time(self, name: str, reads: dict, writes: dict) -> float:
        P, f, dt, cfg = self.params, self.f, self.dt, self.cfg
        fields = {("x" if t in ("x1", "x2") else "scores" if t == "probs" else t): v
                  for t, v in {**reads, **writes}.items()}
        if name == "flash":
            fields.update(qkv=layer.FLASH_QKV, ctx=layer.FLASH_CTX)
        L = lc.LayoutConfig(**fields)
        eps = cfg.layer_norm_eps
        if name == "qkv_proj":
            fn = lambda x, w, b: layer.qkv_projection(annotate(x, L.x), kernel=w, bias=b, layouts=L,  # noqa: E731
                                                      dtype=dt).array
            args = (self.act("x", L.x), P["qkv_kernel"], P["qkv_bias"])
        elif name == "scores":
            def fn(qkv):
                q, k, _ = layer.split_qkv(annotate(qkv, L.qkv))
                return einsum(L.scores, q, k).array
            args = (self.act("qkv", L.qkv),)
        elif name == "softmax":
            def fn(s):
                return scaled_masked_softmax(s, self.mask, scale=self.sizes["H"] ** -0.5, seed=self.seed,
                                             rate=self.attn_rate, layout=L.scores)
            args = (self.act("scores", L.scores),)
        elif name == "context":
            def fn(probs, qkv):
                _, _, v = layer.split_qkv(annotate(qkv, L.qkv))
                return einsum(L.ctx, annotate(probs, L.scores), v).array
            args = (self.act("probs", L.scores), self.act("qkv", L.qkv))
        elif name == "flash":
            def fn(qkv):
                return layer.attention(annotate(qkv, L.qkv), self.mask, ops=f, pallas=True, layouts=L,
                                       seed=self.seed, rate=self.attn_rate).array
            args = (self.act("qkv", L.qkv),)
        elif name == "attn_out":
            def fn(a, w, b, x, scale, shift):
                return layer.attention_output(annotate(a, L.ctx), annotate(x, L.x), ops=f, kernel=w, bias=b,
                                              ln_scale=scale, ln_bias=shift, layouts=L, dtype=dt, seed=self.seed,
                                              rate=self.hidden_rate, eps=eps).array
            args = (self.act("ctx", L.ctx), P["out_kernel"], P["out_bias"], self.act("x", L.x), P["ln_scale"],
                    P["ln_bias"])
        elif name == "ffn_out":  # the GELU (its bias, in_bias) with the product and BDRLN after it
            def fn(z, b_in, w, b, x, scale, shift):
                return layer.ffn_output(annotate(z, L.h), annotate(x, L.x), ops=f, in_bias=b_in, kernel=w, bias=b,
                                        ln_scale=scale, ln_bias=shift, layouts=L, dtype=dt, seed=self.seed,
                                        rate=self.hidden_rate, eps=eps).array
            args = (self.act("h", L.h), P["in_bias"], P["out2_kernel"], P["out2_bias"], self.act("x", L.x),
                    P["ln_scale"], P["ln_bias"])
        elif name == "ffn_in":
            def fn(x, w):
                return layer.ffn_intermediate(annotate(x, L.x), kernel=w, layouts=L, dtype=dt).array
            args = (self.act("x", L.x), P["in_kernel"])
        else:
            raise ValueError(f"unknown operator {name!r}")
        return self.measure(fn, args)

    def transpose_time(self, tensor: str, src: str, dst: str) -> float:
        return self.measure(lambda t: relayout(annotate(t, src), dst).array, (self.act(tensor, src),))

    def layer_time(self, L: lc.LayoutConfig) -> float:
        """The whole encoder layer (the model's EncoderLayer in layouts `L`), forward + backward, dropout on."""
        cfg = self.cfg.replace(layouts=L)
        if not hasattr(self, "_layer_state"):  # the same parameters for every layout (their shapes do not change)
            self._layer_state = nnx.split(EncoderLayer(cfg, rngs=nnx.Rngs(0)))[1]
        state = self._layer_state
        graphdef = nnx.split(nnx.eval_shape(lambda: EncoderLayer(cfg, rngs=nnx.Rngs(0))))[0]

        def run(x, state):
            return nnx.merge(graphdef, state)(x, self.mask, key=self.layer_key, deterministic=False)
        return self.measure(run, (self.act("x", L.x), state))
