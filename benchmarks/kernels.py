"""Fused Pallas kernels against XLA's fusion of the same reference math, forward and forward+backward.

    PYTHONPATH=. python benchmarks/kernels.py                    # every operator, BERT-base/large shapes
    PYTHONPATH=. python benchmarks/kernels.py --ops bdrln --tune # also try the block-size candidates (bdrln, bias_gelu,
                                                                 # softmax, attention: the backward forms too)
    PYTHONPATH=. python benchmarks/kernels.py --ops bias_gelu,bdrln --impls xla,pallas,mgpu  # Triton vs Mosaic GPU
    PYTHONPATH=. python benchmarks/kernels.py --ops mlm_loss     # MLM cross-entropy: logits vs vocabulary chunks
    PYTHONPATH=. python benchmarks/kernels.py --ops embedding    # the embedding block: XLA vs its fused kernels
    PYTHONPATH=. python benchmarks/kernels.py --ops bdrln,bias_gelu --passes fwd+bwd --device-time 20  # device time

Timing (DESIGN.md): `n` iterations chained inside one jit (each consumes the previous one's outputs, so nothing is
dead code, and an `optimization_barrier` between them keeps XLA from fusing one iteration into the next), for
n = N1 and N2; the time per iteration is (T(N2) - T(N1)) / (N2 - N1), which cancels the dispatch and launch
overhead of the call; median of `--repeats`. Inputs are random and larger than L2.
`--device-time CALLS` (a GPU) times each operator instead by its kernels' device time under the profiler: CALLS
unchained calls, each on the next of K copies of the inputs (K x bytes >= 180 MB, so no call finds its operands in
L2), the kernels' time per call summed (launch gaps left out). On an H200 timed chains of a ~50-150 us operator
moved by 10-20% between processes where device time moved by 1-2% (benchmarks/results/kernels-h200.md, sessions
21-22, whose tables are this method's).
Bytes are what each operator must move (each input read once, each output written once); GB/s is against the copy
bandwidth of `y = x + 1` over 256 MB buffers measured in the same run.
The `mgpu` rows (bias_gelu, bdrln) are the Mosaic GPU kernels (`kernel_mgpu.py`) behind the same public functions
(`backend="mgpu"`); they appear only on a Hopper-or-newer GPU (`kernel_mgpu.supported()`).
"""

from __future__ import annotations

import argparse
import dataclasses
import itertools
import json
import os
import sys

import jax
import jax.numpy as jnp

import pallas_kernels.bias_dropout_residual_layernorm as bdrln
import pallas_kernels.bias_gelu as bias_gelu
import pallas_kernels.softmax as softmax
from pallas_kernels.bias_dropout_residual_layernorm import kernel_mgpu as bdrln_mgpu
from pallas_kernels.attention import kernel as attention_kernel
from pallas_kernels.bias_gelu import kernel_mgpu as bias_gelu_mgpu
from pallas_kernels.embedding_layernorm import kernel as embedding_kernel
from pallas_kernels.mlm_loss import kernel as mlm_kernel
from pallas_kernels import autotune
from pallas_kernels.timing import grads_as_carry, time_step
from pallas_kernels._pallas import row_block_candidates
from pallas_kernels.dropout import seed_from_key

N1, N2 = 2, 10
ROTATE_BYTES = [180 * 2**20]  # rotate inputs over at least this many bytes (--scale shrinks it)


def per_iteration(step, carry, repeats, min_bytes=None, lengths=None):
    """Seconds per `step` (carry -> carry) iteration, by the difference of two chained run lengths
    (`pallas_kernels.autotune.time_step`, which the autotuner times its candidates with too).

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
    the same bytes (3199 vs 4077 GB/s; PyTorch's device copy 4192; on an H100 5-13% slower), so the bf16 probe that
    sessions 1-19 divided by understated the copy bandwidth and overstated every "% of copy BW"
    (benchmarks/results/kernels-h200.md, session 20). Device time, not a timed chain: on an H200 the chain read 3291,
    3749 and 4684 GB/s in three processes and the device time 4230-4261 in seven (session 21), so the
    percentages against it are conservative for the timed operators (their time includes launch gaps).
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


def device_time(step, args, calls, min_bytes=None):
    """Seconds per call of `step(args)`'s kernels on the device (the profiler's summed kernel time), over `calls`
    unchained calls, each on the next of K copies of `args` (K x bytes >= `min_bytes`, default `ROTATE_BYTES`).
    Outputs that are inputs or repeats are dropped first (`_new_outputs`): their copies are not the step's work."""
    from jaxformer.hlo_profile import profile_compiled
    compiled = jax.jit(_new_outputs(step)).lower(args).compile()
    nbytes = max(1, sum(x.nbytes for x in jax.tree.leaves(args)))
    k = max(1, -(-(min_bytes or ROTATE_BYTES[0]) // nbytes))
    copies = itertools.cycle([jax.tree.map(lambda x: x.copy(), args) for _ in range(k)])
    times = profile_compiled(compiled, (next(copies),), calls, carry=lambda out, a: (next(copies),),
                             log=lambda m: None)
    return sum(times.values()) / calls * 1e-9


MGPU_BLOCKS = {"bias_gelu": bias_gelu_mgpu.Blocks, "bdrln": bdrln_mgpu.Blocks}

# The fused MLM loss's tile variants timed beside its default (session 30's gemm_probe.py: 128 x 256 tiles with 8
# warps were the fastest forward at 1280 rows).
MLM_FUSED_BLOCKS = {"fused": None,
                    "fused-fwd128x256": mlm_kernel.Blocks(block_v=256, num_warps=8),
                    "fused-all128x256": mlm_kernel.Blocks(block_v=256, num_warps=8, bwd_block_v=256, bwd_num_warps=8)}


def cases(ops, dtype, scale=1):
    """(op, shape label, {impl: fn}, args, differentiable-arg count, bytes fwd, bytes fwd+bwd, Blocks class)."""
    key = jax.random.split(jax.random.key(1), 8)
    seed = seed_from_key(key[7])
    item = jnp.dtype(dtype).itemsize
    out = []
    if "bdrln" in ops:
        for rows, d in [(8192 // scale, 768), (8192 // scale, 1024), (32768 // scale, 1024)]:
            x, res = (jax.random.normal(key[i], (rows, d), dtype) for i in (0, 1))
            bias, shift = (jax.random.normal(key[i], (d,)) for i in (2, 3))
            ln_scale = 1 + 0.1 * jax.random.normal(key[4], (d,))
            for rate in (0.0, 0.1):
                kw = dict(seed=seed, rate=rate, eps=1e-12)
                impls = {"xla": lambda *a, kw=kw: bdrln.reference.bias_dropout_residual_layernorm(*a, **kw),
                         "pallas": lambda *a, kw=kw, **b: bdrln.bias_dropout_residual_layernorm(*a, **kw, **b,
                                                                                                backend="triton")}
                if bdrln_mgpu.supported():
                    impls["mgpu"] = lambda *a, kw=kw, **b: bdrln.bias_dropout_residual_layernorm(*a, **kw, **b,
                                                                                                  backend="mgpu")
                # fwd reads x, res, writes y; bwd reads x, res, dy, writes dx (+ d_res with dropout)
                fb = (3 + (5 if rate else 4)) * rows * d * item
                out.append(("bdrln", f"{rows}x{d} p={rate}", impls, (x, bias, res, ln_scale, shift), 5,
                            3 * rows * d * item, fb, bdrln.kernel.Blocks))
    if "bias_gelu" in ops:
        for rows, f in [(8192 // scale, 3072), (8192 // scale, 4096), (32768 // scale, 4096)]:
            x = jax.random.normal(key[0], (rows, f), dtype)
            bias = jax.random.normal(key[1], (f,))
            # BERT's feed-forward has no dropout here (p=0); p=0.1 is the "same math with dropout" target.
            # The mask is regenerated by hash in both passes (the XLA reference draws the same one), so the bytes
            # that must move are the same at both rates.
            for rate in (0.0, 0.1):
                kw = dict(seed=seed, rate=rate)
                impls = {"xla": lambda *a, kw=kw: bias_gelu.reference.bias_gelu(*a, **kw),
                         "pallas": lambda *a, kw=kw, **b: bias_gelu.bias_gelu(*a, **kw, **b, backend="triton")}
                if bias_gelu_mgpu.supported():
                    impls["mgpu"] = lambda *a, kw=kw, **b: bias_gelu.bias_gelu(*a, **kw, **b, backend="mgpu")
                out.append(("bias_gelu", f"{rows}x{f} p={rate}", impls, (x, bias), 2, 2 * rows * f * item,
                            5 * rows * f * item, bias_gelu.kernel.Blocks))
    if "softmax" in ops:
        for b, n, s in [(64 // scale, 16, 128), (16 // scale, 16, 512)]:
            x = jax.random.normal(key[0], (b, n, s, s), dtype) * 3
            mask = jnp.arange(s)[None, :] < jax.random.randint(key[1], (b, 1), s // 2, s + 1)
            kw = dict(scale=0.125, seed=seed, rate=0.1)
            impls = {"xla": lambda x, m=mask, kw=kw: softmax.reference.scaled_masked_softmax(x, m, **kw),
                     "pallas": lambda x, m=mask, kw=kw, **bl: softmax.scaled_masked_softmax(x, m, **kw, **bl)}
            size = b * n * s * s * item
            out.append(("softmax", f"B{b} N{n} S{s} p=0.1", impls, (x,), 1, 2 * size, 5 * size,
                        softmax.kernel.Blocks))
    if "attention" in ops:
        from pallas_kernels.attention import attention, flash_attention, unfused_attention
        for b, n, s_ in [(64 // scale, 16, 128), (16 // scale, 16, 512)]:
            q, k, v = (jax.random.normal(key[i], (b, s_, n, 64), dtype) for i in (0, 1, 2))
            lengths = jax.random.randint(key[3], (b,), s_ // 2, s_ + 1)
            mask = jnp.arange(s_)[None, :] < lengths[:, None]
            size = b * s_ * n * 64 * item

            def ours(rate, m=mask):
                """The XLA reference and our flash attention at this dropout rate."""
                kw = dict(seed=seed, rate=rate)
                return {"xla": lambda q, k, v: attention(q, k, v, m, **kw),
                        "pallas": lambda q, k, v, blocks=None: flash_attention(q, k, v, m, **kw, block_sizes=blocks)}
            for rate in (0.1, 0.0):
                impls = {**ours(rate), "pallas-unfused": lambda q, k, v, m=mask, rate=rate: unfused_attention(
                    q, k, v, m, seed=seed, rate=rate)}
                if not rate:
                    for impl in ("cudnn", "xla"):
                        impls[f"jax.nn.dpa-{impl}"] = (
                            lambda q, k, v, impl=impl, ln=lengths, s_=s_: jax.nn.dot_product_attention(
                                q, k, v, query_seq_lengths=jnp.full_like(ln, s_), key_value_seq_lengths=ln,
                                implementation=impl))
                out.append(("attention", f"B{b} N{n} S{s_} H64 p={rate}", impls, (q, k, v), 3, 4 * size,
                            12 * size, attention_kernel.BlockSizes))
            if bias_gelu_mgpu.supported():
                # JAX's own Mosaic GPU flash attention (jax.experimental.pallas.ops.gpu.attention_mgpu, Hopper+): no
                # key mask, no dropout, so only a speed bound for a Mosaic GPU version of ours (unchecked). Its
                # scratch buffers are float16 (jax 0.11.2), so this row set runs on float16 inputs, ours beside it.
                from jax.experimental.pallas.ops.gpu import attention_mgpu
                cfg = attention_mgpu.TuningConfig(block_q=64, block_kv=min(128, s_), max_concurrent_steps=2,
                                                  block_q_dkv=64, block_kv_dkv=64, block_q_dq=64, block_kv_dq=64)
                impls = {**ours(0.0),
                         "jax-mgpu-nomask": lambda q, k, v, cfg=cfg: attention_mgpu.attention(q, k, v, cfg)}
                out.append(("attention", f"B{b} N{n} S{s_} H64 p=0.0 f16", impls,
                            tuple(x.astype(jnp.float16) for x in (q, k, v)), 3, 4 * size, 12 * size,
                            attention_kernel.BlockSizes))
    if "mlm_loss" in ops:
        # The MLM head's tied decoder + cross-entropy at BERT-large's masked rows per step (B64 x P20 at S=128,
        # B16 x P80 at S=512: 1280) and 4x that; V = 30522, D = 1024. The output is folded into h's shape
        # (h + 0 * nll) so that iterations chain; that add is 2.6 MB of the hundreds of MB of logits moved.
        from pallas_kernels import mlm_loss
        v, d = 30522, 1024
        for rows in (1280 // scale, 5120 // scale):
            h = jax.random.normal(key[0], (rows, d), dtype)
            emb = 0.02 * jax.random.normal(key[1], (v, d))
            out_bias = 0.02 * jax.random.normal(key[2], (v,))
            labels = jax.random.randint(key[3], (rows,), 0, v)

            def chained(f):
                return lambda h, e, b, lab: h + 0 * f(h, e, b, lab)[0][:, None].astype(h.dtype)
            impls = {"xla": chained(mlm_loss.mlm_cross_entropy)}
            for c in (4096, 8192, 16384, 32768):  # 32768 > V: one chunk
                impls[f"chunked-{c}"] = chained(lambda *a, c=c: mlm_loss.mlm_cross_entropy_chunked(*a, chunk=c))
            for name, bl in MLM_FUSED_BLOCKS.items():  # the fused Pallas kernels (the `pallas` row), block variants
                impls[name] = chained(lambda *a, bl=bl: mlm_loss.mlm_cross_entropy_fused(*a, blocks=bl))
            out.append(("mlm_loss", f"{rows}x{d} V{v}", impls, (h, emb, out_bias, labels), 3, None, None, None))
    if "embedding" in ops:
        # The embedding block (word/position/type gathers, sum, LN, dropout 0.1; once per step) at BERT-large's
        # tables: the reference (XLA's gathers and fusion) and the fused kernels (tables gathered inside them); the
        # word table's gradient is XLA's scatter in both. Chained through x: the previous output decides nothing
        # (ids + (x[:, :, 0] > 1e4), never true for LN outputs) but XLA cannot know. Bytes it must move: fwd: the
        # gathered fp32 word rows in, bf16 out; bwd: dy in, the word rows again, their fp32 gradient rows into the
        # dense (V, D) table gradient, whose zero fill is V*D*4 (position/type rows are small).
        from pallas_kernels import embedding_layernorm as embedding
        v, d = 30528, 1024  # BERT-large's padded vocabulary (config.padded_vocab_size)
        word, pos, typ = (0.02 * jax.random.normal(key[i], (n, d)) for i, n in ((1, v), (2, 512), (3, 2)))
        ln_scale, shift = 1 + 0.1 * jax.random.normal(key[4], (d,)), 0.1 * jax.random.normal(key[5], (d,))
        for b, s_ in [(64 // scale, 128), (16 // scale, 512)]:
            ids = jax.random.randint(key[0], (b, s_), 0, 30522)
            types = jnp.broadcast_to((jnp.arange(s_) >= s_ // 2).astype(jnp.int32), (b, s_))
            x = jnp.zeros((b, s_, d), dtype)

            def emb(fn, ids=ids, types=types):
                def run(x, word, pos, typ, ln_scale, shift, **blocks):
                    ids_ = ids + (x[:, :, 0] > 1e4).astype(ids.dtype)
                    return fn(ids_, types, word, pos, typ, ln_scale, shift, seed=seed, rate=0.1, eps=1e-12,
                              dtype=dtype, **blocks)
                return run
            rows = b * s_ * d
            out.append(("embedding", f"large B{b} S{s_} p=0.1",
                        {"xla": emb(embedding.reference.embedding_layernorm),
                         "pallas": emb(embedding.embedding_layernorm)},
                        (x, word, pos[:s_], typ, ln_scale, shift), 6, rows * (4 + 2),
                        rows * (4 + 2 + 2 + 4 + 4) + v * d * 4, embedding.kernel.Blocks))
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
            out.append(("layer", f"large B{b} S{s_} p=0.1", impls, (x, state), 2, None, None, None))
    return out


def tune_candidates(blocks_cls, pass_, args=()):
    """Block sizes to try: forward tiles for the forward pass, backward tiles (forward at its default) for fwd+bwd."""
    if blocks_cls is attention_kernel.BlockSizes:  # around the defaults for q's (B, S, N, H); the autotuner's list
        s, h = args[0].shape[1], args[0].shape[3]
        d = attention_kernel.default_block_sizes(s, h, dtype=args[0].dtype)  # as flash_attention's own default
        return attention_kernel.candidate_block_sizes(d, s, h, stage="fwd" if pass_ == "fwd" else "bwd")
    stage = "fwd" if pass_ == "fwd" else "bwd"
    if blocks_cls is embedding_kernel.Blocks:
        return embedding_kernel.candidate_blocks(embedding_kernel.default_blocks(args[0].size // args[0].shape[-1],
                                                                                 args[0].shape[-1]), stage=stage)
    for module in (bdrln.kernel, bias_gelu.kernel, bdrln_mgpu, bias_gelu_mgpu):  # the autotuner's lists
        if blocks_cls is module.Blocks:
            width = args[0].shape[-1]
            return module.candidate_blocks(module.default_blocks(args[0].size // width, width), stage=stage)
    d = blocks_cls()  # the softmax kernel: the row-wise forward list, its own backward chunks
    if pass_ == "fwd":
        return row_block_candidates(d, stage="fwd")
    return [dataclasses.replace(d, bwd_block_rows=br, bwd_num_warps=w) for br, w in ((4, 4), (8, 4), (16, 8), (32, 8))]


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
    ap.add_argument("--ops", default="bdrln,bias_gelu,softmax,attention,embedding,layer")
    ap.add_argument("--dtype", default="bfloat16")
    ap.add_argument("--only", default="", help="run only the shapes whose label contains this text")
    ap.add_argument("--passes", default="fwd,fwd+bwd", help="which passes to time")
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--tune", action="store_true", help="time each block-size candidate of the Pallas kernels")
    ap.add_argument("--impls", default="", help="only these implementations (comma-separated, e.g. pallas,mgpu; "
                    "xla always runs, as the baseline); default: all")
    ap.add_argument("--json", help="also write the rows to this file")
    ap.add_argument("--scale", type=int, default=1, help="divide the batch sizes (a quick smoke run on the CPU)")
    ap.add_argument("--profile", type=int, default=0, metavar="CALLS",
                    help="also run CALLS unchained calls of each implementation under jax.profiler and print the "
                         "device time of its kernels per call (XLA's command buffers are switched off for this)")
    ap.add_argument("--top", type=int, default=25, help="kernels listed per profile")
    ap.add_argument("--device-time", type=int, default=0, metavar="CALLS",
                    help="time each operator by its kernels' device time over CALLS calls on rotated inputs (a GPU; "
                         "XLA's command buffers off) instead of as a timed chain")
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
    for op, label, impls, args, n_in, bytes_f, bytes_fb, blocks_cls in cases(a.ops.split(","), dtype, a.scale):
        if a.only not in label:
            continue
        for name, nbytes in (("fwd", bytes_f), ("fwd+bwd", bytes_fb)):
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
                cls = MGPU_BLOCKS.get(op) if impl == "mgpu" else blocks_cls
                tunable = impl in ("pallas", "mgpu") and cls is not None
                candidates = [None] + (tune_candidates(cls, name, args) if a.tune and tunable else [])
                best = None
                for blk in candidates:
                    fn = (lambda *x, blk=blk, fn0=fn0: fn0(*x, blocks=blk)) if blk else fn0
                    try:
                        if impl.startswith(("pallas", "chunked")) or impl == "mgpu":
                            err = check_against(fn, impls["xla"], args, n_in, name)
                            if not err < 2e-2:
                                raise AssertionError(f"relative error {err:.2e} against the XLA reference")
                        # the layer: shorter chains (each iteration is a whole encoder layer; compiles faster)
                        t = (device_time(step_for(fn), args, a.device_time) if a.device_time else
                             per_iteration(step_for(fn), args, a.repeats, lengths=(1, 4) if op == "layer" else None))
                    except Exception as e:  # a candidate that does not compile is reported and skipped
                        print(f"  skip {impl} {blk}: {type(e).__name__}: {str(e)[:300]}", file=sys.stderr)
                        continue
                    if a.tune and tunable:  # every candidate's time, under the row that reports the best
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
