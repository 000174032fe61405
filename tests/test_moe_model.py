"""A GPT whose blocks are mixtures of experts: its parameter counts, total and active per token, against the model's
own tensors and the published totals of Mixtral-8x7B and DeepSeek-V3 (built by transformers on the meta device,
nothing downloaded); and the capacity factor's dropped tokens against a slow count."""

import math

import pytest
import torch

from gptcourse import (
    GPT,
    GPTConfig,
    MoE,
    MoESpec,
    count_parameters,
    load_balancing_loss,
    parameter_breakdown,
    preset,
)

TINY = GPTConfig(vocab_size=50, context_length=16, d_model=24, n_heads=4, n_layers=3, position="rope",
                 norm="rmsnorm", mlp="swiglu", d_ff=40, attn_bias=False, mlp_bias=False, tie_weights=False,
                 moe=MoESpec(n_experts=5, top_k=2, d_ff=12, shared_d_ff=8, dense_layers=1))


@pytest.mark.parametrize("name", ["mixtral-8x7b", "deepseek-v3"])
def test_published_totals_equal_transformers_models_of_the_same_shape(name):
    transformers = pytest.importorskip("transformers")
    hf_config = {"mixtral-8x7b": transformers.MixtralConfig(),  # its defaults are Mixtral-8x7B's
                 "deepseek-v3": transformers.DeepseekV3Config()}[name]  # DeepSeek-V3's, without the MTP module
    model_class = {"mixtral-8x7b": transformers.MixtralForCausalLM,
                   "deepseek-v3": transformers.DeepseekV3ForCausalLM}[name]
    with torch.device("meta"):
        hf_total = sum(p.numel() for p in model_class(hf_config).parameters())
    assert count_parameters(preset(name)) == hf_total


def test_published_total_and_active_counts():
    # Mixtral-8x7B: 46.7B total, 12.9B active (Mistral AI's announcement); DeepSeek-V3: 671B total, 37B active
    mixtral, deepseek = preset("mixtral-8x7b"), preset("deepseek-v3")
    assert round(count_parameters(mixtral) / 1e9, 1) == 46.7
    assert round(count_parameters(mixtral, active=True) / 1e9, 1) == 12.9
    assert round(count_parameters(deepseek) / 1e9) == 671
    assert 37e9 <= count_parameters(deepseek, active=True) < 38e9  # "37B activated"


def test_total_count_equals_the_models_tensors_and_active_counts_k_experts():
    model = GPT(TINY)
    assert count_parameters(TINY) == sum(p.numel() for p in model.parameters())
    by_component = parameter_breakdown(TINY)
    assert by_component["mlp"] == sum(p.numel() for b in model.blocks for p in b.mlp.parameters())
    # active: everything but the experts, plus top_k of each sparse block's experts
    experts = [b.mlp.experts for b in model.blocks if isinstance(b.mlp, MoE)]
    assert len(experts) == 2  # the first of 3 blocks is dense
    one_expert = sum(p.numel() for p in experts[0][0].parameters())
    all_experts = sum(p.numel() for group in experts for p in group.parameters())
    active = sum(p.numel() for p in model.parameters()) - all_experts + len(experts) * 2 * one_expert
    assert count_parameters(TINY, active=True) == active
    dense = TINY.replace(moe=None)
    assert count_parameters(dense, active=True) == count_parameters(dense) == sum(
        p.numel() for p in GPT(dense).parameters())


def test_gpt_with_experts_runs_and_gives_each_sparse_blocks_router_logits():
    torch.manual_seed(0)
    model = GPT(TINY)
    idx = torch.randint(0, 50, (2, 7))
    logits = model(idx)
    assert logits.shape == (2, 7, 50)
    routers = model.router_logits()
    assert [tuple(r.shape) for r in routers] == [(14, 5), (14, 5)]
    loss = load_balancing_loss(routers, 5, 2)
    (logits.logsumexp(-1).mean() + loss).backward()
    assert model.blocks[1].mlp.router.weight.grad.abs().sum() > 0


def test_latent_attention_is_counted_not_built():
    with pytest.raises(ValueError, match="for count_parameters only"):
        GPT(preset("deepseek-v3"))


@pytest.mark.parametrize("factor", [0.5, 1.0, 1.25, 4.0])
def test_capacity_drops_the_tokens_past_each_experts_cap(factor):
    torch.manual_seed(1)
    moe = MoE(8, 12, 4, 2, capacity_factor=factor).eval()
    x = torch.randn(3, 10, 8)
    with torch.no_grad():
        out, logits = moe(x)
    chosen = logits.softmax(-1).topk(2, dim=-1).indices  # (30, 2)
    cap = math.ceil(factor * 30 * 2 / 4)
    loads = [int((chosen == e).sum()) for e in range(4)]
    assert moe.dropped == sum(max(0, n - cap) for n in loads)
    # slow: each token's output from the experts that kept it, tokens taken in order until an expert is full
    weights = logits.softmax(-1).topk(2, dim=-1).values
    weights = weights / weights.sum(-1, keepdim=True)
    taken, expected = [0] * 4, torch.zeros(30, 8)
    flat = x.reshape(30, 8)
    with torch.no_grad():
        for n in range(30):
            for slot in range(2):
                e = int(chosen[n, slot])
                if taken[e] < cap:
                    taken[e] += 1
                    expected[n] += weights[n, slot] * moe.experts[e](flat[n : n + 1])[0]
    torch.testing.assert_close(out.reshape(30, 8), expected, rtol=0, atol=1e-5)
    if factor == 4.0:
        assert moe.dropped == 0


def test_bad_moe_specs_are_named():
    with pytest.raises(ValueError, match="1 <= top_k <= n_experts"):
        MoESpec(n_experts=4, top_k=5)
    with pytest.raises(ValueError, match="SwiGLU experts"):
        GPTConfig(mlp="gelu", moe=MoESpec(n_experts=4, top_k=2))
    with pytest.raises(ValueError, match="capacity_factor"):
        MoESpec(n_experts=4, top_k=2, capacity_factor=0)


def test_to_hf_and_from_hf_give_a_tiny_mixtral_with_the_same_logits_padding_included():
    transformers = pytest.importorskip("transformers")
    config = GPTConfig(vocab_size=50, context_length=32, d_model=16, n_heads=4, n_kv_heads=2, n_layers=2,
                       position="rope", norm="rmsnorm", norm_eps=1e-5, mlp="swiglu", d_ff=24, attn_bias=False,
                       mlp_bias=False, tie_weights=False, rope_theta=1e6, moe=MoESpec(n_experts=4, top_k=2))
    torch.manual_seed(0)
    model = GPT(config).eval()
    for p in model.parameters():  # larger than the init, so the experts' outputs matter
        torch.nn.init.normal_(p, std=0.3) if p.dim() > 1 else None
    hf = model.to_hf()
    assert isinstance(hf, transformers.MixtralForCausalLM)
    idx = torch.randint(0, 50, (2, 9), generator=torch.Generator().manual_seed(1))
    mask = torch.ones(2, 9, dtype=torch.long)
    mask[1, :3] = 0  # left padding
    with torch.no_grad():
        torch.testing.assert_close(model(idx), hf(idx).logits, rtol=0, atol=1e-4)
        ours = model(idx, attention_mask=mask)
        theirs = hf(idx, attention_mask=mask).logits
        torch.testing.assert_close(ours[mask.bool()], theirs[mask.bool()], rtol=0, atol=1e-4)  # the real tokens
        back = GPT.from_hf(hf)
    assert back.config == config
    for (name, a), (_, b) in zip(model.state_dict().items(), back.state_dict().items(), strict=True):
        assert torch.equal(a, b), name


def test_to_hf_refuses_what_mixtral_cannot_express():
    with pytest.raises(ValueError, match="no shared expert"):
        GPT(TINY.replace(n_kv_heads=None)).to_hf()
