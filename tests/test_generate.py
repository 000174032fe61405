"""Generation: the KV cache yields exactly the tokens of full recomputation; sampling filters."""

import pytest
import torch

from gptcourse import GPT, GPTConfig, decode_layout, filter_logits, generate, kv_cache_bytes, preset

CONFIGS = [preset("seed-tiny").replace(context_length=24), GPTConfig(context_length=24),
           preset("seed-tiny").replace(context_length=24, n_kv_heads=2), GPTConfig(context_length=24, n_kv_heads=1)]


@pytest.mark.parametrize("config", CONFIGS, ids=["rope", "learned", "rope-gqa", "learned-mqa"])
@pytest.mark.parametrize("sampling", [
    {"temperature": 0.0}, {"temperature": 1.0}, {"temperature": 0.8, "top_k": 5}, {"temperature": 1.2, "top_p": 0.9},
])
def test_cache_equals_recompute(config, sampling):
    torch.manual_seed(0)
    model = GPT(config)
    prompt = torch.randint(0, config.vocab_size, (3, 4))
    # 30 new tokens run past context_length=24: both ways must then slide the window.
    runs = [generate(model, prompt, 30, use_cache=c, generator=torch.Generator().manual_seed(7), **sampling)
            for c in (True, False)]
    assert runs[0].shape == (3, 34)
    assert torch.equal(runs[0], runs[1])
    assert torch.equal(runs[0][:, :4], prompt)


def test_cached_logits_equal_full_forward():
    torch.manual_seed(0)
    model = GPT(preset("seed-tiny")).eval()
    idx = torch.randint(0, 100, (2, 9))
    cache = model.new_cache()
    stepwise = torch.cat([model(idx[:, :5], cache=cache), model(idx[:, 5:7], cache=cache),
                          model(idx[:, 7:], cache=cache)], dim=1)
    assert (stepwise - model(idx)).abs().max() < 1e-5


def test_greedy_is_argmax_of_full_forward():
    torch.manual_seed(0)
    model = GPT(GPTConfig()).eval()
    prompt = torch.randint(0, 100, (1, 3))
    out = generate(model, prompt, 5, temperature=0)
    for t in range(3, 8):
        assert out[0, t] == model(out[:, :t])[0, -1].argmax()


def test_top_k_one_and_tiny_top_p_are_greedy():
    torch.manual_seed(0)
    model = GPT(GPTConfig())
    prompt = torch.randint(0, 100, (2, 3))
    greedy = generate(model, prompt, 8, temperature=0)
    assert torch.equal(generate(model, prompt, 8, top_k=1), greedy)
    assert torch.equal(generate(model, prompt, 8, top_p=1e-6), greedy)


def test_filter_logits_by_hand():
    logits = torch.tensor([[1.0, 3.0, 2.0, 0.0]])
    assert torch.isinf(filter_logits(logits, top_k=2)).tolist() == [[True, False, False, True]]
    probs = logits.softmax(-1)[0]  # about 0.09, 0.67, 0.24, 0.03
    assert probs[1] < 0.7 < probs[1] + probs[2]
    assert torch.isinf(filter_logits(logits, top_p=0.7)).tolist() == [[True, False, False, True]]


def _hf_warpers(top_k, top_p):
    lp = pytest.importorskip("transformers.generation.logits_process")
    warpers = ([lp.TopKLogitsWarper(top_k)] if top_k else []) + ([lp.TopPLogitsWarper(top_p)] if top_p else [])
    return lp.LogitsProcessorList(warpers)  # the order of transformers' generate: top-k, then top-p


@pytest.mark.parametrize(("top_k", "top_p"), [(None, 0.9), (None, 0.5), (None, 1.0), (None, 1e-6), (5, 0.8),
                                              (20, 0.95), (3, None)])
def test_filter_logits_equals_hugging_face_warpers(top_k, top_p):
    gen = torch.Generator().manual_seed(0)
    skewed = torch.randn(64, 50, generator=gen) * 3.0
    flat = torch.randn(64, 50, generator=gen) * 0.1
    ties = torch.randint(0, 4, (64, 50), generator=gen).float()  # many equal logits at the boundary
    for logits in (skewed, flat, ties):
        expected = _hf_warpers(top_k, top_p)(torch.zeros(64, 1, dtype=torch.long), logits.clone())
        assert torch.equal(filter_logits(logits, top_k=top_k, top_p=top_p), expected)


def test_top_p_of_logits_in_the_hundreds_is_that_of_the_same_logits_shifted_down():
    """exp() overflows float32 past 88: the softmax inside top-p must subtract each row's largest logit."""
    gen = torch.Generator().manual_seed(0)
    logits = torch.stack([torch.randperm(16, generator=gen) * 0.5 for _ in range(4)])  # distinct, exact when shifted
    kept = filter_logits(logits, top_p=0.8).isfinite()
    assert 0 < kept.sum() < kept.numel()
    shifted = logits + torch.tensor([[100.0], [300.0], [600.0], [900.0]])
    assert torch.equal(filter_logits(shifted, top_p=0.8).isfinite(), kept)


def test_top_p_keeps_the_smallest_set_that_reaches_p():
    probs = torch.tensor([[0.5, 0.3, 0.15, 0.05]])
    kept = lambda p: filter_logits(probs.log(), top_p=p).isfinite()[0].tolist()  # noqa: E731
    assert kept(0.5) == [True, False, False, False]  # 0.5 alone reaches 0.5
    assert kept(0.6) == [True, True, False, False]  # 0.5 < 0.6 <= 0.8
    assert kept(0.81) == [True, True, True, False]
    assert kept(1.0) == [True, True, True, True]


def test_kv_cache_stores_the_kv_heads_and_its_bytes_follow_the_formula():
    config = preset("seed-tiny").replace(context_length=24, n_kv_heads=2)
    model = GPT(config).eval()
    cache = model.new_cache()
    with torch.no_grad():
        model(torch.zeros(3, 5, dtype=torch.long), cache=cache)
    assert cache.layers[0].k.shape == (3, 2, 5, 8)  # (B, H_kv, T, D)
    assert cache.nbytes == kv_cache_bytes(config, 24, batch=3) == 2 * 2 * 24 * 2 * 8 * 4 * 3
    assert kv_cache_bytes(config.replace(n_kv_heads=None), 24, batch=3) == 2 * cache.nbytes  # H / H_kv = 2
    llama3 = preset("llama3-8b")
    assert kv_cache_bytes(llama3, 8192, dtype=torch.bfloat16) == 2 * 32 * 8192 * 8 * 128 * 2  # 1 GiB
    with pytest.raises(ValueError, match="expected positions >= 0 and batch >= 1"):
        kv_cache_bytes(config, -1)


@pytest.mark.parametrize(("kwargs", "message"), [
    ({"temperature": -1.0}, "temperature must be >= 0"),
    ({"top_k": 0}, "top_k must be >= 1"),
    ({"top_p": 1.5}, r"top_p must be in \(0, 1\]"),
])
def test_bad_sampling_arguments(kwargs, message):
    model = GPT(GPTConfig())
    with pytest.raises(ValueError, match=message):
        generate(model, torch.zeros(1, 2, dtype=torch.long), 1, **kwargs)


def test_kv_cache_refuses_more_positions_than_it_holds():
    from gptcourse import LayerCache

    cache = LayerCache(capacity=4)
    k = torch.randn(1, 2, 3, 8)
    keys, _ = cache.append(k, k)
    assert torch.equal(keys, k) and cache.length == 3
    with pytest.raises(ValueError, match="holds 4 positions; 5 would not fit"):
        cache.append(k[:, :, :2], k[:, :, :2])


def test_generated_tokens_can_feed_a_training_step():
    # generate runs under inference_mode; what it returns must still be an ordinary tensor, usable by autograd.
    torch.manual_seed(0)
    model = GPT(GPTConfig(context_length=24)).train()
    out = generate(model, torch.zeros(2, 1, dtype=torch.long), 6)
    assert not out.is_inference()
    assert model.training  # restored after generating in eval mode
    loss = torch.nn.functional.cross_entropy(model(out[:, :-1]).flatten(0, 1), out[:, 1:].flatten())
    loss.backward()
    assert model.tok_emb.weight.grad is not None


def test_decode_layout_makes_widening_weights_column_major_and_restores_them():
    torch.manual_seed(0)
    model = GPT(GPTConfig(context_length=24, vocab_size=300))  # V > C: the tied head is widening too
    before = {name: (p.data_ptr(), p.detach().clone()) for name, p in model.named_parameters()}
    x = torch.randn(1, 1, model.config.d_model)
    block = model.blocks[0]

    def through_every_kind_of_linear() -> torch.Tensor:  # widening (qkv, fc_in), square (out), narrowing (fc_out)
        return block.mlp(block.attn.out(block.attn.qkv(x)[..., : model.config.d_model]))

    expected = through_every_kind_of_linear()
    with decode_layout(model):
        for m in model.modules():
            if isinstance(m, torch.nn.Linear):
                out_f, in_f = m.weight.shape
                widening = out_f >= in_f
                assert m.weight.stride() == ((1, out_f) if widening else (in_f, 1)), m
        assert model.lm_head.weight is model.tok_emb.weight  # still tied
        for name, p in model.named_parameters():
            assert torch.equal(p, before[name][1]), name  # values unchanged, only the memory order
        torch.testing.assert_close(through_every_kind_of_linear(), expected, rtol=1e-5, atol=1e-6)
    for name, p in model.named_parameters():
        assert p.data_ptr() == before[name][0] and p.is_contiguous(), name  # the original storage is back
    with pytest.raises(RuntimeError, match="boom"), decode_layout(model):
        raise RuntimeError("boom")
    assert all(p.data_ptr() == before[name][0] for name, p in model.named_parameters())
