"""Logits equal to Hugging Face GPT-2, Llama and Mistral (grouped-query attention too), with weights copied both
ways. Built offline from configs."""

import pytest
import torch

import gptcourse
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


def tiny_mistral(**overrides) -> torch.nn.Module:
    settings = dict(vocab_size=61, max_position_embeddings=32, hidden_size=48, intermediate_size=80,
                    num_attention_heads=6, num_key_value_heads=2, num_hidden_layers=3, sliding_window=None,
                    bos_token_id=0, eos_token_id=0, pad_token_id=0)
    config = transformers.MistralConfig(**(settings | overrides))
    return transformers.MistralForCausalLM(config).eval()


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
    (tiny_llama, {"num_key_value_heads": 2}),  # grouped-query attention: 2 query heads per kv head
    (tiny_llama, {"num_key_value_heads": 1, "attention_bias": True}),  # multi-query attention
    (tiny_mistral, {}),
    (tiny_mistral, {"num_key_value_heads": 1, "tie_word_embeddings": True}),
    (tiny_mistral, {"sliding_window": 32}),  # a window as long as the context changes nothing
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
        back = ours.to_hf(family="mistral" if factory is tiny_mistral else None)
        assert type(back) is type(hf)
        assert (back(idx).logits - expected).abs().max() <= 1e-5
    assert ours.config.kv_heads == getattr(hf.config, "num_key_value_heads", ours.config.n_heads)


def test_gqa_cache_holds_only_the_kv_heads_and_generates_like_hf():
    hf = tiny_llama(num_key_value_heads=2)
    randomise(hf)
    ours = GPT.from_hf(hf).eval()
    cache = ours.new_cache()
    idx = torch.randint(0, 61, (2, 5), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        ours(idx, cache=cache)
    assert cache.layers[0].k.shape == (2, 2, 5, 12)  # (B, H_kv, T, D): 2 kv heads, not 4
    expected = hf.generate(idx, max_new_tokens=8, do_sample=False, pad_token_id=0)
    assert torch.equal(gptcourse.generate(ours, idx, 8, temperature=0), expected)


def test_from_our_random_weights_to_hf():
    torch.manual_seed(0)
    ours = GPT(GPTConfig(vocab_size=61, context_length=32, d_model=48, n_heads=4, n_layers=2, mlp="gelu_tanh")).eval()
    idx = torch.randint(0, 61, (2, 12))
    with torch.no_grad():
        assert (ours.to_hf()(idx).logits - ours(idx)).abs().max() <= 1e-5


def test_mismatched_models_are_refused():
    with pytest.raises(TypeError, match="expected a transformers GPT2LMHeadModel, LlamaForCausalLM, "
                                        "MistralForCausalLM or MixtralForCausalLM, got GPT2Model"):
        GPT.from_hf(tiny_gpt2().transformer)
    with pytest.raises(ValueError, match="sliding-window attention is not supported: sliding_window=8"):
        GPT.from_hf(tiny_mistral(sliding_window=8))
    with pytest.raises(ValueError, match="no Hugging Face equivalent"):
        GPT(GPTConfig(position="rope", norm="layernorm")).to_hf()
    with pytest.raises(ValueError, match="GPT-2 has no grouped-query attention: n_kv_heads=2"):
        GPT(GPTConfig(n_kv_heads=2)).to_hf()
    with pytest.raises(ValueError, match="Mistral has no attention or MLP biases"):
        GPT(GPTConfig(position="rope", norm="rmsnorm", mlp="swiglu")).to_hf(family="mistral")
    with pytest.raises(ValueError, match=r"family must be None .* or .mistral., got .qwen."):
        GPT(GPTConfig()).to_hf(family="qwen")


def test_a_pretrained_byte_level_vocabulary_and_gpt2_weights_run_on_the_course_code():
    """GPT-2 end to end without a download: a byte-level BPE trained by `tokenizers` (GPT-2's pre-tokenizer and byte
    alphabet) read by BPETokenizer.from_hf, and a random GPT-2 of that vocabulary read by GPT.from_hf, give the
    ids and then the greedy continuation that `tokenizers` and `transformers` give."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    hf_tok = Tokenizer(models.BPE())
    hf_tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    hf_tok.decoder = decoders.ByteLevel()
    text = gptcourse.load_text()[:50_000]
    hf_tok.train_from_iterator([text], trainers.BpeTrainer(
        vocab_size=400, special_tokens=["<|endoftext|>"], initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False))
    tok = gptcourse.BPETokenizer.from_hf(hf_tok)
    prompt = "<|endoftext|>def parse(self, naïve=None):\n    return"
    ids = tok.encode(prompt, allowed_special="all")
    assert ids == hf_tok.encode(prompt).ids and ids[0] == 0  # the trainer's layout: the special token is id 0
    hf = tiny_gpt2(vocab_size=hf_tok.get_vocab_size(), n_positions=64)
    randomise(hf)
    idx = torch.tensor([ids])
    with torch.no_grad():
        expected = hf.generate(idx, max_new_tokens=8, do_sample=False, pad_token_id=0)
        got = gptcourse.generate(GPT.from_hf(hf).eval(), idx, 8, temperature=0)
    assert torch.equal(got, expected)
    assert tok.decode(got[0].tolist()) == hf_tok.decode(expected[0].tolist(), skip_special_tokens=False)
