"""Fused operators' implementations (`pallas_kernels.registry`) against XLA's fusion of the same reference math,
forward and forward+backward.

    PYTHONPATH=. python benchmarks/kernels.py                     # every operator, BERT-base/large shapes
    PYTHONPATH=. python benchmarks/kernels.py --ops bdrln --tune  # also try the registry's tunable candidates
    PYTHONPATH=. python benchmarks/kernels.py --ops bias_gelu,bdrln --impls triton,mosaic  # Triton vs Mosaic GPU
    PYTHONPATH=. python benchmarks/kernels.py --ops attention --peers  # with cuDNN (jax.nn.dot_product_attention)
    PYTHONPATH=. python benchmarks/kernels.py --ops attention,layer_norm,mlm_loss --peers --passes fwd+bwd  # + tokamax
    PYTHONPATH=. python benchmarks/kernels.py --ops mlm_loss      # MLM cross-entropy: logits, chunks, fused kernels
    PYTHONPATH=. python benchmarks/kernels.py --ops mlm_loss --passes fwd+bwd --device-time 20 --mlm-table 30592 \
        --breakdown 8                                             # on the model's padded table, its kernels listed
    PYTHONPATH=. python benchmarks/kernels.py --ops embedding     # the embedding block: XLA vs its fused kernels
    PYTHONPATH=. python benchmarks/kernels.py --ops bdrln,bias_gelu --passes fwd+bwd --device-time 20  # device time
    PYTHONPATH=. python benchmarks/kernels.py --ops gelu_dense --passes fwd+bwd --device-time 20 --breakdown 6

Rows: every implementation the registry has for the operator that runs the case on this device (named by
`--impls`: xla, triton, mosaic, mosaic_bwd, chunked; `python -m jaxformer.ops --table` lists them), the XLA
reference always (the baseline), plus a few variants beside them (the MLM loss's chunk widths, tile shapes and
stored-probabilities backward, `triton-stored-bf16|f16|f32`; the unfused softmax kernel) and, with `--peers`, other
libraries' attention (cuDNN and XLA through `jax.nn.dot_product_attention`, without dropout; JAX's own Mosaic GPU
flash attention, without a mask) and, where
`tokamax` imports (openxla's kernel library, jax >= 0.11.1: `pip install -e ".[peers]"`, or offline the wheels in
shared/peers: `eval "$(bash shared/peers/install.sh)"`), tokamax's attention (`tokamax-mosaic|triton|cudnn|xla`,
with the key mask, without dropout), layer norm (`tokamax-triton|xla`) and linear + softmax cross-entropy
(`tokamax-xla|chunked_xla-nobias`: no output bias). A peer that does not import or run here prints a skip line with
the reason; a row whose math differs from the reference says how in its name (`-nomask`, `-nobias`) and is not
checked against it.

Timing (DESIGN.md): `n` iterations chained inside one jit (each consumes the previous one's outputs, so nothing is
dead code, and an `optimization_barrier` between them keeps XLA from fusing one iteration into the next), for
n = N1 and N2; the time per iteration is (T(N2) - T(N1)) / (N2 - N1), which cancels the dispatch and launch
overhead of the call; median of `--repeats`. Inputs are random and larger than L2.
`--device-time CALLS` (a GPU) times each operator instead by its kernels' device time under the profiler: CALLS
unchained calls, each on the next of K copies of the inputs (K x bytes >= 180 MB, so no call finds its operands in
L2), the kernels' time per call summed (launch gaps left out). On an H200 timed chains of a ~50-150 us operator
moved by 10-20% between processes where device time moved by 1-2% (benchmarks/results/kernels-h200.md, method).
Bytes are what each operator must move (each input read once, each output written once); GB/s is against the copy
bandwidth of `y = x + 1` over 256 MB buffers measured in the same run.
"""

from __future__ import annotations

import argparse
import dataclasses
import itertools
import json
import logging
import os
import sys

import jax
import jax.numpy as jnp

import pallas_kernels.bias_dropout_residual_layernorm as bdrln
import pallas_kernels.bias_gelu as bias_gelu
import pallas_kernels.gelu_dense as gelu_dense
import pallas_kernels.softmax as softmax
from pallas_kernels import autotune, registry
from pallas_kernels.dropout import seed_from_key
from pallas_kernels.mlm_loss import kernel as mlm_kernel
from pallas_kernels.timing import grads_as_carry, time_step

N1, N2 = 2, 10
ROTATE_BYTES = [180 * 2**20]  # rotate inputs over at least this many bytes (--scale shrinks it)


def per_iteration(step, carry, repeats, min_bytes=None, lengths=None):
    """Seconds per `step` (carry -> carry) iteration, by the difference of two chained run lengths
    (`pallas_kernels.timing.time_step`, which the autotuner times its candidates with too).

    The inputs are rotated: K copies of `carry` (K x its bytes >= `min_bytes`, three times the H200's 60 MB L2),
    iteration i consumes copy i % K's previous output, so no iteration finds its operands in L2.
    `lengths` = (N1, N2) overrides the two run lengths (shorter ones compile faster: jaxformer/layout_search.py).
    """
    return time_step(step, carry, lengths=lengths or (N1, N2), repeats=repeats,
                     rotate_bytes=min_bytes or ROTATE_BYTES[0], max_copies=None, nan_on_failure=False)


def copy_bandwidth(repeats, scale=1):
    """Bytes per second of XLA's `y = x + 1` over a 256 MB float32 buffer (read + written): on a GPU its device time
    under the profiler (two buffers alternating, so neither is in L2), elsewhere timed as the operators are.

    float32, not bfloat16: XLA's bf16 element-wise loop reads an H200's memory 16-24% slower than its fp32 one over
    the same bytes (3199 vs 4077 GB/s; PyTorch's device copy 4192; on an H100 5-13% slower), so a bf16 probe would
    understate the copy bandwidth and overstate every "% of copy BW". Device time, not a timed chain: on an H200 the
    chain read 3291, 3749 and 4684 GB/s in three processes and the device time 4230-4261 in seven, so the
    percentages against it are conservative for the timed operators (their time includes launch gaps;
    benchmarks/results/kernels-h200.md, method).
    """
    x = jax.random.normal(jax.random.key(0), (64 * 1024 * 1024 // scale,), jnp.float32)  # 256 MB
    if jax.default_backend() == "gpu":  # two buffers alternating, 20 calls
        return 2 * x.nbytes / device_time(lambda a: a[0] + 1, (x,), 20, min_bytes=2 * x.nbytes)
    t = per_iteration(lambda x: (x[0] + 1,), (x,), repeats)
    return 2 * x.nbytes / t


def _new_outputs(step):
    """`step` returning only the outputs it computes: not an input passed through (a step's carry; the "fwd" pass
    passes every argument but the first) and not an array it already returns (BDRLN's d_residual is dx without
    dropout). A compiled function copies each of those into an output buffer of its own (a `copy` kernel in the
    profile), which no model makes and `device_time`, discarding the outputs, does not need."""
    def run(args):
        seen = {id(a) for a in jax.tree.leaves(args)}
        out = []
        for o in jax.tree.leaves(step(args)):
            if id(o) not in seen:
                seen.add(id(o))
                out.append(o)
        return out
    return run


def device_time(step, args, calls, min_bytes=None, breakdown=0):
    """Seconds per call of `step(args)`'s kernels on the device (the profiler's summed kernel time), over `calls`
    unchained calls, each on the next of K copies of `args` (K x bytes >= `min_bytes`, default `ROTATE_BYTES`).
    Outputs that are inputs or repeats are dropped first (`_new_outputs`): their copies are not the step's work.
    `breakdown` > 0 also prints that many of the kernels, longest first, with their device time per call."""
    from jaxformer.hlo_profile import profile_compiled
    compiled = jax.jit(_new_outputs(step)).lower(args).compile()
    nbytes = max(1, sum(x.nbytes for x in jax.tree.leaves(args)))
    k = max(1, -(-(min_bytes or ROTATE_BYTES[0]) // nbytes))
    copies = itertools.cycle([jax.tree.map(lambda x: x.copy(), args) for _ in range(k)])
    times = profile_compiled(compiled, (next(copies),), calls, carry=lambda out, a: (next(copies),),
                             log=lambda m: None, by="both" if breakdown else "hlo_op")
    for k, ns in sorted(times.items(), key=lambda kv: -kv[1])[:breakdown]:
        print(f"    {ns / calls / 1e3:9.1f} us  {k[:150]}", file=sys.stderr, flush=True)
    return sum(times.values()) / calls * 1e-9


@dataclasses.dataclass
class Case:
    """One shape of one operator: its rows `impls` {name: fn(*args, blocks=None)}, the registry's operator and call
    (for the tunable candidates), the differentiable-arg count and the bytes each pass must move."""

    op: str
    label: str
    impls: dict
    args: tuple
    n_in: int
    bytes_fwd: int | None = None
    bytes_fwd_bwd: int | None = None
    registry_op: str | None = None
    call: object = None


_TOKAMAX: list = []  # [module or None], imported once


def _tokamax():
    """The `tokamax` module, or None (a skip line with the reason, once) where it does not import."""
    if not _TOKAMAX:
        try:
            import tokamax
            _TOKAMAX.append(tokamax)
            # it logs a warning per trace of each op it has no tuned config for (every row here): not news
            logging.getLogger("absl").addFilter(lambda r: "Autotuning cache miss" not in r.getMessage())
        except Exception as e:  # not installed, or not for this jax (it needs >= 0.11.1): the other rows still run
            print(f"  skip tokamax peers: {type(e).__name__}: {str(e)[:300]}", file=sys.stderr, flush=True)
            _TOKAMAX.append(None)
    return _TOKAMAX[0]


def _tokamax_cross_entropy(tk, impl: str):
    """(h, w, labels) -> per-row nll by `tokamax.linear_softmax_cross_entropy_loss`, its gradients cast to the
    inputs' dtypes: tokamax 0.0.17's returns float32 gradients for bfloat16 inputs, which the transpose of the cast
    before it rejects (an AssertionError)."""
    def f(h, w, labels):
        return tk.linear_softmax_cross_entropy_loss(h, labels, w, reduction="none", implementation=impl)

    @jax.custom_vjp
    def ce(h, w, labels):
        return f(h, w, labels)

    def fwd(h, w, labels):
        y, vjp = jax.vjp(lambda h, w: f(h, w, labels), h, w)
        return y, (vjp, jnp.zeros((0,), h.dtype), jnp.zeros((0,), w.dtype))  # empty arrays carry the dtypes

    def bwd(res, ct):
        vjp, h0, w0 = res
        dh, dw = vjp(ct)
        return dh.astype(h0.dtype), dw.astype(w0.dtype), None

    ce.defvjp(fwd, bwd)
    return ce


def _registry_impls(op: str, call, entry, device) -> dict:
    """{name: fn(*args, blocks=None)} of the implementations of `op` that run `call` on `device` (the XLA reference
    always; a rule's "measured slower" does not stop one): `entry(impl, blocks)` is the operator with them."""
    out = {}
    for impl in sorted(registry.operator(op).implementations, key=lambda i: i.name != "xla"):  # the baseline first
        skip = impl.supports(call, device)
        if impl.name == "xla" or skip is None or skip.kind == "slower":
            out[impl.name] = lambda *a, impl=impl.name, blocks=None: entry(impl, blocks)(*a)
    return out


# The fused MLM loss's tile variants timed beside its default: 128 x 256 tiles with 8 warps were the fastest forward
# at 1280 rows (benchmarks/results/kernels-h200.md, MLM loss).
MLM_VARIANTS = {"triton-fwd128x256": mlm_kernel.Blocks(block_v=256, num_warps=8),
                "triton-all128x256": mlm_kernel.Blocks(block_v=256, num_warps=8, bwd_block_v=256, bwd_num_warps=8)}
# The fused loss with the stored-probabilities backward (`probs_dtype`): the forward stores exp(logit - tile max)
MLM_STORED = {"triton-stored-bf16": "bfloat16", "triton-stored-f16": "float16", "triton-stored-f32": "float32"}
MLM_VOCAB = 30522  # BERT's vocabulary; a larger --mlm-table pads the table past it, as the model stores it


def cases(ops, dtype, scale=1, peers=False, device=None, mlm_table=MLM_VOCAB, mlm_vocab=MLM_VOCAB) -> list[Case]:
    """The benchmark's cases for the operators `ops`, in `dtype`, batch sizes divided by `scale`; the MLM loss's
    table has `mlm_table` rows, those past `mlm_vocab` padding (passed as vocab_size, as the model calls it)."""
    device = registry.Device.current() if device is None else device
    key = jax.random.split(jax.random.key(1), 8)
    seed = seed_from_key(key[7])
    item = jnp.dtype(dtype).itemsize
    name = jnp.dtype(dtype).name
    tk = _tokamax() if peers and {"attention", "layer_norm", "mlm_loss"} & set(ops) else None
    out = []
    if "bdrln" in ops:
        for rows, d in [(8192 // scale, 768), (8192 // scale, 1024), (32768 // scale, 1024)]:
            x, res = (jax.random.normal(key[i], (rows, d), dtype) for i in (0, 1))
            bias, shift = (jax.random.normal(key[i], (d,)) for i in (2, 3))
            ln_scale = 1 + 0.1 * jax.random.normal(key[4], (d,))
            for rate in (0.0, 0.1):
                kw = dict(seed=seed, rate=rate, eps=1e-12)
                call = bdrln.Call(rows, d, name, name, rate)
                impls = _registry_impls("bias_dropout_residual_layernorm", call, lambda impl, blocks, kw=kw: (
                    lambda *a: bdrln.bias_dropout_residual_layernorm(*a, **kw, impl=impl, blocks=blocks)), device)
                # fwd reads x, res, writes y; bwd reads x, res, dy, writes dx (+ d_res with dropout)
                out.append(Case("bdrln", f"{rows}x{d} p={rate}", impls, (x, bias, res, ln_scale, shift), 5,
                                3 * rows * d * item, (3 + (5 if rate else 4)) * rows * d * item,
                                "bias_dropout_residual_layernorm", call))
    if "bias_gelu" in ops:
        for rows, f in [(8192 // scale, 3072), (8192 // scale, 4096), (32768 // scale, 4096)]:
            x = jax.random.normal(key[0], (rows, f), dtype)
            bias = jax.random.normal(key[1], (f,))
            # BERT's feed-forward has no dropout here (p=0); p=0.1 is the same math with dropout. The mask is
            # regenerated by hash in both passes (the XLA reference draws the same one), so the bytes that must move
            # are the same at both rates.
            for rate in (0.0, 0.1):
                kw = dict(seed=seed, rate=rate)
                call = bias_gelu.Call(rows, f, name, rate)
                impls = _registry_impls("bias_gelu", call, lambda impl, blocks, kw=kw: (
                    lambda *a: bias_gelu.bias_gelu(*a, **kw, impl=impl, blocks=blocks)), device)
                out.append(Case("bias_gelu", f"{rows}x{f} p={rate}", impls, (x, bias), 2, 2 * rows * f * item,
                                5 * rows * f * item, "bias_gelu", call))
    if "gelu_dense" in ops:  # the feed-forward's GELU and output product: its backward's GEMM epilogue
        for b, f, d in [(64 // scale, 4096, 1024), (64 // scale, 3072, 768)]:
            x = jax.random.normal(key[0], (b, 128, f), dtype)
            bias = jax.random.normal(key[1], (f,))
            w = (jax.random.normal(key[2], (f, d)) / f ** 0.5).astype(dtype)
            call = gelu_dense.Call(b * 128, f, d, name)
            impls = _registry_impls("gelu_dense", call, lambda impl, blocks: (
                lambda *a: gelu_dense.gelu_dense(*a, impl=impl, blocks=blocks)), device)
            out.append(Case("gelu_dense", f"B{b} S128 F{f} D{d}", impls, (x, bias, w), 3, registry_op="gelu_dense",
                            call=call))
    if "softmax" in ops:
        for b, n, s in [(64 // scale, 16, 128), (16 // scale, 16, 512)]:
            x = jax.random.normal(key[0], (b, n, s, s), dtype) * 3
            mask = jnp.arange(s)[None, :] < jax.random.randint(key[1], (b, 1), s // 2, s + 1)
            kw = dict(scale=0.125, seed=seed, rate=0.1)
            call = softmax.Call(n * s, s, name, 0.1)
            impls = _registry_impls("softmax", call, lambda impl, blocks, m=mask, kw=kw: (
                lambda x: softmax.scaled_masked_softmax(x, m, **kw, impl=impl, blocks=blocks)), device)
            size = b * n * s * s * item
            out.append(Case("softmax", f"B{b} N{n} S{s} p=0.1", impls, (x,), 1, 2 * size, 5 * size, "softmax", call))
    if "attention" in ops:
        from pallas_kernels.attention import flash_attention, impls as attention_impls, unfused_attention
        for b, n, s_ in [(64 // scale, 16, 128), (16 // scale, 16, 512)]:
            q, k, v = (jax.random.normal(key[i], (b, s_, n, 64), dtype) for i in (0, 1, 2))
            lengths = jax.random.randint(key[3], (b,), s_ // 2, s_ + 1)
            mask = jnp.arange(s_)[None, :] < lengths[:, None]
            size = b * s_ * n * 64 * item
            for rate in (0.1, 0.0):
                call = attention_impls.Call(b, s_, s_, n, 64, name, rate)
                impls = _registry_impls("attention", call, lambda impl, blocks, m=mask, rate=rate: (
                    lambda q, k, v: flash_attention(q, k, v, m, seed=seed, rate=rate, impl=impl, blocks=blocks)),
                    device)
                impls["triton-unfused"] = lambda q, k, v, m=mask, rate=rate: unfused_attention(
                    q, k, v, m, seed=seed, rate=rate)
                if peers and not rate:
                    for impl in ("cudnn", "xla"):
                        impls[f"jax.nn.dpa-{impl}"] = (
                            lambda q, k, v, impl=impl, ln=lengths, s_=s_: jax.nn.dot_product_attention(
                                q, k, v, query_seq_lengths=jnp.full_like(ln, s_), key_value_seq_lengths=ln,
                                implementation=impl))
                    for impl in ("mosaic", "triton", "cudnn", "xla") if tk else ():  # same layout (B S N H)
                        impls[f"tokamax-{impl}"] = (
                            lambda q, k, v, impl=impl, ln=lengths: tk.dot_product_attention(
                                q, k, v, key_value_seq_lengths=ln, implementation=impl))
                out.append(Case("attention", f"B{b} N{n} S{s_} H64 p={rate}", impls, (q, k, v), 3, 4 * size,
                                12 * size, "attention", call))
            # Packed rows (train.py --pack): segment ids of BERT-like samples packed as the data preparation packs
            # them; each sample attends only to itself and the kernels visit only the tiles its samples span.
            from jaxformer.data import synthetic_packed_batch
            segs = jnp.asarray(synthetic_packed_batch(30522, b, s_, max(1, s_ // 16), seed=1)["segment_ids"])
            fill = float(jnp.mean(segs > 0))
            for rate in (0.1, 0.0):
                call = attention_impls.Call(b, s_, s_, n, 64, name, rate, segments=True)
                impls = _registry_impls("attention", call, lambda impl, blocks, m=segs, rate=rate: (
                    lambda q, k, v: flash_attention(q, k, v, m, seed=seed, rate=rate, impl=impl, blocks=blocks,
                                                    segments=True)), device)
                out.append(Case("attention", f"B{b} N{n} S{s_} H64 p={rate} packed (fill {fill:.0%})", impls,
                                (q, k, v), 3, 4 * size, 12 * size, "attention", call))
            if peers and device.hopper:
                # JAX's own Mosaic GPU flash attention (jax.experimental.pallas.ops.gpu.attention_mgpu, Hopper+): no
                # key mask, no dropout, so only a speed bound. Its scratch buffers are float16 (jax 0.11.2), so this
                # row set runs on float16 inputs, the XLA reference and Triton beside it.
                from jax.experimental.pallas.ops.gpu import attention_mgpu
                cfg = attention_mgpu.TuningConfig(block_q=64, block_kv=min(128, s_), max_concurrent_steps=2,
                                                  block_q_dkv=64, block_kv_dkv=64, block_q_dq=64, block_kv_dq=64)
                call = attention_impls.Call(b, s_, s_, n, 64, "float16", 0.0)
                impls = _registry_impls("attention", call, lambda impl, blocks, m=mask: (
                    lambda q, k, v: flash_attention(q, k, v, m, impl=impl, blocks=blocks)), device)
                impls["jax-mgpu-nomask"] = lambda q, k, v, cfg=cfg: attention_mgpu.attention(q, k, v, cfg)
                out.append(Case("attention", f"B{b} N{n} S{s_} H64 p=0.0 f16", impls,
                                tuple(x.astype(jnp.float16) for x in (q, k, v)), 3, 4 * size, 12 * size, "attention",
                                call))
    if "mlm_loss" in ops:
        # The MLM head's tied decoder + cross-entropy at BERT-large's masked rows per step (B64 x P20 at S=128,
        # B16 x P80 at S=512: 1280) and 4x that; D = 1024, a table of `mlm_table` rows (the model's is 30592,
        # BertConfig.padded_vocab_size: 30522 real columns). The output is folded into h's shape (h + 0 * nll) so
        # that iterations chain; that add is 2.6 MB of the hundreds of MB of logits moved.
        from pallas_kernels import mlm_loss
        v, d = mlm_table, 1024
        real = min(mlm_vocab, v)
        valid = None if real == v else real
        for rows in (1280 // scale, 5120 // scale):
            h = jax.random.normal(key[0], (rows, d), dtype)
            emb = 0.02 * jax.random.normal(key[1], (v, d))
            out_bias = 0.02 * jax.random.normal(key[2], (v,))
            labels = jax.random.randint(key[3], (rows,), 0, real)

            def chained(f):
                return lambda h, e, b, lab: h + 0 * f(h, e, b, lab)[0][:, None].astype(h.dtype)
            call = mlm_loss.Call(rows, v, d, name)
            impls = _registry_impls("mlm_cross_entropy", call, lambda impl, blocks: chained(
                lambda *a: mlm_loss.mlm_cross_entropy(*a, impl=impl, blocks=blocks, vocab_size=valid)), device)
            if "chunked" in impls:
                for c in (4096, 8192, 32768):  # beside the default 16384; 32768 > V: one chunk
                    impls[f"chunked-{c}"] = chained(
                        lambda *a, c=c: mlm_loss.mlm_cross_entropy_chunked(*a, chunk=c, vocab_size=valid))
            if "triton" in impls:
                for variant, bl in MLM_VARIANTS.items():
                    impls[variant] = chained(
                        lambda *a, bl=bl: mlm_loss.mlm_cross_entropy_fused(*a, blocks=bl, vocab_size=valid))
                for variant, pd in MLM_STORED.items():
                    impls[variant] = chained(
                        lambda *a, pd=pd: mlm_loss.mlm_cross_entropy_fused(*a, vocab_size=valid, probs_dtype=pd))
            for impl in ("xla", "chunked_xla") if tk else ():  # no output bias or padding; weights (D, V)
                impls[f"tokamax-{impl}-nobias"] = chained(
                    lambda h, e, b, lab, ce=_tokamax_cross_entropy(tk, impl): (ce(h, e.astype(h.dtype).T, lab),))
            out.append(Case("mlm_loss", f"{rows}x{d} V{v}" + (f"/{valid}" if valid else ""), impls,
                            (h, emb, out_bias, labels), 3))
    if "layer_norm" in ops:
        # The plain layernorm (the MLM head's; float32 statistics), beside tokamax's with --peers. Bytes: fwd reads x,
        # writes y; bwd reads x and dy, writes dx.
        for rows, d in [(8192 // scale, 768), (8192 // scale, 1024), (32768 // scale, 1024)]:
            x = jax.random.normal(key[0], (rows, d), dtype)
            ln_scale, shift = 1 + 0.1 * jax.random.normal(key[4], (d,)), 0.1 * jax.random.normal(key[5], (d,))
            call = bdrln.call_of(x, None, None, 0.0, rows)
            impls = _registry_impls("layer_norm", call, lambda impl, blocks: (
                lambda *a: bdrln.layer_norm(*a, eps=1e-12, impl=impl, blocks=blocks)), device)
            for impl in ("triton", "xla") if tk else ():
                impls[f"tokamax-{impl}"] = lambda x, s, b, impl=impl: tk.layer_norm(x, s, b, epsilon=1e-12,
                                                                                    implementation=impl)
            out.append(Case("layer_norm", f"{rows}x{d}", impls, (x, ln_scale, shift), 3, 2 * rows * d * item,
                            5 * rows * d * item, "layer_norm", call))
    if "embedding" in ops:
        # The embedding block (word/position/type gathers, sum, LN, dropout 0.1; once per step) at BERT-large's
        # tables: the reference (XLA's gathers and fusion) and the fused kernels (tables gathered inside them); the
        # word table's gradient is XLA's scatter in both. Chained through x: the previous output decides nothing
        # (ids + (x[:, :, 0] > 1e4), never true for LN outputs) but XLA cannot know. Bytes it must move: fwd: the
        # gathered fp32 word rows in, bf16 out; bwd: dy in, the word rows again, their fp32 gradient rows into the
        # dense (V, D) table gradient, whose zero fill is V*D*4 (position/type rows are small).
        from pallas_kernels import embedding_layernorm as embedding
        v, d = 30528, 1024  # BERT-large's padded vocabulary
        word, pos, typ = (0.02 * jax.random.normal(key[i], (n, d)) for i, n in ((1, v), (2, 512), (3, 2)))
        ln_scale, shift = 1 + 0.1 * jax.random.normal(key[4], (d,)), 0.1 * jax.random.normal(key[5], (d,))
        for b, s_ in [(64 // scale, 128), (16 // scale, 512)]:
            ids = jax.random.randint(key[0], (b, s_), 0, 30522)
            types = jnp.broadcast_to((jnp.arange(s_) >= s_ // 2).astype(jnp.int32), (b, s_))
            x = jnp.zeros((b, s_, d), dtype)

            # packed rows: two samples a row, positions restarting at a random split (the whole table passed)
            split = jax.random.randint(key[6], (b, 1), s_ // 4, 3 * s_ // 4)
            col = jnp.arange(s_)[None, :]
            for packed in (False, True):
                position_ids = jnp.where(col < split, col, col - split) if packed else None

                def emb(impl, blocks, ids=ids, types=types, position_ids=position_ids):
                    def run(x, word, pos, typ, ln_scale, shift):
                        ids_ = ids + (x[:, :, 0] > 1e4).astype(ids.dtype)
                        return embedding.embedding_layernorm(ids_, types, word, pos, typ, ln_scale, shift, seed=seed,
                                                             rate=0.1, eps=1e-12, dtype=dtype, impl=impl,
                                                             blocks=blocks, position_ids=position_ids)
                    return run
                call = embedding.Call(b * s_, d, name, 0.1, positions=packed)
                rows = b * s_ * d
                out.append(Case("embedding", f"large B{b} S{s_} p=0.1" + (" packed" if packed else ""),
                                _registry_impls("embedding_layernorm", call, emb, device),
                                (x, word, pos if packed else pos[:s_], typ, ln_scale, shift), 6, rows * (4 + 2),
                                rows * (4 + 2 + 2 + 4 + 4) + v * d * 4, "embedding_layernorm", call))
    if "layer" in ops:
        from flax import nnx

        from jaxformer import BertConfig
        from jaxformer.model import EncoderLayer
        for b, s_ in [(64 // scale, 128), (16 // scale, 512)]:
            x = jax.random.normal(key[0], (b, s_, 1024), dtype)
            mask = jnp.arange(s_)[None, :] < jax.random.randint(key[3], (b, 1), s_ // 2, s_ + 1)
            impls, state = {}, None
            for kernels in ("xla", "pallas"):
                cfg = BertConfig.preset("large", dtype=jnp.dtype(dtype).name, kernels=kernels)
                graphdef, st = nnx.split(EncoderLayer(cfg, rngs=nnx.Rngs(0)))
                state = st if state is None else state

                def run(x, state, graphdef=graphdef, mask=mask):
                    layer = nnx.merge(graphdef, state)
                    return layer(x, mask, key=key[5], deterministic=False)
                impls[kernels] = run
            out.append(Case("layer", f"large B{b} S{s_} p=0.1", impls, (x, state), 2))
    return out


def tune_candidates(case: Case, impl: str, pass_: str, device) -> list:
    """The registry's candidates for `impl` around its default for the case: forward tiles for the forward pass,
    the backward's (forward at its default) for fwd+bwd; none for rows the registry does not configure."""
    if case.registry_op is None or impl not in [i.name for i in registry.operator(case.registry_op).implementations]:
        return []
    implementation = registry.operator(case.registry_op).implementation(impl)
    default = implementation.default(case.call, device)
    if default is None:
        return []
    return implementation.candidates(default, case.call, device, "fwd" if pass_ == "fwd" else "bwd")


def check_against(fn, ref, args, n_in, pass_):
    """Relative L2 error of `fn` vs the XLA reference on the benchmark's inputs (output, and gradients for fwd+bwd):
    every timed Pallas configuration is also a correctness check on the GPU."""
    def outs(f):
        if pass_ == "fwd":
            return [f(*args)]
        y, vjp = jax.vjp(f, *args)
        # A random cotangent, the same for both: the output itself (what the timed loop feeds back) would make the
        # gradient through a final layernorm vanish in exact arithmetic (d/dx |LN(x)|^2 / 2 = 0 at unit scale and
        # zero shift), leaving both sides rounding noise: the encoder layer "failed" at 0.89 that way.
        ct = jax.tree.map(lambda a: jax.random.normal(jax.random.key(7), a.shape, a.dtype)
                          if jnp.issubdtype(a.dtype, jnp.floating) else a, y)
        return [y] + jax.tree.leaves(vjp(ct)[:n_in])
    errs = []
    for a, b in zip(outs(fn), outs(ref)):
        a, b = a.astype(jnp.float32), b.astype(jnp.float32)
        errs.append(float(jnp.linalg.norm(a - b) / jnp.maximum(jnp.linalg.norm(b), 1e-30)))
    return max(errs)


def profile_kernels(step, args, calls, top, title):
    """Print the device time per call of `step`'s kernels (one unchained jitted call, `calls` times, profiled)."""
    from jaxformer.hlo_profile import profile_compiled
    compiled = jax.jit(step).lower(args).compile()
    times = profile_compiled(compiled, (args,), calls, log=lambda m: print("  " + m, file=sys.stderr), by="both")
    total = sum(times.values()) / calls / 1e3
    print(f"\n  kernels of {title}: {total:.1f} us per call on the device, summed")
    for k, ns in sorted(times.items(), key=lambda kv: -kv[1])[:top]:
        print(f"  {ns / calls / 1e3:9.1f} us  {100 * ns / calls / 1e3 / total:5.1f}%  {k[:150]}")
    print(flush=True)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--ops", default="bdrln,bias_gelu,softmax,attention,embedding,layer",
                    help="of bdrln, bias_gelu, gelu_dense, softmax, attention, mlm_loss, layer_norm, embedding, layer")
    ap.add_argument("--dtype", default="bfloat16")
    ap.add_argument("--only", default="", help="run only the shapes whose label contains this text")
    ap.add_argument("--passes", default="fwd,fwd+bwd", help="which passes to time")
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--tune", action="store_true", help="time each block-size candidate of the Pallas kernels")
    ap.add_argument("--impls", default="", help="only these rows (comma-separated registry implementation names, "
                    "e.g. triton,mosaic, or variants such as chunked-4096; xla always runs, as the baseline); "
                    "default: all")
    ap.add_argument("--peers", action="store_true", help="also time other libraries' attention (cuDNN and XLA "
                    "through jax.nn.dot_product_attention, JAX's Mosaic GPU flash attention) and, where tokamax "
                    "imports, tokamax's attention, layer norm and MLM loss")
    ap.add_argument("--json", help="also write the rows to this file")
    ap.add_argument("--scale", type=int, default=1, help="divide the batch sizes (a quick smoke run on the CPU)")
    ap.add_argument("--profile", type=int, default=0, metavar="CALLS",
                    help="also run CALLS unchained calls of each implementation under jax.profiler and print the "
                         "device time of its kernels per call (XLA's command buffers are switched off for this)")
    ap.add_argument("--top", type=int, default=25, help="kernels listed per profile")
    ap.add_argument("--device-time", type=int, default=0, metavar="CALLS",
                    help="time each operator by its kernels' device time over CALLS calls on rotated inputs (a GPU; "
                         "XLA's command buffers off) instead of as a timed chain")
    ap.add_argument("--breakdown", type=int, default=0, metavar="TOP",
                    help="with --device-time: also list the TOP longest kernels of each timed row (stderr), from the "
                         "same profiled calls")
    ap.add_argument("--mlm-table", type=int, default=MLM_VOCAB, metavar="ROWS",
                    help="the MLM loss's table rows, those past --mlm-vocab padding: 30592 is the model's table "
                         f"(BertConfig.padded_vocab_size, 128-aligned) for BERT's {MLM_VOCAB}")
    ap.add_argument("--mlm-vocab", type=int, default=MLM_VOCAB, metavar="REAL",
                    help="the MLM loss's real columns (vocab_size; at most --mlm-table)")
    ap.add_argument("--xla-gemm", choices=("xla", "cublas"), default="xla",
                    help="cublas: XLA's Triton GEMM emitter off (what the train step's xla_gemm=cublas sets per jit)")
    a = ap.parse_args()
    if a.device_time and jax.default_backend() != "gpu":
        ap.error(f"--device-time {a.device_time} needs a GPU (the default backend is {jax.default_backend()})")
    if a.xla_gemm == "cublas":  # before the backend starts (the first computation, below)
        os.environ["XLA_FLAGS"] = os.environ.get("XLA_FLAGS", "") + " --xla_gpu_enable_triton_gemm=false"
    if a.profile or a.device_time:  # in a CUDA-graph command buffer the profiler sees one event per graph, not kernel
        os.environ["XLA_FLAGS"] = os.environ.get("XLA_FLAGS", "") + " --xla_gpu_enable_command_buffer="
    dtype = jnp.dtype(a.dtype)
    ROTATE_BYTES[0] //= a.scale
    bw = copy_bandwidth(a.repeats, a.scale)
    how = "device time" if jax.default_backend() == "gpu" else "timed"
    ops_how = (f"operators: device time over {a.device_time} calls on rotated inputs" if a.device_time
               else "operators: timed chains")
    print(f"# {jax.devices()[0].device_kind}, jax {jax.__version__}, {a.dtype}; copy bandwidth {bw / 1e9:.0f} GB/s "
          f"(fp32 y = x + 1 over 256 MB, {how}); {ops_how}; JAXFORMER_AUTOTUNE={autotune.mode()} (\"default\" "
          "blocks: the tuner's cached choice unless off)", flush=True)
    rows = []
    print("| op | shape | pass | impl | us | xla us | speed-up vs xla | % of copy BW | blocks |")
    print("|---|---|---|---|---|---|---|---|---|", flush=True)
    device = registry.Device.current()
    for case in cases(a.ops.split(","), dtype, a.scale, peers=a.peers, device=device, mlm_table=a.mlm_table,
                      mlm_vocab=a.mlm_vocab):
        if a.only not in case.label:
            continue
        op, label, impls, args, n_in = case.op, case.label, case.impls, case.args, case.n_in
        for name, nbytes in (("fwd", case.bytes_fwd), ("fwd+bwd", case.bytes_fwd_bwd)):
            if name not in a.passes.split(","):
                continue

            def step_for(fn, name=name, n_in=n_in):
                if name == "fwd":
                    return lambda c: (fn(*c),) + tuple(c[1:])
                return grads_as_carry(fn, n_in)
            t_xla = None
            nbytes = nbytes or 0
            for impl, fn0 in impls.items():
                if a.impls and impl not in a.impls.split(",") and impl != "xla":
                    continue
                tuned = tune_candidates(case, impl, name, device) if a.tune else []
                best = None
                for blk in [None] + tuned:
                    fn = (lambda *x, blk=blk, fn0=fn0: fn0(*x, blocks=blk)) if blk else fn0
                    try:
                        if impl != "xla" and not impl.startswith("jax") and not impl.endswith(("-nomask", "-nobias")):
                            # (jax.nn's and JAX's Mosaic GPU peers differ in mask and dropout)
                            err = check_against(fn, impls["xla"], args, n_in, name)
                            if not err < 2e-2:
                                raise AssertionError(f"relative error {err:.2e} against the XLA reference")
                        if a.device_time and a.breakdown:
                            print(f"  kernels of {op} {label} {name} {impl}:", file=sys.stderr, flush=True)
                        # the layer: shorter chains (each iteration is a whole encoder layer; compiles faster)
                        t = (device_time(step_for(fn), args, a.device_time, breakdown=a.breakdown)
                             if a.device_time else
                             per_iteration(step_for(fn), args, a.repeats, lengths=(1, 4) if op == "layer" else None))
                    except Exception as e:  # a candidate that does not compile is reported and skipped
                        why = "; ".join(f"{type(x).__name__}: {x}" for x in e.exceptions) \
                            if isinstance(e, BaseExceptionGroup) else str(e)  # tokamax: one per implementation
                        print(f"  skip {impl} {blk}: {type(e).__name__}: {why[:300]}", file=sys.stderr)
                        continue
                    if tuned:  # every candidate's time, under the row that reports the best
                        print(f"  candidate {impl} {name} {blk or 'default'}: {t * 1e6:.1f} us", flush=True)
                    if best is None or t < best[0]:
                        best = (t, blk)
                if best is None:
                    continue
                t, blk = best
                t_xla = t if impl == "xla" else t_xla
                row = dict(op=op, shape=label, pass_=name, impl=impl, us=t * 1e6, xla_us=(t_xla or 0) * 1e6,
                           speedup=(t_xla / t) if t_xla else None, bw=nbytes / t / bw, blocks=str(blk or "default"))
                rows.append(row)
                print(f"| {op} | {label} | {name} | {impl} | {row['us']:.1f} | {row['xla_us']:.1f} | "
                      f"{row['speedup'] or 0:.2f}x | {100 * row['bw']:.0f}% | {row['blocks']} |", flush=True)
                if a.profile:
                    profile_kernels(step_for(fn0 if blk is None else fn), args, a.profile, a.top,
                                    f"{op} {label} {name} {impl}")
    if a.json:
        with open(a.json, "w") as f:
            json.dump(dict(device=jax.devices()[0].device_kind, jax=jax.__version__, copy_bw=bw, rows=rows), f,
                      indent=1)


if __name__ == "__main__":
    main()
