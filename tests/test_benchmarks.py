"""benchmarks/train_step.py's flop rates (tflops, mfu, mfu_measured) and a smoke run of benchmarks/compare_pytorch.py,
on the CPU with the tiny preset."""

import importlib.util
import json
import math

import numpy as np
import pytest

from benchmarks import train_step

TINY = ["--config", "tiny", "--seq-len", "16", "--batch-size", "2"]


@pytest.mark.slow
def test_train_step_reports_the_model_flop_rate_and_the_compiled_step_agrees(tmp_path):
    r = train_step.main(TINY + ["--kernels", "xla", "--steps", "1", "--warmup", "0", "--repeats", "1",
                                "--gemm", "64,64,64", "--dump-hlo", str(tmp_path / "step.hlo")], quiet=True)
    assert r["flops_source"].startswith("model")
    assert r["model_tflop_per_step"] > 0
    assert r["tflops"] == pytest.approx(r["model_tflop_per_step"] / (r["ms_per_step"] / 1e3))
    # the analytic count is the compiled step's contractions (the XLA kernels: attention's matmuls are in the HLO)
    assert r["hlo_contraction_tflop_per_step"] == pytest.approx(r["model_tflop_per_step"], rel=1e-3)
    assert r["peak_tflops"] is None and r["mfu"] is None  # the CPU has no datasheet peak
    assert r["gemm_shape"] == [64, 64, 64] and r["gemm_tflops"] > 0
    assert r["mfu_measured"] == pytest.approx(r["tflops"] / r["gemm_tflops"])
    json.dumps(r)  # the printed line


def test_flop_rates_divide_by_the_peak_of_every_device():
    gemm = dict(m=8192, k=1024, n=4096, flop_per_s=700e12)
    r = train_step.flop_rates(494.5e12, 1.0, 2, "NVIDIA H200", gemm)
    assert r["peak_tflops"] == 989.0 and r["mfu"] == pytest.approx(0.25)
    assert r["mfu_measured"] == pytest.approx(494.5 / 1400) and r["gemm_shape"] == [8192, 1024, 4096]
    assert train_step.flop_rates(1e12, 1.0, 1, "NVIDIA H100 80GB HBM3", None)["mfu"] == pytest.approx(1 / 989)
    assert train_step.flop_rates(1e12, 1.0, 1, "NVIDIA H100 PCIe", None)["mfu"] is None  # another peak
    assert train_step.flop_rates(1e12, 1.0, 1, "cpu", None)["mfu_measured"] is None


def test_gemm_flag():
    assert train_step.parse_gemm("8192,1024,4096") == (8192, 1024, 4096)
    assert train_step.parse_gemm("none") is None
    for bad in ("8192,1024", "a,b,c", "0,1,1"):
        with pytest.raises(Exception, match="--gemm"):
            train_step.parse_gemm(bad)


@pytest.mark.skipif(not (importlib.util.find_spec("torch") and importlib.util.find_spec("transformers")),
                    reason="needs torch and transformers")
@pytest.mark.slow
def test_compare_pytorch_runs_both_sides_on_the_same_batches(tmp_path, capsys):
    from benchmarks import compare_pytorch as cp
    out = tmp_path / "compare.json"
    argv = TINY + ["--quick", "--modes", "eager,compile-masked,jaxformer", "--kernels", "xla",
                   "--compile-backend", "eager", "--json", str(out)]
    result = cp.main(argv)
    table = capsys.readouterr().out
    assert json.loads(out.read_text()) == json.loads(json.dumps(result))
    rows = {r["mode"]: r for r in result["rows"]}
    assert list(rows) == ["eager", "compile-masked", "jaxformer"]
    for mode, r in rows.items():
        assert f"| {mode} |" in table
        assert r["seq_per_s"] > 0 and r["ms_per_step"] > 0 and r["tflops"] > 0
        assert 5 < r["loss"] < 15 and math.isfinite(r["loss"]), r  # ~ ln(V) + ln(2) at random init
    assert rows["jaxformer"]["vs_jaxformer"] == 1.0
    assert rows["eager"]["attention"] == "sdpa" and rows["compile-masked"]["compile_backend"] == "eager"

    # Hugging Face's labels: jaxformer's masked labels at its masked positions, -100 elsewhere
    import torch
    from jaxformer.data import synthetic_batch
    a = cp.parse_args(TINY)
    b = cp.torch_batches(cp.model_config(a), a, torch.device("cpu"))[1]
    ref = synthetic_batch(30522, 2, 16, cp.masked_positions_count(16), seed=1)
    labels = b["labels"].numpy()
    for i in range(2):
        pos = ref["masked_positions"][i]
        assert set(np.flatnonzero(labels[i] != -100)) == set(pos)
        assert labels[i, pos[-1]] == ref["masked_labels"][i, -1]  # the last of a repeated position wins
    assert (b["input_ids"].numpy() == ref["input_ids"]).all()


def test_compare_pytorch_rejects_an_unknown_mode():
    from benchmarks import compare_pytorch as cp
    with pytest.raises(SystemExit):
        cp.parse_args(["--modes", "eager,jit"])
