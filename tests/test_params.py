"""Closed-form parameter counts against numel, published counts and Hugging Face's own models."""

import random

import pytest
import torch

from gptcourse import GPT, GPTConfig, count_parameters, parameter_breakdown, preset


def numel(config: GPTConfig) -> int:
    with torch.device("meta"):
        model = GPT(config)
    return sum(p.numel() for p in model.parameters())  # shared (tied) tensors are yielded once


@pytest.mark.parametrize(
    ("name", "published"),
    [
        ("seed-tiny", 24_096),  # the assembly seed's worked example
        ("seed-tiny-untied", 27_296),
        ("gpt2-small", 124_439_808),  # GPT2LMHeadModel("gpt2"), tied
        ("llama2-7b", 6_738_415_616),  # Llama-2-7b-hf
        ("llama3-8b", 8_030_261_248),  # Meta-Llama-3-8B: grouped-query attention, 8 kv heads
        ("mistral-7b", 7_241_732_096),  # Mistral-7B-v0.1 / v0.2
    ],
)
def test_published_counts(name, published):
    assert count_parameters(preset(name)) == published
    assert numel(preset(name)) == published


def test_seed_formula_tied_and_untied():
    v, d, n = 100, 32, 2
    assert count_parameters(preset("seed-tiny")) == v * d + n * (10 * d * d + 6 * d) + d
    assert count_parameters(preset("seed-tiny-untied")) == 2 * v * d + n * (10 * d * d + 6 * d) + d


def test_matches_hf_models_built_on_meta():
    transformers = pytest.importorskip("transformers")
    with torch.device("meta"):
        gpt2 = transformers.GPT2LMHeadModel(transformers.GPT2Config())
        llama = transformers.LlamaForCausalLM(transformers.LlamaConfig(
            vocab_size=32000, hidden_size=4096, intermediate_size=11008, num_hidden_layers=32,
            num_attention_heads=32, num_key_value_heads=32, max_position_embeddings=4096))
        llama3 = transformers.LlamaForCausalLM(transformers.LlamaConfig(
            vocab_size=128256, hidden_size=4096, intermediate_size=14336, num_hidden_layers=32,
            num_attention_heads=32, num_key_value_heads=8, max_position_embeddings=8192, rope_theta=500000.0,
            rms_norm_eps=1e-5))
        mistral = transformers.MistralForCausalLM(transformers.MistralConfig(  # its defaults are Mistral 7B's
            vocab_size=32000, max_position_embeddings=32768, sliding_window=None, rms_norm_eps=1e-5,
            rope_theta=1e6))
    assert count_parameters(preset("gpt2-small")) == sum(p.numel() for p in gpt2.parameters())
    assert count_parameters(preset("llama2-7b")) == sum(p.numel() for p in llama.parameters())
    assert count_parameters(preset("llama3-8b")) == sum(p.numel() for p in llama3.parameters())
    assert count_parameters(preset("mistral-7b")) == sum(p.numel() for p in mistral.parameters())
    from gptcourse.model.hf import config_from_hf  # what from_hf builds, without building 8B parameters

    assert config_from_hf(llama3.config, "llama") == preset("llama3-8b")
    assert config_from_hf(mistral.config, "mistral") == preset("mistral-7b")


def test_random_configs_match_numel():
    rng = random.Random(0)
    for _ in range(150):
        heads = rng.choice([1, 2, 4])
        config = GPTConfig(
            n_kv_heads=rng.choice([None] + [g for g in (1, 2, 4) if heads % g == 0]),
            vocab_size=rng.randint(2, 300), context_length=rng.randint(1, 64), d_model=heads * rng.choice([2, 4, 6]),
            n_heads=heads, n_layers=rng.randint(1, 3), position=rng.choice(["learned", "rope", "none"]),
            norm=rng.choice(["layernorm", "rmsnorm"]), norm_bias=rng.random() < 0.5,
            mlp=rng.choice(["relu", "gelu", "gelu_tanh", "swiglu"]), d_ff=rng.choice([None, rng.randint(1, 50)]),
            attn_bias=rng.random() < 0.5, mlp_bias=rng.random() < 0.5, tie_weights=rng.random() < 0.5,
            lm_head_bias=rng.random() < 0.5,
        )
        assert count_parameters(config) == numel(config), config


def test_grouped_query_attention_shrinks_only_k_and_v():
    mha, gqa = preset("llama3-8b").replace(n_kv_heads=None), preset("llama3-8b")
    c, kv = 4096, 8 * 128  # d_model and H_kv D
    diff = {k: parameter_breakdown(mha)[k] - parameter_breakdown(gqa)[k] for k in parameter_breakdown(mha)}
    assert diff == {k: 0 for k in diff} | {"attention": 32 * 2 * c * (c - kv)}  # k and v: C x C -> C x H_kv D
    mqa = gqa.replace(n_kv_heads=1, attn_bias=True)
    assert parameter_breakdown(mqa)["attention"] == 32 * (2 * c * c + 2 * c * 128 + 2 * c + 2 * 128)


def test_breakdown_locates_the_untied_difference():
    tied, untied = parameter_breakdown(preset("seed-tiny")), parameter_breakdown(preset("seed-tiny-untied"))
    diff = {k: untied[k] - tied[k] for k in tied if untied[k] != tied[k]}
    assert diff == {"output_projection": 100 * 32}


def test_breakdown_by_module_names():
    config = preset("seed-repo")
    with torch.device("meta"):
        model = GPT(config)
    by_name = {"attention": 0, "mlp": 0}
    for name, p in model.named_parameters():
        for part in by_name:
            if f".{'attn' if part == 'attention' else 'mlp'}." in name:
                by_name[part] += p.numel()
    breakdown = parameter_breakdown(config)
    assert by_name == {"attention": breakdown["attention"], "mlp": breakdown["mlp"]}
    assert breakdown["position_embedding"] == model.pos_emb.weight.numel()
