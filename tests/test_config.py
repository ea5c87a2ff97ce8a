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
    cfg = BertConfig.preset("tiny", vocab_size=1000, dtype=jnp.float32, remat=True)
    assert cfg.vocab_size == 1000 and cfg.dtype == "float32" and cfg.compute_dtype == jnp.float32
    assert cfg.remat == "full"
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
    # auto: cuBLAS only on one device (no mesh, or a mesh of one), XLA's choice on a mesh of several devices
    assert options("auto") == cublas and options("auto", one) == cublas
    assert options("auto", several) is None
