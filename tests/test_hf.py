"""Logits equal to Hugging Face GPT-2 and Llama, with weights copied both ways. Built offline from configs."""

import pytest
import torch

from gptcourse import GPT, GPTConfig

transformers = pytest.importorskip("transformers")


def tiny_gpt2(**overrides) -> torch.nn.Module:
    settings = dict(vocab_size=61, n_positions=32, n_embd=48, n_head=4, n_layer=3, bos_token_id=0, eos_token_id=0)
    config = transformers.GPT2Config(**(settings | overrides))
    return transformers.GPT2LMHeadModel(config).eval()


def tiny_llama(**overrides) -> torch.nn.Module:
    settings = dict(vocab_size=61, max_position_embeddings=32, hidden_size=48, intermediate_size=80,
                    num_attention_heads=4, num_key_value_heads=4, num_hidden_layers=3,
                    bos_token_id=0, eos_token_id=0, pad_token_id=0)
    config = transformers.LlamaConfig(**(settings | overrides))
    return transformers.LlamaForCausalLM(config).eval()


def randomise(model: torch.nn.Module) -> None:
    """HF initialises biases and norms to constants; random values make the comparison meaningful."""
    torch.manual_seed(1)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(torch.randn_like(p) * 0.05)


@pytest.mark.parametrize("factory,overrides", [
    (tiny_gpt2, {}),
    (tiny_gpt2, {"activation_function": "relu"}),
    (tiny_llama, {}),
    (tiny_llama, {"attention_bias": True, "tie_word_embeddings": True}),
])
def test_logits_equal_both_ways(factory, overrides):
    torch.manual_seed(0)
    hf = factory(**overrides)
    randomise(hf)
    idx = torch.randint(0, 61, (2, 20))
    with torch.no_grad():
        expected = hf(idx).logits
        ours = GPT.from_hf(hf).eval()
        assert (ours(idx) - expected).abs().max() <= 1e-5
        back = ours.to_hf()
        assert (back(idx).logits - expected).abs().max() <= 1e-5


def test_from_our_random_weights_to_hf():
    torch.manual_seed(0)
    ours = GPT(GPTConfig(vocab_size=61, context_length=32, d_model=48, n_heads=4, n_layers=2, mlp="gelu_tanh")).eval()
    idx = torch.randint(0, 61, (2, 12))
    with torch.no_grad():
        assert (ours.to_hf()(idx).logits - ours(idx)).abs().max() <= 1e-5


def test_mismatched_models_are_refused():
    with pytest.raises(TypeError, match="expected a transformers GPT2LMHeadModel or LlamaForCausalLM, got GPT2Model"):
        GPT.from_hf(tiny_gpt2().transformer)
    with pytest.raises(ValueError, match="grouped-query attention is not supported: num_key_value_heads=2"):
        GPT.from_hf(tiny_llama(num_key_value_heads=2))
    with pytest.raises(ValueError, match="no Hugging Face equivalent"):
        GPT(GPTConfig(position="rope", norm="layernorm")).to_hf()
