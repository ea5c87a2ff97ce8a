"""Sequence packing (jaxformer/packing.py, `--pack`): the packing fills rows without splitting a sample and is a
function of its inputs; packed shards hold exactly the unpacked samples; the masking is per sample and a one-sample
row masks as unpacked; the loader's batches, state and refusals; and the model gives a packed row's samples the
losses and gradients it gives them one a row."""

import json

import numpy as np
import pytest

import jaxformer.prepare as prep
from jaxformer import examples, loader, packing
from jaxformer.data import DataConfig, DataError
from jaxformer.prepared import PreparedSet
from test_prepare import SEED, SEQ_LEN, assert_same_batch, numbered, take  # noqa: F401 (a fixture)
from test_train_data import cache  # noqa: F401 (a fixture)
from test_trainer import WORDS, compilation_cache  # noqa: F401 (a fixture)

K = 3


def random_rows(rng, n, seq_len, k, longest=None):
    """Stored packed rows of random samples (random token ids below 100, lengths up to ``longest``), as the
    preparation writes them."""
    longest = longest or seq_len
    lengths = np.where(rng.rand(4 * n) < 0.2, longest, rng.randint(packing.MIN_SAMPLE, longest + 1, 4 * n))
    rows = packing.pack(lengths, seq_len, k, seed=int(rng.randint(1000)))[:n]
    used = rows >= 0
    length = np.where(used, lengths[np.where(used, rows, 0)], 0)
    la = np.where(used, 1 + (rng.rand(*rows.shape) * (length - 4)).astype(np.int64), 0)
    tokens = rng.randint(5, 100, 4 * seq_len)
    pairs = examples.Pairs(a0=rng.randint(0, 3 * seq_len, rows.shape), la=la, b0=rng.randint(0, 3 * seq_len, rows.shape),
                           lb=np.where(used, length - 3 - la, 0), nsp=np.where(used, rng.randint(0, 2, rows.shape), 0))
    special = examples.SpecialIds(pad=0, unk=1, cls=2, sep=3, mask=4)
    dtype = examples.row_dtype(seq_len, np.dtype(np.uint16), k)
    return packing.assemble_packed_rows(tokens, pairs, seq_len, special, dtype), special


# ----------------------------------------------------------------------------- the packing
def test_packing_fills_rows_never_splits_a_sample_and_is_deterministic():
    rng = np.random.RandomState(0)
    lengths = np.where(rng.rand(3000) < 0.1, 128, rng.randint(5, 129, 3000))
    for k in (1, 2, 8):
        rows = packing.pack(lengths, 128, k, seed=3, window=1000)
        used = rows >= 0
        assert sorted(rows[used].tolist()) == list(range(len(lengths)))  # each sample once, whole
        assert (used.sum(1) >= 1).all() and (used.sum(1) <= k).all()
        assert (used[:, :-1] >= used[:, 1:]).all()  # used slots first
        assert (np.where(used, lengths[np.where(used, rows, 0)], 0).sum(1) <= 128).all()
        np.testing.assert_array_equal(rows, packing.pack(lengths, 128, k, seed=3, window=1000))
        assert not np.array_equal(rows, packing.pack(lengths, 128, k, seed=4, window=1000))
        fill = lengths.sum() / (128 * len(rows))
        if k == 1:
            assert len(rows) == len(lengths)
        else:  # near the bound sum(lengths) / S rows (K = 2: at most two of these ~70-token samples a row)
            assert fill > (0.75 if k == 2 else 0.98), (k, fill)
    with pytest.raises(ValueError, match="lengths"):
        packing.pack(np.array([5, 129]), 128, 2, seed=0)


def test_masking_per_sample_and_a_one_sample_row_masks_as_unpacked():
    rng = np.random.RandomState(1)
    rows, special = random_rows(rng, 64, 48, K)
    random_ids = np.arange(5, 100)
    n_pred = packing.max_predictions(48, 0.15, K)
    b = packing.masked_packed_batch(rows, np.arange(64), (7, 0), special, random_ids, 0.15, n_pred)
    la, lb = rows["la"].astype(int), rows["lb"].astype(int)
    used = la > 0
    np.testing.assert_array_equal(b["nsp_weights"], used)
    np.testing.assert_array_equal(b["attention_mask"], b["segment_ids"] > 0)
    for r in range(64):
        masked = b["masked_positions"][r][b["masked_weights"][r] > 0]
        seg = b["segment_ids"][r]
        for k in np.flatnonzero(used[r]):
            start = b["nsp_positions"][r, k]
            n = la[r, k] + lb[r, k] + 3
            assert rows["ids"][r, start] == special.cls and (seg[start:start + n] == k + 1).all()
            np.testing.assert_array_equal(b["position_ids"][r, start:start + n], np.arange(n))
            assert b["token_type_ids"][r, start:start + n].tolist() == [0] * (la[r, k] + 2) + [1] * (lb[r, k] + 1)
            assert b["nsp_labels"][r, k] == rows["nsp"][r, k]
            # This sample's own share of the masks (the default max_predictions never cuts one), on its A/B tokens.
            mine = masked[(masked >= start) & (masked < start + n)] - start
            assert len(mine) == max(1, np.rint(0.15 * (la[r, k] + lb[r, k])))
            assert not set(mine.tolist()) & {0, la[r, k] + 1, n - 1}
        total = (la[r] + lb[r] + 3)[used[r]].sum()
        assert (seg[:total] > 0).all() and (seg[total:] == 0).all()  # the samples back to back, then padding
    # Rows of one sample: the unpacked masking, key for key.
    single, _ = random_rows(np.random.RandomState(2), 32, 48, 1)
    plain = examples.masked_batch(single, np.arange(32), (7, 0), special, random_ids, 0.15, 8)
    packed = packing.masked_packed_batch(single, np.arange(32), (7, 0), special, random_ids, 0.15, 8)
    assert_same_batch(plain, {k: v[:, 0] if k == "nsp_labels" else v for k, v in packed.items() if k in plain})
    # A cap below what the samples ask for: each sample's first picks first.
    tight = packing.masked_packed_batch(rows, np.arange(64), (7, 0), special, random_ids, 0.15, 2)
    for r in np.flatnonzero(used.sum(1) >= 2):
        picked = tight["masked_positions"][r][tight["masked_weights"][r] > 0]
        assert len(set(b["segment_ids"][r][picked].tolist())) == len(picked) == 2


def test_default_max_predictions_covers_every_row():
    rng = np.random.RandomState(3)
    for seq_len, k in ((32, 6), (128, 8), (128, 25), (512, 32), (512, 3)):
        bound = packing.max_predictions(seq_len, 0.15, k)
        for _ in range(300):  # rows of up to k samples of random lengths, filled to the brim
            n = rng.randint(1, min(k, seq_len // 5) + 1)
            spare = np.bincount(rng.randint(0, rng.randint(1, n + 1), seq_len - 5 * n), minlength=n)
            real = spare + 2  # each sample: 5 tokens at least, 3 of them specials
            assert np.maximum(1, np.rint(0.15 * real)).sum() <= bound
    assert packing.max_predictions(128, 0.15, 1) == DataConfig(seq_len=128).max_predictions


# ----------------------------------------------------------------------------- prepared, loaded
@pytest.fixture(scope="module")
def packed(numbered, tmp_path_factory):  # noqa: F811
    out = tmp_path_factory.mktemp("packed") / "prepared"
    config = DataConfig(paths=numbered.config.paths, seq_len=SEQ_LEN, eval_fraction=0.1, seed=SEED,
                        vocab=numbered.config.vocab, pack=K)
    manifest = prep.prepare(config, out, workers=0, rows_per_shard=40, progress=False, log=lambda *a: None)
    return PreparedSet(out, SEQ_LEN, numbered.tok, pack=K), manifest


def test_packed_shards_hold_the_unpacked_samples(numbered, packed):  # noqa: F811
    data, manifest = packed
    assert manifest["segments_per_row"] == K and manifest["packing"]["samples_per_row"] == K
    assert manifest["plan"]["pack"] == K and "pack" not in numbered.manifest["plan"]
    for split in ("train", "eval"):
        plain = numbered.data.rows[split].read(np.arange(len(numbered.data.rows[split])))
        rows = data.rows[split].read(np.arange(len(data.rows[split])))
        lengths = plain["la"][:, 0].astype(np.int64) + plain["lb"][:, 0] + 3
        index = packing.pack(lengths, SEQ_LEN, K, SEED)
        assert manifest["packing"][f"{split}_samples"] == len(plain) and len(rows) == len(index) < len(plain)
        assert manifest["counts"]["fill"][split] == round(lengths.sum() / (SEQ_LEN * len(rows)), 4)
        assert manifest["counts"]["fill"][split] > numbered.manifest["counts"]["fill"][split] == \
            round(lengths.mean() / SEQ_LEN, 4)
        for r in range(len(rows)):
            start = 0
            for k, i in enumerate(index[r]):
                if i < 0:
                    assert rows["la"][r, k] == rows["lb"][r, k] == 0
                    continue
                n = lengths[i]
                np.testing.assert_array_equal(rows["ids"][r, start:start + n], plain["ids"][i, :n])
                assert (rows["la"][r, k], rows["lb"][r, k], rows["nsp"][r, k]) == \
                    (plain["la"][i, 0], plain["lb"][i, 0], plain["nsp"][i, 0])
                start += n
            assert (rows["ids"][r, start:] == numbered.data.special.pad).all()


def test_packed_batches_state_and_refusals(numbered, packed, tmp_path, capsys):  # noqa: F811
    data, _ = packed
    p = packing.max_predictions(SEQ_LEN, 0.15, K)
    with loader.train_batches(data, 8, seed=SEED, workers=0) as it:
        straight = take(it, 4)
        state = it.state(2)
    assert {k: v.shape for k, v in straight[0].items()} == {
        "input_ids": (8, SEQ_LEN), "token_type_ids": (8, SEQ_LEN), "attention_mask": (8, SEQ_LEN),
        "segment_ids": (8, SEQ_LEN), "position_ids": (8, SEQ_LEN), "masked_positions": (8, p),
        "masked_labels": (8, p), "masked_weights": (8, p), "nsp_labels": (8, K), "nsp_positions": (8, K),
        "nsp_weights": (8, K)}
    assert json.loads(state)["pack"] == K
    with loader.train_batches(data, 8, seed=SEED, workers=0, state=state) as it:
        assert_same_batch(next(it), straight[2])
    with loader.train_batches(numbered.data, 8, seed=SEED, workers=0) as it:
        plain_state = it.state(2)
    with pytest.raises(DataError, match="pack: saved None, now 3"):
        loader.train_batches(data, 8, seed=SEED, workers=0, state=plain_state, max_predictions=p)
    eval_batch = loader.eval_batches(data, 8, seed=SEED, limit=1)[0]
    assert eval_batch["nsp_weights"].sum() > 8  # several samples a row
    root = data.root
    with pytest.raises(DataError, match=r"prepared with pack_samples=3 \(--pack\); the run asks for pack=False"):
        PreparedSet(root, SEQ_LEN, pack=0)
    with pytest.raises(DataError, match="prepared with pack=False .*the run asks for pack_samples=2"):
        PreparedSet(numbered.out, SEQ_LEN, pack=2)
    # The same directory asked to hold another packing: refused, naming the field.
    config = DataConfig(paths=numbered.config.paths, seq_len=SEQ_LEN, eval_fraction=0.1, seed=SEED,
                        vocab=numbered.config.vocab, pack=2)
    with pytest.raises(DataError, match=r"prepared differently: pack 3 \(now 2\)"):
        prep.prepare(config, root, workers=0, rows_per_shard=40, progress=False, log=lambda *a: None)
    with pytest.raises(DataError, match="pack"):
        DataConfig(seq_len=SEQ_LEN, pack=SEQ_LEN // 5 + 1)
    for argv, needle in ((["--pack", "--pack-samples", "0"], "pack_samples=0"),
                         (["--pack-samples", "2"], "needs --pack")):
        assert prep.main(["--out", str(tmp_path / "x"), "--seq-len", "32", *argv]) == 2
        assert needle in capsys.readouterr().err


# ----------------------------------------------------------------------------- the model
def unpacked(batch):
    """The samples of a packed batch one a row (padded to the same S, positions 0..n-1), and where each unpacked
    masked slot was in the packed batch: (batch, rows of (row, slot) per unpacked (sample, slot), (row, k) per
    sample)."""
    s, p = batch["input_ids"].shape[1], batch["masked_positions"].shape[1]
    out = {k: [] for k in ("input_ids", "token_type_ids", "attention_mask", "masked_positions", "masked_labels",
                           "masked_weights", "nsp_labels")}
    slots, samples = [], []
    for r, k in zip(*np.nonzero(batch["nsp_weights"])):
        start, n = batch["nsp_positions"][r, k], int((batch["segment_ids"][r] == k + 1).sum())
        for key in ("input_ids", "token_type_ids"):
            out[key].append(np.pad(batch[key][r, start:start + n], (0, s - n)))
        out["attention_mask"].append((np.arange(s) < n).astype(np.int32))
        pos, w = batch["masked_positions"][r], batch["masked_weights"][r] > 0
        mine = np.flatnonzero(w & (pos >= start) & (pos < start + n))
        out["masked_positions"].append(np.pad(pos[mine] - start, (0, p - len(mine))))
        out["masked_labels"].append(np.pad(batch["masked_labels"][r, mine], (0, p - len(mine))))
        out["masked_weights"].append(np.pad(np.ones(len(mine), np.float32), (0, p - len(mine))))
        out["nsp_labels"].append(batch["nsp_labels"][r, k])
        slots.append([(r, j) for j in mine])
        samples.append((r, k))
    return {k: np.stack(v) for k, v in out.items()}, slots, samples


@pytest.mark.slow
@pytest.mark.parametrize("kernels", ["xla", "pallas"])
def test_a_packed_row_gives_its_samples_the_unpacked_losses_and_gradients(kernels):
    """Per-sample MLM and NSP nll, and the gradients of their sum, of packed rows equal those of the same samples
    one a row (dropout 0, float32): nothing leaks between the samples of a row."""
    import jax
    import jax.numpy as jnp

    from jaxformer.config import BertConfig, TrainConfig
    from jaxformer.losses import per_example_losses
    from jaxformer.steps import Steps, _forward, build_model, make_optimizer

    cfg = BertConfig(vocab_size=97, hidden_size=32, num_hidden_layers=2, num_attention_heads=2, intermediate_size=64,
                     max_position_embeddings=32, hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0,
                     kernels=kernels, dtype="float32")
    rows, special = random_rows(np.random.RandomState(4), 2, 32, 4, longest=12)
    batch = packing.masked_packed_batch(rows, np.arange(2), (0, 0), special, np.arange(5, 97), 0.15, 8)
    assert batch["nsp_weights"].sum() >= 5  # several samples a row
    plain, slots, samples = unpacked(batch)
    model = build_model(cfg, 0)
    tc = TrainConfig(batch_size=2, seq_len=32, steps=10, warmup_steps=1, dropout=0.0)
    steps = Steps(model, make_optimizer(tc), tc)
    params = steps.init_state(model, 0).params

    def losses(p, b):
        nll, _, nsp_nll, _ = per_example_losses(_forward(steps.graphdef, steps.rest, p, b, deterministic=True), b)
        weights = b.get("nsp_weights", jnp.ones_like(nsp_nll))
        return jnp.sum(nll * b["masked_weights"]) + jnp.sum(nsp_nll * weights), (nll, nsp_nll)

    grad = jax.jit(jax.value_and_grad(losses, has_aux=True))
    with jax.default_matmul_precision("highest"):
        (total_p, (nll_p, nsp_p)), grads_p = grad(params, batch)
        (total_u, (nll_u, nsp_u)), grads_u = grad(params, plain)
    assert nsp_p.shape == batch["nsp_labels"].shape
    for i, pairs in enumerate(slots):
        for j, (r, slot) in enumerate(pairs):
            np.testing.assert_allclose(nll_p[r, slot], nll_u[i, j], rtol=2e-5)
    np.testing.assert_allclose(np.array([nsp_p[r, k] for r, k in samples]), nsp_u, rtol=2e-5)
    np.testing.assert_allclose(total_p, total_u, rtol=1e-5)
    for a, b in zip(jax.tree.leaves(grads_p), jax.tree.leaves(grads_u)):
        np.testing.assert_allclose(a, b, rtol=2e-4, atol=2e-6 * float(np.abs(b).max()))


# ----------------------------------------------------------------------------- train.py --pack
@pytest.fixture(scope="module")
def short_docs(tmp_path_factory):
    """A corpus of documents of one short sentence: samples far shorter than a row."""
    rng = np.random.RandomState(0)
    docs = [" ".join(rng.choice(WORDS, rng.randint(2, 5))).capitalize() + "." for _ in range(300)]
    path = tmp_path_factory.mktemp("short") / "corpus.txt"
    path.write_text("\n\n".join(docs) + "\n")
    return path


@pytest.mark.slow
def test_train_py_packs_reports_tokens_per_second_and_refuses_another_packing(short_docs, cache, tmp_path,
                                                                              capsys):  # noqa: F811
    import train as cli
    from test_train_data import FLAGS, expect_error
    from test_trainer import metrics

    corpus, out = short_docs, tmp_path / "packed"
    assert cli.main(["--data", str(corpus), "--out", str(out), "--vocab-size", "64", "--pack", "--pack-samples",
                     "3", *FLAGS]) == 0
    printed = capsys.readouterr().out
    assert "packed into" in printed and "rows of up to 3" in printed and "fill" in printed
    records = [r for r in metrics(out) if "loss" in r]
    assert len(records) == 3 and all(r["tokens_per_s"] > 0 and r["samples_per_s"] > r["seq_per_s"] for r in records)
    assert json.loads((out / "run.json").read_text())["train_config"]["pack_samples"] == 3
    (entry,) = [p for p in (cache / "prepared").iterdir() if p.is_dir()]
    expect_error(capsys, ["--data", str(entry), "--out", str(tmp_path / "plain"), *FLAGS],
                 "was prepared with pack_samples=3 (--pack); the run asks for pack=False (one sample a row)")
    expect_error(capsys, ["--data", str(entry), "--out", str(tmp_path / "other"), "--pack", *FLAGS],
                 "was prepared with pack_samples=3 (--pack); the run asks for pack_samples=2 (--pack)")
    expect_error(capsys, ["--out", str(out), "--resume", "--steps", "4", "--pack-samples", "4"],
                 "pack_samples: the run has 3, given 4")
    expect_error(capsys, ["--out", str(tmp_path / "bad"), "--pack", "--pack-samples", "0", *FLAGS],
                 "pack_samples=0 must be an integer in [1, seq_len // 5 = 6]")
    expect_error(capsys, ["--out", str(tmp_path / "bad"), "--pack-samples", "2", *FLAGS], "needs pack=True (--pack)")
