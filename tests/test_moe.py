"""The mixture-of-experts layer and its auxiliary losses against transformers' Mixtral block and loss, built from
a tiny config (nothing downloaded), and the property that makes it sparse: each expert sees only its tokens."""

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode
from transformers import MixtralConfig
from transformers.models.mixtral import modeling_mixtral
from transformers.models.switch_transformers.modeling_switch_transformers import router_z_loss_func

from gptcourse import MoE, load_balancing_loss, router_z_loss, top_k_routing

C, F, E, K = 16, 24, 6, 2


def _mixtral_block(seed: int = 0) -> torch.nn.Module:
    config = MixtralConfig(hidden_size=C, intermediate_size=F, num_local_experts=E, num_experts_per_tok=K)
    torch.manual_seed(seed)
    block = modeling_mixtral.MixtralSparseMoeBlock(config).eval()
    for p in block.parameters():
        torch.nn.init.normal_(p, std=C ** -0.5)  # outputs of order 1: 1e-5 is float round-off
    return block


def _ours_from(block: torch.nn.Module) -> MoE:
    """Our MoE with the Mixtral block's weights: w1 (gate) and w3 (up) stacked are SwiGLU's fused w_in."""
    moe = MoE(C, F, E, K).eval()
    with torch.no_grad():
        moe.router.weight.copy_(block.gate.weight)
        for e, expert in enumerate(moe.experts):
            if hasattr(block.experts, "gate_up_proj"):  # transformers >= 5: fused (E, 2F, C) and (E, C, F)
                expert.w_in.weight.copy_(block.experts.gate_up_proj[e])
                expert.w_out.weight.copy_(block.experts.down_proj[e])
            else:  # transformers 4: one module per expert
                hf = block.experts[e]
                expert.w_in.weight.copy_(torch.cat([hf.w1.weight, hf.w3.weight]))
                expert.w_out.weight.copy_(hf.w2.weight)
    return moe


def _hf_forward(block: torch.nn.Module, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    out = block(x)
    if isinstance(out, tuple):  # transformers 4 returns the router logits too
        return out
    return out, block.gate(x.reshape(-1, C))[0]


@pytest.mark.parametrize("seed", [0, 1])
def test_equal_to_transformers_mixtral_block(seed):
    block = _mixtral_block(seed)
    moe = _ours_from(block)
    x = torch.randn(3, 7, C, generator=torch.Generator().manual_seed(seed))
    with torch.no_grad():
        hf_out, hf_logits = _hf_forward(block, x)
        out, logits = moe(x)
    assert out.shape == (3, 7, C) and logits.shape == (21, E)
    torch.testing.assert_close(logits, hf_logits, rtol=0, atol=1e-5)
    torch.testing.assert_close(out, hf_out, rtol=0, atol=1e-5)


class _LargestTensor(TorchDispatchMode):
    """Records the largest tensor any operation makes and the row counts the matmuls see."""

    def __init__(self) -> None:
        super().__init__()
        self.largest, self.matmul_rows = 0, []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        for t in out if isinstance(out, (tuple, list)) else [out]:
            if isinstance(t, torch.Tensor):
                self.largest = max(self.largest, t.numel())
        if func.overloadpacket in (torch.ops.aten.mm, torch.ops.aten.addmm):
            self.matmul_rows.append(args[0 if func.overloadpacket is torch.ops.aten.mm else 1].shape[0])
        return out


def test_each_expert_sees_only_its_tokens_and_nothing_dense_is_made():
    block = _mixtral_block()
    moe = _ours_from(block)
    x = torch.randn(2, 12, C, generator=torch.Generator().manual_seed(2))  # N = 24 tokens
    with torch.no_grad():
        _, hf_chosen = block.gate(x.reshape(-1, C))[1:]
    expected = [int((hf_chosen == e).sum()) for e in range(E)]  # tokens routed to each expert, by transformers
    seen = [0] * E
    for e, expert in enumerate(moe.experts):
        expert.register_forward_pre_hook(lambda _, args, e=e: seen.__setitem__(e, seen[e] + args[0].shape[0]))
    mode = _LargestTensor()
    with torch.no_grad(), mode:
        moe(x)
    assert seen == expected, f"experts saw {seen} tokens, {expected} were routed to them"
    assert sum(seen) == 24 * K
    dense = 24 * E * F  # a (tokens x experts x d_ff) tensor
    assert mode.largest < dense, f"a tensor of {mode.largest} elements was made; tokens x experts x d_ff = {dense}"
    # the router sees all 24 tokens; each expert's three matmuls only its own
    assert sorted(mode.matmul_rows) == sorted([24] + [n for n in expected if n for _ in range(2)])


def test_all_tokens_to_one_expert():
    moe = MoE(C, F, E, top_k=1).eval()
    with torch.no_grad():
        moe.router.weight.zero_()
        moe.router.weight[3] = 1.0
    x = torch.rand(2, 5, C) + 0.1  # positive: expert 3's logit is the largest for every token
    seen = [0] * E
    for e, expert in enumerate(moe.experts):
        expert.register_forward_pre_hook(lambda _, args, e=e: seen.__setitem__(e, seen[e] + args[0].shape[0]))
    with torch.no_grad():
        out, _ = moe(x)
    assert seen == [0, 0, 0, 10, 0, 0]
    with torch.no_grad():
        torch.testing.assert_close(out, moe.experts[3](x), rtol=0, atol=1e-6)


def test_shared_expert_is_added_to_every_token_with_weight_one():
    torch.manual_seed(0)
    moe = MoE(C, F, E, K, shared_d_ff=8).eval()
    routed_only = MoE(C, F, E, K).eval()
    routed_only.load_state_dict({k: v for k, v in moe.state_dict().items() if not k.startswith("shared_expert")})
    x = torch.randn(2, 5, C)
    with torch.no_grad():
        torch.testing.assert_close(moe(x)[0], routed_only(x)[0] + moe.shared_expert(x), rtol=0, atol=1e-6)


def test_routing_orders_agree_when_renormalised_and_differ_when_not():
    logits = torch.randn(20, E, generator=torch.Generator().manual_seed(3))
    renormalised = top_k_routing(logits, K, "softmax_then_topk")
    top_k_first = top_k_routing(logits, K, "topk_then_softmax")
    raw_weights, raw_experts = top_k_routing(logits, K, "softmax_then_topk", renormalize=False)
    # exp(l_i) / sum_{j in top k} exp(l_j) both ways: same experts, same weights
    torch.testing.assert_close(top_k_first, renormalised)
    assert torch.equal(raw_experts, renormalised[1])
    torch.testing.assert_close(renormalised[0].sum(-1), torch.ones(20))
    probs = logits.softmax(-1)
    torch.testing.assert_close(raw_weights, probs.sort(-1, descending=True).values[:, :K])  # unrenormalised
    assert (raw_weights.sum(-1) < 1 - 1e-3).all()
    # with every expert chosen, renormalising changes nothing
    full, _ = top_k_routing(logits, E, "softmax_then_topk", renormalize=False)
    torch.testing.assert_close(full.sum(-1), torch.ones(20))


@pytest.mark.parametrize("order", ["softmax_then_topk", "topk_then_softmax"])
def test_selection_bias_chooses_but_never_weights(order):
    """Against a slow per-token reference: rank the experts by score + bias, keep k, weight by the unbiased scores."""
    g = torch.Generator().manual_seed(7)
    logits, bias = torch.randn(12, E, generator=g), torch.randn(E, generator=g) * 0.3
    weights, experts = top_k_routing(logits, K, order, selection_bias=bias)
    for n in range(12):
        scores = logits[n].softmax(-1) if order == "softmax_then_topk" else logits[n]
        ranked = sorted(range(E), key=lambda e: -(scores[e] + bias[e]).item())[:K]
        assert experts[n].tolist() == ranked
        kept = logits[n].softmax(-1)[ranked]  # both orders: exp(l_i) over the chosen j's exp(l_j)
        torch.testing.assert_close(weights[n], kept / kept.sum(), rtol=0, atol=1e-6)
    torch.testing.assert_close(top_k_routing(logits, K, order, selection_bias=torch.zeros(E)),
                               top_k_routing(logits, K, order))
    favoured = torch.zeros(E)
    favoured[4] = 2.0  # larger than any probability: every token takes expert 4 first
    assert (top_k_routing(logits, K, selection_bias=favoured)[1][:, 0] == 4).all()
    moe = MoE(C, F, E, K)
    moe.selection_bias = favoured
    x = torch.randn(1, 5, C, generator=g)
    with torch.no_grad():
        out, router_logits = moe(x)
        weights, experts = top_k_routing(router_logits, K, selection_bias=favoured)
        by_hand = sum(w[:, None] * torch.stack([moe.experts[e](row) for e, row in zip(ex.tolist(), x[0], strict=True)])
                      for w, ex in zip(weights.T, experts.T, strict=True))  # (5, C): each slot's expert on each token
    torch.testing.assert_close(out[0], by_hand, rtol=0, atol=1e-6)


@pytest.mark.parametrize("top_k", [1, 2, E])
@pytest.mark.parametrize("masked", [False, True])
def test_load_balancing_loss_equal_to_transformers(top_k, masked):
    g = torch.Generator().manual_seed(top_k)
    layers = tuple(torch.randn(4 * 9, E, generator=g) * 2 for _ in range(3))  # 3 layers, B = 4, T = 9
    mask = None
    if masked:
        mask = torch.ones(4, 9, dtype=torch.long)
        mask[0, 6:] = mask[2, 2:] = 0  # right padding
        mask[3, :4] = 0  # left padding
    expected = modeling_mixtral.load_balancing_loss_func(layers, E, top_k, mask)
    got = load_balancing_loss(layers, E, top_k, mask)
    torch.testing.assert_close(got, expected, rtol=0, atol=1e-6)
    if masked:  # padding left out: the same as the loss on the real rows alone
        real = mask.reshape(-1).bool()
        alone = load_balancing_loss(torch.cat([layer[real] for layer in layers]), E, top_k)
        torch.testing.assert_close(got, alone, rtol=0, atol=1e-6)


def test_load_balancing_loss_at_balance_and_collapse():
    balanced = torch.zeros(12, 4)
    balanced[torch.arange(12), torch.arange(12) % 4] = 30.0  # each expert takes a quarter, with probability ~1
    collapsed = torch.zeros(12, 4)
    collapsed[:, 1] = 30.0
    assert load_balancing_loss(balanced, 4, 1).item() == pytest.approx(1.0, abs=1e-6)
    assert load_balancing_loss(collapsed, 4, 1).item() == pytest.approx(4.0, abs=1e-6)


def test_router_z_loss_equal_to_switch_transformers():
    logits = torch.randn(3, 8, E, generator=torch.Generator().manual_seed(5)) * 3
    expected = router_z_loss_func(logits)
    torch.testing.assert_close(router_z_loss(logits.reshape(24, E)), expected, rtol=0, atol=1e-5)
    mask = torch.ones(3, 8)
    mask[1, 5:] = 0
    real = mask.reshape(-1).bool()
    torch.testing.assert_close(router_z_loss(logits.reshape(24, E), mask),
                               router_z_loss_func(logits.reshape(24, E)[real][None]), rtol=0, atol=1e-5)


@pytest.mark.parametrize("call, message", [
    (lambda: MoE(C, F, 4, top_k=5), "top_k must be between 1 and n_experts = 4"),
    (lambda: top_k_routing(torch.zeros(3, 4), 2, "sorted"), "unknown routing order 'sorted'"),
    (lambda: top_k_routing(torch.zeros(3, 4), 2, selection_bias=torch.zeros(3)), r"shape \(4,\), got \(3,\)"),
    (lambda: load_balancing_loss(torch.zeros(6, 4), 8, 2), "4 experts in their last dimension, n_experts is 8"),
    (lambda: load_balancing_loss(torch.zeros(6, 4), 4, 2, torch.ones(2, 4)), "B T = 6 rows"),
    (lambda: load_balancing_loss((torch.zeros(6, 4), torch.zeros(5, 4)), 4, 2), r"\(6, 4\), \(5, 4\)"),
])
def test_bad_input_says_what_was_expected(call, message):
    with pytest.raises(ValueError, match=message):
        call()


def test_the_dense_check_catches_a_dense_computation():
    """The check above must be able to fail: a (tokens x experts x d_ff) hidden layer, as a dense MoE makes."""
    moe = MoE(C, F, E, K)
    w_in = torch.stack([expert.w_in.weight for expert in moe.experts])  # (E, 2F, C)
    mode = _LargestTensor()
    with torch.no_grad(), mode:
        gate, value = torch.einsum("nc,efc->nef", torch.randn(24, C), w_in).chunk(2, dim=-1)  # each (N, E, F)
        torch.nn.functional.silu(gate) * value
    assert mode.largest >= 24 * E * F
