"""GPTConfig presets and validation."""

import pytest

from gptcourse import PRESETS, GPTConfig, preset


def test_presets_are_frozen_configs():
    for name, config in PRESETS.items():
        assert isinstance(config, GPTConfig), name
        with pytest.raises(AttributeError):
            config.d_model = 1  # frozen


def test_unknown_preset_names_the_choices():
    with pytest.raises(ValueError, match=r"unknown preset 'gpt5'.*seed-tiny"):
        preset("gpt5")


def test_heads_must_divide_width():
    with pytest.raises(ValueError, match="d_model=30 is not divisible by n_heads=4"):
        GPTConfig(d_model=30, n_heads=4)


@pytest.mark.parametrize(
    ("field", "value", "message"),
    [
        ("vocab_size", 0, "vocab_size must be a positive int, got 0"),
        ("n_layers", 2.0, "n_layers must be a positive int, got 2.0"),
        ("norm", "batchnorm", "norm must be one of"),
        ("mlp", "tanh", "mlp must be one of"),
        ("position", "alibi", "position must be one of"),
        ("d_ff", -1, "d_ff must be a positive int or None"),
        ("norm_eps", 0.0, "norm_eps must be > 0"),
        ("n_kv_heads", 3, r"n_kv_heads must be None \(= n_heads\) or a positive int that divides n_heads=4, got 3"),
        ("n_kv_heads", 0, "n_kv_heads must be None"),
        ("n_kv_heads", True, "n_kv_heads must be None"),
    ],
)
def test_bad_fields_are_named(field, value, message):
    with pytest.raises(ValueError, match=message):
        GPTConfig(**{field: value})


def test_rope_needs_even_head_width():
    with pytest.raises(ValueError, match="d_head must be even, got 3"):
        GPTConfig(d_model=12, n_heads=4, position="rope")


def test_hidden_width_defaults():
    assert GPTConfig(d_model=32, mlp="relu").hidden_width == 128
    assert GPTConfig(d_model=32, mlp="swiglu").hidden_width == 64
    assert GPTConfig(d_model=32, mlp="swiglu", d_ff=80).hidden_width == 80


def test_kv_heads_default_to_the_query_heads_and_follow_replace():
    assert GPTConfig(n_heads=4).kv_heads == 4
    assert GPTConfig(n_heads=4, n_kv_heads=1).kv_heads == 1  # multi-query
    assert GPTConfig(n_heads=4).replace(n_heads=8).kv_heads == 8  # None means "as many as n_heads", always
    assert preset("llama3-8b").kv_heads == 8 and preset("llama3-8b").n_heads == 32
