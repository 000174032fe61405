"""The assembled GPT: shapes, tying, heads, causality for every preset family, and bad input."""

import pytest
import torch

from gptcourse import GPT, GPTConfig, RewardModel, ValueHead, preset

# Small members of every family: the presets themselves where they are small, scaled-down twins of the big ones.
FAMILIES = {
    "seed-tiny": preset("seed-tiny"),
    "seed-tiny-untied": preset("seed-tiny-untied"),
    "seed-repo": preset("seed-repo"),
    "gpt2-like": preset("gpt2-small").replace(vocab_size=97, context_length=32, d_model=48, n_heads=4, n_layers=2),
    "llama-like": preset("llama2-7b").replace(vocab_size=97, context_length=32, d_model=48, n_heads=4, n_layers=2,
                                              d_ff=72),
    "no-positions": GPTConfig(position="none"),
}


@pytest.mark.parametrize("name", FAMILIES)
def test_logits_and_hidden_shapes(name):
    config = FAMILIES[name]
    model = GPT(config)
    idx = torch.randint(0, config.vocab_size, (2, 5))
    assert model(idx).shape == (2, 5, config.vocab_size)
    hidden = model.forward_hidden(idx)
    assert hidden.shape == (2, 5, config.d_model)
    assert torch.allclose(model.lm_head(hidden), model(idx))


@pytest.mark.parametrize("fused", [True, False])
@pytest.mark.parametrize("name", FAMILIES)
def test_changing_a_token_never_changes_earlier_logits(name, fused):
    torch.manual_seed(0)
    config = FAMILIES[name]
    model = GPT(config).eval()
    for block in model.blocks:
        block.attn.fused = fused
    idx = torch.randint(0, config.vocab_size, (2, 8))
    changed = idx.clone()
    changed[:, 5] = (changed[:, 5] + 1) % config.vocab_size
    a, b = model(idx), model(changed)
    assert torch.allclose(a[:, :5], b[:, :5], atol=1e-5)
    assert not torch.allclose(a[:, 5:], b[:, 5:], atol=1e-5)


def test_positions_matter_only_when_present():
    """With one layer, the last position attends to the *set* of earlier tokens unless positions are encoded."""
    torch.manual_seed(0)
    idx, swapped = torch.tensor([[1, 2, 3, 4]]), torch.tensor([[2, 1, 3, 4]])
    for position, invariant in (("none", True), ("learned", False), ("rope", False)):
        model = GPT(GPTConfig(position=position, n_layers=1)).eval()
        last, last_swapped = model.forward_hidden(idx)[0, -1], model.forward_hidden(swapped)[0, -1]
        assert torch.allclose(last, last_swapped, atol=1e-6) == invariant, position


def test_tied_head_is_the_embedding_table():
    model = GPT(preset("seed-tiny"))
    assert model.lm_head.weight is model.tok_emb.weight
    model(torch.randint(0, 100, (1, 4))).sum().backward()
    assert model.tok_emb.weight.grad is not None
    untied = GPT(preset("seed-tiny-untied"))
    assert untied.lm_head.weight is not untied.tok_emb.weight


def test_untied_head_with_bias():
    model = GPT(preset("seed-repo"))
    assert model.lm_head.bias is not None and model.lm_head.bias.shape == (65,)


def test_value_and_reward_heads_share_the_backbone():
    torch.manual_seed(0)
    backbone = GPT(preset("seed-tiny"))
    value = ValueHead(backbone)
    reward = RewardModel(backbone)
    with torch.no_grad():
        reward.head.weight.copy_(value.head.weight)  # the reward head has no bias (pairwise losses ignore it)
    idx = torch.randint(0, 100, (3, 6))
    values = value(idx)
    assert values.shape == (3, 6)
    assert torch.allclose(reward(idx), values[:, -1] - value.head.bias, atol=1e-6)
    expected = backbone.forward_hidden(idx) @ value.head.weight[0] + value.head.bias[0]
    assert torch.allclose(values, expected, atol=1e-6)


@pytest.mark.parametrize(
    ("idx", "error", "message"),
    [
        (torch.rand(2, 5), TypeError, "integer tensor .* got dtype torch.float32"),
        (torch.tensor([[1, -1]]), ValueError, r"token id -1 is out of range: expected 0 <= id < vocab_size=100"),
        (torch.tensor([[1, 100]]), ValueError, r"token id 100 is out of range"),
        (torch.zeros(2, 65, dtype=torch.long), ValueError, "sequence length 65 exceeds context_length=64"),
        (torch.zeros(5, dtype=torch.long), ValueError, r"shape \(B, T\), got \(5,\)"),
        ([[1, 2]], TypeError, "must be a torch.Tensor"),
    ],
)
def test_bad_token_ids(idx, error, message):
    model = GPT(GPTConfig(vocab_size=100, context_length=64))
    with pytest.raises(error, match=message):
        model(idx)


def test_gpt_wants_a_config():
    with pytest.raises(TypeError, match="GPT expects a GPTConfig, got dict"):
        GPT({"d_model": 32})


def test_learned_positions_backward_repeats_itself_bit_for_bit_on_two_threads():
    """A padded batch repeats positions: their gradients must add up in the same order every time, or training
    with padding differs run to run on a multi-core laptop (indexing's backward gave 9-23 different results in 200)."""
    from gptcourse.model.positions import LearnedPositions

    table = LearnedPositions(64, 64)
    positions = torch.randint(0, 8, (32, 64), generator=torch.Generator().manual_seed(0))  # (B, T), few rows
    upstream = torch.randn(32, 64, 64, generator=torch.Generator().manual_seed(1))  # (B, T, C)
    threads = torch.get_num_threads()
    torch.set_num_threads(2)
    try:
        results = set()
        for _ in range(200):
            table.weight.grad = None
            table(positions).backward(upstream)
            results.add(table.weight.grad.numpy().tobytes())
    finally:
        torch.set_num_threads(threads)
    assert len(results) == 1, f"{len(results)} different gradients in 200 backward passes"
    summed = torch.zeros(64, 64, dtype=torch.float64).index_add_(0, positions.flatten(), upstream.double().view(-1, 64))
    torch.testing.assert_close(table.weight.grad.double(), summed, rtol=1e-4, atol=1e-4)
