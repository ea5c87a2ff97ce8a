"""train.py with --grad-compression: the flags are checked before any work, a compressed run writes metrics and
checkpoints, resumes exactly, and --resume refuses what its optimizer state cannot follow (compression on or off,
its minimum size, the mesh); jaxformer.hlo_report compiles the compressed step."""

import dataclasses
import json
import shutil

import pytest

import train as cli
from jaxformer import run
from jaxformer.compression import SELECTIONS
from jaxformer.config import COMPRESSION_SELECTIONS, MeshConfig, TrainConfig
from test_resume import final_checksum
from test_runs import corpus, expect_error, tokenizer_cache  # noqa: F401 (fixtures)
from test_trainer import compilation_cache, metrics  # noqa: F401 (a fixture)

TIMING = ("seq_per_s", "tokens_per_s", "samples_per_s", "data_wait_s")
MESH = "data=2,fsdp=4"  # the 8 test devices: compression over data=2, fsdp's reduce-scatter dense inside
# --compression-min-size 1024: the tiny model's shards (fsdp=4) are sent sparse, not whole.
COMPRESSED = ["--mesh", MESH, "--grad-compression", "topk-balanced", "--density", "0.01",
              "--compression-min-size", "1024"]


def args(corpus, out, *extra):
    return ["--data", str(corpus), "--out", str(out), "--seq-len", "16", "--batch-size", "8", "--vocab-size", "64",
            "--steps", "6", "--warmup-steps", "1", "--log-every", "1", "--eval-every", "3", "--save-every", "3",
            "--eval-batches", "1", "--dropout", "0", "--no-progress", *extra]


def records(out):
    return [{k: v for k, v in r.items() if k not in TIMING} for r in metrics(out)]


@pytest.fixture(scope="module")
def compressed(corpus, tmp_path_factory):
    """A finished 6-step compressed run (checkpoints 3 and 6), trained once."""
    out = tmp_path_factory.mktemp("compressed") / "run"
    with pytest.MonkeyPatch.context() as m:
        m.setenv("JAXFORMER_CACHE_DIR", str(tmp_path_factory.getbasetemp() / "jaxformer-cache"))
        assert cli.main(args(corpus, out, *COMPRESSED)) == 0
    return out


@pytest.mark.parametrize("flags, needles", [
    (["--density", "0"], ["density=0.0"]),
    (["--density", "1.5"], ["density=1.5"]),
    (["--density", "nan"], ["density=nan"]),
    (["--compression-min-size", "0"], ["compression_min_size=0"]),
    (["--compression-warmup-steps", "-1"], ["compression_warmup_steps=-1"]),
    (["--compression-freeze-variance-after", "-5"], ["compression_freeze_variance_after=-5"]),
    (["--grad-compression", "topk-allgather", "--mesh", "fsdp=-1"],
     ["grad_compression='topk-allgather'", "data=1,fsdp=8", "more than one device"]),
    (["--grad-compression", "topk-balanced", "--mesh", "data=1,tensor=2,fsdp=4"],
     ["grad_compression='topk-balanced'", "data=1,fsdp=4,tensor=2"]),
])
def test_bad_compression_flags_exit_2_before_any_work(corpus, tmp_path, capsys, flags, needles):
    out = tmp_path / "run"
    expect_error(capsys, args(corpus, out, *flags), *needles)
    assert not out.exists()


def test_selection_choices_are_the_librarys():
    assert COMPRESSION_SELECTIONS == SELECTIONS


@pytest.mark.slow
def test_a_compressed_run_writes_metrics_and_checkpoints(compressed):
    steps = [r for r in metrics(compressed) if "loss" in r]
    assert [r["step"] for r in steps] == [1, 2, 3, 4, 5, 6]
    assert all(r["compression_selected"] > 0 and r["compression_overflowed"] >= 0 for r in steps)
    evals = [r for r in metrics(compressed) if "eval_mlm_loss" in r]
    assert [r["step"] for r in evals] == [3, 6]
    assert evals[1]["eval_mlm_loss"] < evals[0]["eval_mlm_loss"]  # it trained (the same held-out batch)
    assert sorted(p.name for p in (compressed / "checkpoints").iterdir()) == ["3", "6"]
    record = json.loads((compressed / "run.json").read_text())
    assert record["mesh"] == MeshConfig.parse(MESH).spec()
    assert record["train_config"]["grad_compression"] == "topk-balanced"


@pytest.mark.slow
def test_a_compressed_run_resumes_exactly(corpus, compressed, tmp_path, monkeypatch):
    """Stopped after step 4 (a checkpoint there, as Ctrl-C does) and resumed: the uninterrupted run's metrics and
    final state, bit for bit (the residuals and the exchange's state travel with the optimizer state)."""
    from jaxformer import loop
    out = tmp_path / "run"
    with monkeypatch.context() as m:
        m.setattr(loop, "_stop_agreed", lambda requested, s, tc: s == 4)
        assert cli.main(args(corpus, out, *COMPRESSED)) == 130
    assert [r["step"] for r in metrics(out) if "loss" in r] == [1, 2, 3, 4]
    assert cli.main(["--out", str(out), "--resume", "--dump-hlo"]) == 0
    assert records(out) == records(compressed)
    assert final_checksum(out, 6) == final_checksum(compressed, 6)
    hlo = (out / "train_step.hlo.txt").read_text()  # --dump-hlo: the compressed step
    assert "all-to-all" in hlo and "all-gather" in hlo


@pytest.mark.slow
def test_a_frozen_variance_run_resumes_exactly(corpus, tmp_path, monkeypatch):
    """Two dense steps, then compressed ones with Adam's second moment frozen: stopped after step 4 and resumed, the
    uninterrupted run's metrics and final state, bit for bit."""
    from jaxformer import loop
    frozen = [*COMPRESSED, "--compression-freeze-variance-after", "2"]
    whole, out = tmp_path / "whole", tmp_path / "run"
    assert cli.main(args(corpus, whole, *frozen)) == 0
    with monkeypatch.context() as m:
        m.setattr(loop, "_stop_agreed", lambda requested, s, tc: s == 4)
        assert cli.main(args(corpus, out, *frozen)) == 130
    assert cli.main(["--out", str(out), "--resume"]) == 0
    assert records(out) == records(whole)
    assert final_checksum(out, 6) == final_checksum(whole, 6)
    steps = [r for r in metrics(whole) if "loss" in r]
    assert [r["compression_selected"] > 0 for r in steps] == [False, False, True, True, True, True]


def test_resume_refuses_what_the_compressed_state_cannot_follow(corpus, compressed, tmp_path, capsys):
    resume = ["--out", str(compressed), "--resume", "--steps", "8"]
    for flags, needle in [
        (["--grad-compression", "none"], "grad_compression: the run has 'topk-balanced', given 'none'"),
        (["--compression-min-size", "2048"], "compression_min_size: the run has 1024, given 2048"),
        (["--mesh", "data=8"], "mesh: the run has 'data=2,fsdp=4,tensor=1,pipeline=1', given 'data=8'"),
    ]:
        expect_error(capsys, resume + flags, "these settings define the run", needle)
    # A dense run cannot turn compression on.
    dense = tmp_path / "dense"
    shutil.copytree(compressed, dense)
    record = json.loads((dense / "run.json").read_text())
    record["train_config"]["grad_compression"] = "none"
    (dense / "run.json").write_text(json.dumps(record))
    expect_error(capsys, ["--out", str(dense), "--resume", "--steps", "8", "--grad-compression", "topk-balanced"],
                 "grad_compression: the run has 'none', given 'topk-balanced'")

    # The exchange, density, selection and warm-up may change: the state keeps its shapes.
    record = run.read_record(compressed)
    given = dict(out=str(compressed), grad_compression="topk-allgather", density=0.05,
                 compression_selection="reused", compression_warmup_steps=4)
    tc = run.resumed_config(given)
    run.check_resume(tc, record, compressed, lambda *a: None, MeshConfig.parse(MESH))
    # Without compression the mesh may change (the checkpoint is resharded), and run.json follows it.
    dense_tc = dataclasses.replace(tc, grad_compression="none")
    dense_record = dict(record, train_config=dict(record["train_config"], grad_compression="none"))
    run.check_resume(dense_tc, dense_record, compressed, lambda *a: None, MeshConfig.parse("data=8"))
    assert run.resumed_record(dense_record, dense_tc, [[0, 6]], MeshConfig.parse("data=8"))["mesh"] == \
        "data=8,fsdp=1,tensor=1,pipeline=1"


def test_train_config_builds_the_compression_config():
    assert TrainConfig().compression_config() is None
    cfg = TrainConfig(grad_compression="topk-allgather", density=0.001, compression_selection="sampled",
                      compression_warmup_steps=10, compression_min_size=4096, seed=3).compression_config()
    assert (cfg.exchange, cfg.density, cfg.selection, cfg.warmup_steps, cfg.min_size, cfg.seed) == \
        ("allgather", 0.001, "sampled", 10, 4096, 3)
    assert TrainConfig(grad_compression="topk-balanced").compression_config().exchange == "balanced"
    # A frozen second moment moves --clip-norm before the exchange (local clipping); adaptive, it clips the sum.
    assert TrainConfig(grad_compression="topk-balanced").compression_config().clip_norm is None
    frozen = TrainConfig(grad_compression="topk-balanced", compression_freeze_variance_after=5, clip_norm=2.0)
    assert (frozen.compression_config().freeze_variance_after, frozen.compression_config().clip_norm) == (5, 2.0)
    assert dataclasses.replace(frozen, clip_norm=0.0).compression_config().clip_norm is None


@pytest.mark.slow
def test_hlo_report_counts_the_compressed_exchange(capsys):
    """The step on data=2 with --grad-compression: no all-reduce of gradients, an all-to-all and an all-gather."""
    from jaxformer import hlo_report
    argv = ["--config", "tiny", "--seq-len", "16", "--mesh", "data=2", "--json", "--grad-compression",
            "topk-balanced", "--density", "0.01", "--compression-min-size", "1024"]
    assert hlo_report.main(argv) == 0
    rep = json.loads(capsys.readouterr().out)
    assert rep["grad_compression"] == "topk-balanced"
    coll = rep["collectives"]
    assert coll["all-to-all"]["count"] >= 1 and coll["all-gather"]["count"] >= 1
    assert coll["all-reduce"]["bytes"] < 256  # the loss sums and the exchange's counts only
    assert hlo_report.main(["--config", "tiny", "--grad-compression", "topk-balanced"]) == 2
    assert "give --mesh with data > 1" in capsys.readouterr().err


def test_convergence_table_compares_each_run_with_the_first(tmp_path):
    from benchmarks.grad_compression import _run_metrics, convergence_table

    def run(name, tc, losses, eval_loss, eval_acc):
        out = tmp_path / name
        out.mkdir()
        (out / "run.json").write_text(json.dumps({"train_config": tc}))
        lines = [{"step": i + 1, "loss": x} for i, x in enumerate(losses)]
        lines.append({"step": len(losses), "eval_mlm_loss": eval_loss, "eval_mlm_acc": eval_acc})
        (out / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in lines))
        return str(out)

    dense = run("dense", {"grad_compression": "none"}, [9.0, 5.0, 4.0], 4.0, 0.5)
    sparse = run("sparse", {"grad_compression": "topk-balanced", "density": 0.01, "compression_warmup_steps": 10,
                            "optimizer": "lamb"}, [9.0, 6.0, 5.0], 5.0, 0.25)
    runs = [_run_metrics(dense), _run_metrics(sparse)]
    assert [r["label"] for r in runs] == ["dense", "lamb: topk-balanced 0.01, warm-up 10"]
    rows = convergence_table(runs, last=2).splitlines()[2:]
    assert rows[0].split("|")[3:9] == [" 4.5000 ", " +0.00% ", " 4.0000 ", " +0.00% ", " 0.5000 ", " +0.00% "]
    assert rows[1].split("|")[3:9] == [" 5.5000 ", " +22.22% ", " 5.0000 ", " +25.00% ", " 0.2500 ", " -50.00% "]
