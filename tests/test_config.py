import dataclasses
import subprocess
import sys
from pathlib import Path

import jax
import jax.numpy as jnp
import pytest

from jaxformer import BertConfig


@pytest.mark.parametrize("name,layers,hidden,heads,ff", [
    ("tiny", 2, 128, 2, 512), ("mini", 4, 256, 4, 1024), ("base", 12, 768, 12, 3072), ("large", 24, 1024, 16, 4096)])
def test_presets(name, layers, hidden, heads, ff):
    cfg = BertConfig.preset(name)
    assert (cfg.num_hidden_layers, cfg.hidden_size, cfg.num_attention_heads, cfg.intermediate_size) == \
        (layers, hidden, heads, ff)
    assert cfg.vocab_size == 30522 and cfg.head_dim == hidden // heads
    assert cfg.dtype == "bfloat16" and cfg.param_dtype == "float32" and cfg.kernels == "auto"


def test_overrides_and_dtype_normalisation():
    cfg = BertConfig.preset("tiny", vocab_size=1000, dtype=jnp.float32, remat="full")
    assert cfg.vocab_size == 1000 and cfg.dtype == "float32" and cfg.compute_dtype == jnp.float32
    assert BertConfig.from_dict(cfg.to_dict()) == cfg


@pytest.mark.parametrize("kwargs,needle", [
    (dict(hidden_size=100, num_attention_heads=3), "num_attention_heads=3"),
    (dict(hidden_size=0), "hidden_size=0"),
    (dict(num_hidden_layers=-1), "num_hidden_layers=-1"),
    (dict(vocab_size=2.5), "vocab_size=2.5"),
    (dict(hidden_dropout_prob=1.0), "hidden_dropout_prob=1.0"),
    (dict(attention_probs_dropout_prob=-0.1), "attention_probs_dropout_prob=-0.1"),
    (dict(dtype="int32"), "dtype='int32'"),
    (dict(dtype="bfloat17"), "dtype='bfloat17'"),
    (dict(param_dtype="float8"), "param_dtype='float8'"),
    (dict(kernels="cuda"), "kernels='cuda'"),
    (dict(remat="some"), "remat='some'"),
    (dict(scan_layers="yes"), "scan_layers='yes'"),
    (dict(scan_layers=None), "scan_layers=None"),
    (dict(remat=True), "remat=True"),
    (dict(layer_norm_eps=0.0), "layer_norm_eps=0.0"),
])
def test_invalid_values_name_field_and_value(kwargs, needle):
    with pytest.raises(ValueError) as e:
        BertConfig(**kwargs)
    assert needle in str(e.value)


def test_unknown_preset_and_field():
    with pytest.raises(ValueError, match="name='huge'"):
        BertConfig.preset("huge")
    with pytest.raises(ValueError, match="hidden_sise"):
        BertConfig.preset("tiny", hidden_sise=3)


def test_train_config_xla_opt_level_names_field_and_value():
    from jaxformer.config import TrainConfig
    assert TrainConfig(xla_opt_level="O3").xla_opt_level == "O3"
    with pytest.raises(ValueError, match="xla_opt_level='O4'"):
        TrainConfig(xla_opt_level="O4")


def test_train_config_xla_gemm_and_its_compiler_options(monkeypatch):
    from jaxformer import steps as steps_mod
    from jaxformer.config import TrainConfig
    with pytest.raises(ValueError, match="xla_gemm='triton'"):
        TrainConfig(xla_gemm="triton")

    class Fake:  # just what Steps.compiler_options reads
        def __init__(self, gemm, mesh):
            self.tc, self.mesh = TrainConfig(xla_gemm=gemm), mesh
    one, several = (jax.make_mesh((n,), ("data",), devices=jax.devices()[:n]) for n in (1, 2))
    options = lambda gemm, mesh=None: steps_mod.Steps.compiler_options(Fake(gemm, mesh))  # noqa: E731
    assert options("auto") is None and options("cublas") is None  # off the GPU nothing is set
    monkeypatch.setattr(steps_mod.jax, "default_backend", lambda: "gpu")
    cublas = {"xla_gpu_enable_triton_gemm": False}
    assert options("cublas") == cublas and options("cublas", several) == cublas
    assert options("xla") is None and options("xla", several) is None
    # auto: cuBLAS only, on one device (no mesh, or a mesh of one) and on a mesh of several devices
    assert options("auto") == cublas and options("auto", one) == cublas and options("auto", several) == cublas


# ----------------------------------------------------------------------------------------------- the command line
ROOT = Path(__file__).resolve().parents[1]


def test_defaults_of_the_command_line_are_train_configs():
    """No flags: exactly TrainConfig's defaults; every field has a flag in one of the groups."""
    import train
    from jaxformer.cli import GROUPS
    from jaxformer.config import TrainConfig
    assert TrainConfig(**vars(train.parse_args([]))) == TrainConfig()
    assert {f.metadata["group"] for f in dataclasses.fields(TrainConfig)} <= set(GROUPS)


def test_flags_parse_to_fields():
    import train
    from jaxformer.config import TrainConfig
    tc = TrainConfig(**vars(train.parse_args(
        ["--data", "a.txt", "b.jsonl", "--no-progress", "--scan-layers", "--profile-steps", "10:15", "--lr", "3e-4",
         "--kernels", "xla", "--vocab-size", "512", "--resume", "--mesh", "data=2,tensor=4"])))
    assert tc.data == ("a.txt", "b.jsonl") and tc.progress is False and tc.scan_layers is True
    assert tc.profile_steps == (10, 15) and tc.lr == 3e-4 and tc.kernels == "xla" and tc.vocab_size == 512
    assert tc.resume is True and tc.mesh == "data=2,tensor=4"
    assert train.parse_args(["--scan-layers", "--no-scan-layers"]).scan_layers is False


@pytest.mark.parametrize("argv,needle", [
    (["--profile-steps", "10"], "--profile-steps: '10': expected A:B"),
    (["--kernels", "cuda"], "--kernels: invalid choice: 'cuda'"),
    (["--seq-len", "many"], "--seq-len: invalid int value: 'many'"),
])
def test_bad_flag_text_is_a_usage_error(argv, needle, capsys):
    import train
    with pytest.raises(SystemExit) as e:
        train.parse_args(argv)
    assert e.value.code == 2 and needle in capsys.readouterr().err


def test_help_lists_the_groups():
    from jaxformer.cli import GROUPS
    out = subprocess.run([sys.executable, str(ROOT / "train.py"), "--help"], capture_output=True, text=True,
                         check=True).stdout
    positions = [out.index(f"\n{title}:\n") for title in GROUPS.values()]
    assert positions == sorted(positions)
    assert "--no-progress" in out and "--scan-layers, --no-scan-layers" in out and "(default: 128)" in out


def test_docs_cli_md_is_the_generated_table():
    """docs/cli.md holds the flags' tables as generated from TrainConfig: regenerate it with
    `python -m jaxformer.cli --write docs/cli.md` when a field changes."""
    from jaxformer import cli
    from jaxformer.config import TrainConfig
    table = cli.markdown(TrainConfig)
    assert cli.generated_part((ROOT / "docs" / "cli.md").read_text()) == table
    for f in dataclasses.fields(TrainConfig):
        assert f"`--{f.name.replace('_', '-')}`" in table or f.name == "progress"


@pytest.mark.parametrize("kwargs,needle", [
    (dict(steps=0), "steps=0"),
    (dict(seq_len=4), "seq_len=4"),
    (dict(lr=-1.0), "lr=-1.0"),
    (dict(weight_decay=-0.1), "weight_decay=-0.1"),
    (dict(clip_norm=-1.0), "clip_norm=-1.0"),
    (dict(dropout=1.0), "dropout=1.0"),
    (dict(schedule="cosine"), "schedule='cosine'"),
    (dict(optimizer="sgd"), "optimizer='sgd'"),
    (dict(profile_steps=(5, 5)), "profile_steps=5:5"),
    (dict(vocab_size=0), "vocab_size=0"),
    (dict(max_predictions=126, seq_len=128), "max_predictions=126"),
    (dict(mesh="data=2,model=2"), "'model'"),
    (dict(config="huge"), "name='huge'"),
    (dict(dtype="int8"), "dtype='int8'"),
    (dict(compile_cache=""), "compile_cache=''"),
])
def test_train_config_names_field_and_value(kwargs, needle):
    from jaxformer.config import TrainConfig
    with pytest.raises(ValueError) as e:
        TrainConfig(**kwargs)
    assert needle in str(e.value)
