"""The MLM cross-entropy: the chunked loss and the fused kernels against the reference that materialises the logits
(values, argmax and gradients; the kernels in interpret mode here, compiled on a GPU in the gpu-marked tests), both
backward forms of the kernels (recomputing, stored probabilities), and the registry's choice between them."""

import logging

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import pallas_kernels.mlm_loss as mlm_loss
from pallas_kernels import registry
from pallas_kernels.mlm_loss import mlm_cross_entropy_chunked, mlm_cross_entropy_fused
from pallas_kernels.mlm_loss.kernel import Blocks
from pallas_kernels.mlm_loss.reference import mlm_cross_entropy


def _inputs(lead, v, d, h_dtype, e_dtype, seed=0):
    """Random inputs with logits of standard deviation ~2 (neither uniform nor one-hot softmax), labels that include
    the first and last columns, and weights with some zeros (the overlap columns have their own test)."""
    rng = np.random.default_rng(seed)  # numpy, not jax.random: no per-shape compiles in a test that must be fast
    h = jnp.asarray(rng.standard_normal((*lead, d), np.float32)).astype(h_dtype)
    e = jnp.asarray(2.0 / np.sqrt(d) * rng.standard_normal((v, d), np.float32)).astype(e_dtype)
    bias = jnp.asarray(0.5 * rng.standard_normal(v, np.float32))
    labels = rng.integers(0, v, lead).reshape(-1)
    edge = [0, v - 1, v - 2, v // 2, max(v - 300, 0)][: labels.size]
    labels[: len(edge)] = edge
    weights = rng.uniform(size=lead).astype(np.float32) * (np.arange(np.prod(lead)).reshape(lead) % 5 != 3)
    return h, e, bias, jnp.asarray(labels.reshape(lead), jnp.int32), jnp.asarray(weights)


def _run(fn, h, e, bias, labels, weights):
    """One jitted program per implementation: (nll, predictions) and the grads of sum(nll * weights)."""
    def loss(h, e, bias):
        nll, pred = fn(h, e, bias, labels)
        return jnp.sum(nll * weights), (nll, pred)

    (_, out), grads = jax.jit(jax.value_and_grad(loss, argnums=(0, 1, 2), has_aux=True))(h, e, bias)
    return out, grads


def _logits64(h, e, bias):
    return np.einsum("...d,vd->...v", np.asarray(h, np.float64), np.asarray(e, np.float64)) + np.asarray(bias)


def _close(actual, expected, rtol):
    """Relative to each tensor's scale: an element near zero is judged against the largest element."""
    a, x = np.asarray(actual, np.float32), np.asarray(expected, np.float32)
    np.testing.assert_allclose(a, x, rtol=rtol, atol=rtol * np.abs(x).max())


def _check_predictions(pred, pred_ref, logits, tol):
    """Argmax equal, except where two logits tie within the rounding of the chunked GEMM."""
    pred, pred_ref = np.asarray(pred), np.asarray(pred_ref)
    assert pred.dtype == np.int32 and pred.shape == pred_ref.shape
    picked = np.take_along_axis(logits, pred[..., None], -1)[..., 0]
    np.testing.assert_array_less(logits.max(-1) - picked, tol + 1e-6)
    assert (pred == pred_ref).mean() >= 0.98


def _chunked(chunk):
    return lambda *a: mlm_cross_entropy_chunked(*a, chunk=chunk)


CASES = [  # lead, V, D, chunk
    ((37,), 1000, 32, 256),      # V not a multiple of the chunk: the last chunk overlaps the previous one
    ((4, 9), 512, 48, 128),      # V a multiple of the chunk
    ((2, 3, 5), 100, 16, 256),   # chunk larger than V: one chunk
    ((20,), 61, 8, 7),           # many small chunks, the last one overlaps by 2 columns
]


@pytest.mark.parametrize("lead,v,d,chunk", CASES)
def test_fp32_matches_reference(lead, v, d, chunk):
    h, e, bias, labels, w = _inputs(lead, v, d, jnp.float32, jnp.float32)
    with jax.default_matmul_precision("highest"):
        (nll, pred), grads = _run(_chunked(chunk), h, e, bias, labels, w)
        (nll_ref, pred_ref), grads_ref = _run(mlm_cross_entropy, h, e, bias, labels, w)
    assert nll.dtype == jnp.float32 and nll.shape == lead and np.all(np.asarray(nll) > 0)
    _close(nll, nll_ref, 1e-5)
    logits = _logits64(h, e, bias)
    _check_predictions(pred, pred_ref, logits, 1e-5)
    for g, g_ref, x in zip(grads, grads_ref, (h, e, bias)):
        assert g.dtype == x.dtype and g.shape == x.shape
        _close(g, g_ref, 1e-5)
    # What `pretraining_losses` reports: the weighted mean loss and the weighted count of correct predictions.
    w, lab = np.asarray(w, np.float64), np.asarray(labels)
    logz = np.log(np.exp(logits - logits.max(-1, keepdims=True)).sum(-1)) + logits.max(-1)
    nll64 = logz - np.take_along_axis(logits, lab[..., None], -1)[..., 0]
    np.testing.assert_allclose(np.sum(np.asarray(nll) * w) / w.sum(), np.sum(nll64 * w) / w.sum(), rtol=1e-5)
    assert np.sum((np.asarray(pred) == lab) * w) == pytest.approx(np.sum((logits.argmax(-1) == lab) * w))


@pytest.mark.parametrize("lead,v,d,chunk,e_dtype", [(*CASES[0], jnp.bfloat16), (*CASES[1], jnp.float32)])
def test_bf16_matches_reference(lead, v, d, chunk, e_dtype):
    """bf16 hidden states, with bf16 embeddings or the float32 parameter cast chunk by chunk (the model's case)."""
    h, e, bias, labels, w = _inputs(lead, v, d, jnp.bfloat16, e_dtype, seed=1)
    (nll, pred), grads = _run(_chunked(chunk), h, e, bias, labels, w)
    (nll_ref, pred_ref), grads_ref = _run(mlm_cross_entropy, h, e, bias, labels, w)
    assert nll.dtype == jnp.float32
    _close(nll, nll_ref, 2e-2)
    _check_predictions(pred, pred_ref, _logits64(h, e.astype(jnp.bfloat16), bias), 2e-2)
    for g, g_ref, x in zip(grads, grads_ref, (h, e, bias)):
        assert g.dtype == x.dtype and g.shape == x.shape
        _close(g, g_ref, 2e-2)


@pytest.mark.parametrize("v,valid,chunk", [(128, 97, 32), (128, 97, 256), (61, 50, 7)])
def test_vocab_size_excludes_padding_columns(v, valid, chunk):
    """vocab_size < V (the model's padded vocabulary): padding columns are never predicted, add nothing to logz and
    get zero gradients, even when they would win (large bias), including whole chunks of padding never read."""
    h, e, bias, labels, w = _inputs((19,), v, 16, jnp.float32, jnp.float32, seed=4)
    labels = labels % valid
    bias = bias.at[valid:].set(30.0)
    with jax.default_matmul_precision("highest"):
        (nll, pred), grads = _run(lambda *a: mlm_cross_entropy_chunked(*a, chunk=chunk, vocab_size=valid),
                                  h, e, bias, labels, w)
        (nll_ref, pred_ref), grads_ref = _run(lambda *a: mlm_cross_entropy(*a, vocab_size=valid),
                                              h, e, bias, labels, w)
        (nll_cut, _), grads_cut = _run(mlm_cross_entropy, h, e[:valid], bias[:valid], labels, w)
    _close(nll, nll_ref, 1e-5)
    _close(nll, nll_cut, 1e-5)
    assert np.all(np.asarray(pred) < valid)
    np.testing.assert_array_equal(np.asarray(pred), np.asarray(pred_ref))
    for g, g_ref in zip(grads, grads_ref):
        _close(g, g_ref, 1e-5)
    assert not np.any(np.asarray(grads[1])[valid:]) and not np.any(np.asarray(grads[2])[valid:])
    _close(grads[1][:valid], grads_cut[1], 1e-5)
    with pytest.raises(ValueError, match="vocab_size=0"):
        mlm_cross_entropy_chunked(h, e, bias, labels, vocab_size=0)


def test_overlapped_columns_counted_once():
    """A dominant logit and labels inside the last chunk's overlap: it wins the argmax, enters logz once, and its
    dE/d_bias rows are not doubled."""
    h, e, bias, labels, w = _inputs((12,), 1000, 32, jnp.float32, jnp.float32, seed=3)
    bias = bias.at[750].set(20.0)  # chunk 256: the last chunk reads [744, 1000), 744..767 belong to chunk 2
    labels = labels.at[3:6].set(jnp.array([744, 750, 767]))
    with jax.default_matmul_precision("highest"):
        (nll, pred), grads = _run(_chunked(256), h, e, bias, labels, w)
        (nll_ref, pred_ref), grads_ref = _run(mlm_cross_entropy, h, e, bias, labels, w)
    _close(nll, nll_ref, 1e-5)
    np.testing.assert_array_equal(np.asarray(pred), np.asarray(pred_ref))
    assert np.all(np.asarray(pred) == 750)
    for g, g_ref in zip(grads, grads_ref):
        _close(g, g_ref, 1e-5)


def test_jitted_memory_is_below_the_logits():
    """Forward + backward at N=512, V=30522 (fp32 logits 62 MB): the chunked temporaries stay far below that."""
    n, v, d = 512, 30522, 64
    h, e, bias = jnp.ones((n, d), jnp.bfloat16), jnp.ones((v, d), jnp.float32), jnp.ones((v,), jnp.float32)
    labels = jnp.zeros((n,), jnp.int32)

    def temp_bytes(fn):
        grad = jax.grad(lambda h, e, b: jnp.sum(fn(h, e, b, labels)[0]), argnums=(0, 1, 2))
        stats = jax.jit(grad).lower(h, e, bias).compile().memory_analysis()
        return None if stats is None else stats.temp_size_in_bytes

    chunked = temp_bytes(lambda *a: mlm_cross_entropy_chunked(*a, chunk=2048))
    reference = temp_bytes(mlm_cross_entropy)
    if chunked is None or reference is None:
        pytest.skip("no memory analysis on this backend")
    logits_bytes = n * v * 4
    assert reference >= logits_bytes
    assert chunked < logits_bytes // 4, (chunked, reference)


@pytest.mark.parametrize("kwargs,match", [
    ({"e": jnp.ones((10, 7))}, "embedding"),
    ({"bias": jnp.ones((9,))}, "output_bias"),
    ({"labels": jnp.zeros((3,), jnp.int32)}, "labels shape"),
    ({"labels": jnp.zeros((2, 4), jnp.float32)}, "labels must be integers"),
    ({"chunk": 0}, "chunk=0"),
])
def test_bad_input_raises(kwargs, match):
    args = {"h": jnp.ones((2, 4, 8)), "e": jnp.ones((10, 8)), "bias": jnp.ones((10,)),
            "labels": jnp.zeros((2, 4), jnp.int32), "chunk": 4}
    args.update(kwargs)
    with pytest.raises(ValueError, match=match):
        mlm_cross_entropy_chunked(args["h"], args["e"], args["bias"], args["labels"], chunk=args["chunk"])


def test_chunked_under_a_data_fsdp_mesh():
    """The train step's placement under data=2,fsdp=4 (h split on the batch over data and fsdp, the tied table split
    on D over fsdp, as sharding.PARAM_RULES does): GSPMD partitions the chunk scan and its custom VJP to the same
    values and gradients as one device."""
    h, e, bias, labels, w = _inputs((8, 5), 300, 32, jnp.float32, jnp.float32, seed=6)
    with jax.default_matmul_precision("highest"):
        _check_on_data_fsdp_mesh(lambda *a: mlm_cross_entropy_chunked(*a, chunk=128, vocab_size=290),
                                 h, e, bias, labels % 290, w)


def _check_on_data_fsdp_mesh(fn, h, e, bias, labels, w):
    """fn's values and gradients on one device against data=2,fsdp=4 as `sharding.PARAM_RULES` places the inputs."""
    from jax.sharding import NamedSharding, PartitionSpec as P
    (nll_ref, pred_ref), grads_ref = _run(fn, h, e, bias, labels, w)
    mesh = jax.make_mesh((2, 4), ("data", "fsdp"), axis_types=(jax.sharding.AxisType.Auto,) * 2)
    put = lambda a, spec: jax.device_put(a, NamedSharding(mesh, spec))  # noqa: E731
    with jax.set_mesh(mesh):
        args = (put(h, P(("data", "fsdp"))), put(e, P(None, "fsdp")), put(bias, P()),
                put(labels, P(("data", "fsdp"))), put(w, P(("data", "fsdp"))))
        (nll, pred), grads = _run(fn, *args)
    assert np.isfinite(np.asarray(nll_ref)).all()
    _close(nll, nll_ref, 1e-5)
    np.testing.assert_array_equal(np.asarray(pred), np.asarray(pred_ref))
    for g, g_ref in zip(grads, grads_ref):
        _close(g, g_ref, 1e-5)


# --------------------------------------------------------------------------------------------------- fused kernels

FUSED_CASES = [  # lead, V, valid, D, blocks: partial row / column tiles, V below one tile, whole tiles of padding
    ((37,), 1000, 1000, 32, Blocks()),                                              # rows and columns partial
    ((4, 16), 512, 500, 48, Blocks(block_m=32, block_v=64, bwd_block_v=128)),       # whole tiles, BK = 16
    ((3, 7), 100, 100, 64, Blocks()),                                                # V < BV: one partial tile
    ((300,), 300, 230, 64, Blocks(block_m=64, block_v=64, bwd_block_v=32)),         # a tile of padding only
]


def _fused(blocks, valid=None):
    return lambda *a: mlm_cross_entropy_fused(*a, vocab_size=valid, blocks=blocks)


@pytest.mark.parametrize("lead,v,valid,d,blocks", FUSED_CASES)
@pytest.mark.parametrize("e_dtype", [jnp.float32, jnp.bfloat16])
def test_fused_matches_reference(lead, v, valid, d, blocks, e_dtype):
    """bf16 h (the kernels' dtype), with the float32 table (the model's case) or a bf16 one: nll to float32 accuracy
    against float64 logits of the same bf16 operands, argmax, and gradients against the reference."""
    h, e, bias, labels, w = _inputs(lead, v, d, jnp.bfloat16, e_dtype, seed=7)
    labels = labels % valid
    (nll, pred), grads = _run(_fused(blocks, valid), h, e, bias, labels, w)
    (nll_ref, pred_ref), grads_ref = _run(lambda *a: mlm_cross_entropy(*a, vocab_size=valid), h, e, bias, labels, w)
    assert nll.dtype == jnp.float32 and nll.shape == lead and pred.shape == lead
    logits = _logits64(h, e.astype(jnp.bfloat16), bias)[..., :valid]
    logz = np.log(np.exp(logits - logits.max(-1, keepdims=True)).sum(-1)) + logits.max(-1)
    nll64 = logz - np.take_along_axis(logits, np.asarray(labels)[..., None], -1)[..., 0]
    _close(nll, nll64, 1e-5)
    _close(nll, nll_ref, 1e-5)
    _check_predictions(pred, pred_ref, logits, 1e-5)
    for g, g_ref, x in zip(grads, grads_ref, (h, e, bias)):
        assert g.dtype == x.dtype and g.shape == x.shape
        _close(g, g_ref, 2e-2)
    assert not np.any(np.asarray(grads[1])[valid:]) and not np.any(np.asarray(grads[2])[valid:])


def test_fused_gradients_against_float64():
    """The fused backward's float32 parts to float32 accuracy: with bf16 h and table the kernels' d_logits are
    rounded to bf16 only for the two GEMMs, so d_bias (float32 column sums in the kernel) matches float64."""
    h, e, bias, labels, w = _inputs((45,), 333, 32, jnp.bfloat16, jnp.bfloat16, seed=8)
    _, (_, _, db) = _run(_fused(Blocks(block_m=16, block_v=64, bwd_block_v=64)), h, e, bias, labels, w)
    logits = _logits64(h, e, bias)
    p = np.exp(logits - logits.max(-1, keepdims=True))
    p /= p.sum(-1, keepdims=True)
    d_logits = (p - np.eye(333)[np.asarray(labels)]) * np.asarray(w, np.float64)[:, None]
    _close(db, d_logits.sum(0), 1e-5)


def test_fused_argmax_ties_take_the_first_column():
    """Equal logits in one tile and across tiles: the first column wins, as jnp.argmax."""
    h, e, bias, labels, w = _inputs((20,), 200, 32, jnp.bfloat16, jnp.float32, seed=9)
    e = e.at[70].set(e[3]).at[150].set(e[3]).at[5].set(e[3])
    bias = bias.at[jnp.array([3, 5, 70, 150])].set(40.0)  # the tied columns win every row
    (nll, pred), _ = _run(_fused(Blocks(block_m=16, block_v=64, bwd_block_v=64)), h, e, bias, labels, w)
    np.testing.assert_array_equal(np.asarray(pred), 3)
    (nll_ref, _), _ = _run(mlm_cross_entropy, h, e, bias, labels, w)
    _close(nll, nll_ref, 1e-5)


def test_chunked_runs_where_the_kernels_do_not_apply(caplog, monkeypatch):
    """float32 h (a Triton dot would round through TF32 on the GPU) and a width of 8 run the chunked loss, exactly, with
    a warning naming why; the fused entry refuses them with the same reason; bf16 at a width of 32 runs the kernels."""
    monkeypatch.setattr(registry, "_LOGGED", set())
    for dtype, d, why in ((jnp.float32, 32, "h.dtype=float32 must be bfloat16 or float16"),
                          (jnp.bfloat16, 8, "width D=8 must be a multiple of 16")):
        h, e, bias, labels, w = _inputs((10,), 100, d, dtype, jnp.float32, seed=10)
        with caplog.at_level(logging.WARNING, logger="pallas_kernels"):
            out = _run(mlm_loss.mlm_cross_entropy, h, e, bias, labels, w)
        want = _run(mlm_cross_entropy_chunked, h, e, bias, labels, w)
        for a, b in zip(jax.tree.leaves(out), jax.tree.leaves(want)):
            np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
        assert any(why in r.getMessage() and "running chunked" in r.getMessage() for r in caplog.records), why
        with pytest.raises(ValueError, match=why):
            mlm_cross_entropy_fused(h, e, bias, labels)
    call = mlm_loss.Call(10, 100, 32, "bfloat16")
    assert registry.choose("mlm_cross_entropy", call, log_skips=False).impl.name == "triton"


def test_fused_bad_input_raises():
    with pytest.raises(ValueError, match="labels shape"):
        mlm_cross_entropy_fused(jnp.ones((2, 4, 16), jnp.bfloat16), jnp.ones((10, 16)), jnp.ones((10,)),
                                jnp.zeros((3,), jnp.int32))
    with pytest.raises(ValueError, match="vocab_size=11"):
        mlm_cross_entropy_fused(jnp.ones((2, 16), jnp.bfloat16), jnp.ones((10, 16)), jnp.ones((10,)),
                                jnp.zeros((2,), jnp.int32), vocab_size=11)
    with pytest.raises(ValueError, match="probs_dtype=int8"):
        mlm_cross_entropy_fused(jnp.ones((2, 16), jnp.bfloat16), jnp.ones((10, 16)), jnp.ones((10,)),
                                jnp.zeros((2,), jnp.int32), probs_dtype=jnp.int8)


@pytest.mark.parametrize("probs_dtype", [None, "bfloat16"])
def test_fused_under_a_data_fsdp_mesh(probs_dtype):
    """data=2,fsdp=4 as the train step places it (h on the batch, the table split on D over fsdp): the kernels run
    per batch shard in shard_map and give the one-device values and gradients (the replicated table's and bias's
    gradients summed over the shards once), with the recomputing backward kernel or the stored probabilities (split
    on the rows like h, the backward's elementwise pass and column sums left to GSPMD)."""
    h, e, bias, labels, w = _inputs((8, 5), 300, 32, jnp.bfloat16, jnp.float32, seed=11)
    blocks = Blocks(block_m=16, block_v=64, bwd_block_v=64)
    _check_on_data_fsdp_mesh(lambda *a: mlm_cross_entropy_fused(*a, vocab_size=290, blocks=blocks,
                                                                probs_dtype=probs_dtype), h, e, bias, labels % 290, w)


@pytest.mark.gpu
@pytest.mark.parametrize("rows", [1280, 1000])
def test_fused_compiled_at_bert_large(rows):
    """BERT-large's decoder (D = 1024, the padded vocabulary 30528 with 30522 real columns), compiled: against the
    reference on the GPU, with 1280 masked rows per step and a row count that leaves a partial row tile."""
    h, e, bias, labels, w = _inputs((rows,), 30528, 1024, jnp.bfloat16, jnp.float32, seed=12)
    labels = labels % 30522
    (nll, pred), grads = _run(_fused(None, 30522), h, e, bias, labels, w)
    (nll_ref, pred_ref), grads_ref = _run(lambda *a: mlm_cross_entropy(*a, vocab_size=30522), h, e, bias, labels, w)
    _close(nll, nll_ref, 1e-5)
    assert (np.asarray(pred) == np.asarray(pred_ref)).mean() >= 0.98
    for g, g_ref in zip(grads, grads_ref):
        _close(g, g_ref, 2e-2)


# ------------------------------------------------------------------- the stored-probabilities backward of the kernels

UNIT_ROUNDOFF = {"bfloat16": 2.0**-8, "float16": 2.0**-11, "float32": 2.0**-24}


def _bias_float64(h, e, bias, labels, w, valid):
    """The float64 bias gradient of sum(nll * w) over the real columns and, per column, sum_n |w_n| (p_nc + onehot_nc)
    and sum |w|: what `_over_bound` scales the allowed error by."""
    h64, e64 = np.asarray(h, np.float64).reshape(-1, h.shape[-1]), np.asarray(e.astype(h.dtype), np.float64)
    logits = (h64 @ e64.T + np.asarray(bias, np.float64))[:, :valid]
    p = np.exp(logits - logits.max(-1, keepdims=True))
    p /= p.sum(-1, keepdims=True)
    onehot = np.asarray(labels).reshape(-1, 1) == np.arange(valid)
    w64 = np.asarray(w, np.float64).reshape(-1, 1)
    return ((p - onehot) * w64).sum(0), (np.abs(w64) * (p + onehot)).sum(0), np.abs(w64).sum()


def _over_bound(db, ref, u):
    """max over the real columns of |d_bias - float64| / ((u + 1e-5) * sum_n |w_n| (p_nc + onehot_nc) + 2^-24 sum|w|):
    each stored probability may be off by u of itself (u = the storage's unit roundoff; 2^-24 absolute covers
    float16's subnormals), plus float32's own rounding. A tile scaled by the wrong max is off by far more."""
    db64, scale, total = ref
    bound = (u + 1e-5) * scale + 2.0**-24 * total
    return float(np.max(np.abs(np.asarray(db, np.float64)[: db64.size] - db64) / bound))


STORED_CASES = FUSED_CASES + [((20,), 200, 190, 32, Blocks(block_m=16, block_v=64))]  # + ties, below


@pytest.mark.slow
@pytest.mark.parametrize("case", range(len(STORED_CASES)))
def test_fused_stored_probabilities_backward(case):
    """probs_dtype: the forward stores exp(logit - tile max) and the backward scales it by exp(tile max - logz) in
    XLA. Fresh inputs on partial row and column tiles, V below one tile, a tile of padding only, and (the last case)
    logits tied within a tile and across tiles (the partial last one): the forward's outputs are the recompute path's
    bit for bit; the bias gradient is within its storage's rounding of float64 column by column; dh and dE match the
    recompute path's and the reference's; padding columns get zero gradient."""
    lead, v, valid, d, blocks = STORED_CASES[case]
    h, e, bias, labels, w = _inputs(lead, v, d, jnp.bfloat16, jnp.float32, seed=20 + case)
    labels = labels % valid
    if case == len(STORED_CASES) - 1:  # columns 3, 5 (tile 0), 70 (tile 1), 150 and 189 (tile 2, partial) tie
        ties = jnp.array([3, 5, 70, 150, 189])
        e = e.at[ties].set(e[3])
        bias = bias.at[ties].set(3.0)
    (nll, pred), grads = _run(_fused(blocks, valid), h, e, bias, labels, w)
    (_, _), grads_ref = _run(lambda *a: mlm_cross_entropy(*a, vocab_size=valid), h, e, bias, labels, w)
    ref64 = _bias_float64(h, e, bias, labels, w, valid)
    assert _over_bound(grads[2], ref64, 0.0) < 1
    for probs_dtype, u in UNIT_ROUNDOFF.items():
        fn = lambda *a, pd=probs_dtype: mlm_cross_entropy_fused(*a, vocab_size=valid, blocks=blocks,  # noqa: E731
                                                                probs_dtype=pd)
        (nll_s, pred_s), grads_s = _run(fn, h, e, bias, labels, w)
        np.testing.assert_array_equal(np.asarray(nll_s), np.asarray(nll))
        np.testing.assert_array_equal(np.asarray(pred_s), np.asarray(pred))
        assert _over_bound(grads_s[2], ref64, u) < 1, probs_dtype
        for g, g_rec, g_ref, x in zip(grads_s, grads, grads_ref, (h, e, bias)):
            assert g.dtype == x.dtype and g.shape == x.shape
            _close(g, g_rec, 2e-2)
            _close(g, g_ref, 2e-2)
        assert not np.any(np.asarray(grads_s[1])[valid:]) and not np.any(np.asarray(grads_s[2])[valid:])


@pytest.mark.gpu
def test_fused_stored_probabilities_compiled():
    """Compiled, on the model's table (30592 rows, 30522 real: the last tile part padding) at D = 1024 with 1000 rows
    (a partial row tile), fresh inputs: each probs_dtype's forward is the recompute path's (to 1e-6), its bias
    gradient within its storage's rounding of float64 column by column (the recompute path's within float32's),
    dh and dE as the recompute path's and the reference's."""
    v, valid = 30592, 30522
    h, e, bias, labels, w = _inputs((1000,), v, 1024, jnp.bfloat16, jnp.float32, seed=30)
    labels = labels % valid
    (nll, pred), grads = _run(_fused(None, valid), h, e, bias, labels, w)
    _, grads_ref = _run(lambda *a: mlm_cross_entropy(*a, vocab_size=valid), h, e, bias, labels, w)
    ref64 = _bias_float64(h, e, bias, labels, w, valid)
    assert _over_bound(grads[2], ref64, 0.0) < 1
    for probs_dtype, u in UNIT_ROUNDOFF.items():
        fn = lambda *a, pd=probs_dtype: mlm_cross_entropy_fused(*a, vocab_size=valid, probs_dtype=pd)  # noqa: E731
        (nll_s, pred_s), grads_s = _run(fn, h, e, bias, labels, w)
        _close(nll_s, nll, 1e-6)  # the same forward math (compiled separately: equal in practice, not by contract)
        assert (np.asarray(pred_s) == np.asarray(pred)).mean() >= 0.999
        assert _over_bound(grads_s[2], ref64, u) < 1, probs_dtype
        for g, g_rec, g_ref in zip(grads_s, grads, grads_ref):
            _close(g, g_rec, 2e-2)
            _close(g, g_ref, 2e-2)
        assert not np.any(np.asarray(grads_s[1])[valid:]) and not np.any(np.asarray(grads_s[2])[valid:])
