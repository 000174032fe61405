"""Attention against nn.MultiheadAttention, the two paths against each other, and causality."""

import math

import pytest
import torch
from torch import nn

from gptcourse import AttentionHead, MultiHeadAttention, attention, causal_mask, fused_attention, repeat_kv
from gptcourse.model.positions import RotaryEmbedding, apply_rope


def test_causal_mask_is_lower_triangular():
    m = causal_mask(4)
    for i in range(4):
        for j in range(4):
            assert bool(m[i, j]) == (j <= i)


def test_causal_mask_with_cached_keys_aligns_queries_to_the_end():
    m = causal_mask(2, 5)  # queries at absolute positions 3 and 4
    assert m.tolist() == [[True, True, True, True, False], [True, True, True, True, True]]
    with pytest.raises(ValueError, match="more queries than keys"):
        causal_mask(3, 2)


def test_explicit_attention_by_hand():
    torch.manual_seed(0)
    q, k, v = torch.randn(3, 4), torch.randn(3, 4), torch.randn(3, 4)
    out, weights = attention(q, k, v)
    for i in range(3):
        scores = torch.tensor([float(q[i] @ k[j]) / math.sqrt(4) for j in range(i + 1)])
        w = torch.softmax(scores, dim=0)
        assert torch.allclose(weights[i, : i + 1], w, atol=1e-6)
        assert torch.all(weights[i, i + 1 :] == 0)
        assert torch.allclose(out[i], (w[:, None] * v[: i + 1]).sum(0), atol=1e-6)


@pytest.mark.parametrize(("t_q", "t_k"), [(7, 7), (1, 7), (3, 7)])
def test_fused_equals_explicit(t_q, t_k):
    torch.manual_seed(0)
    q, k, v = torch.randn(2, 3, t_q, 8), torch.randn(2, 3, t_k, 8), torch.randn(2, 3, t_k, 8)
    assert torch.allclose(fused_attention(q, k, v), attention(q, k, v)[0], atol=1e-6)


def _torch_mha_copy(ours: MultiHeadAttention, d: int, h: int) -> nn.MultiheadAttention:
    theirs = nn.MultiheadAttention(d, h, batch_first=True, bias=ours.qkv.bias is not None)
    with torch.no_grad():
        theirs.in_proj_weight.copy_(ours.qkv.weight)
        theirs.out_proj.weight.copy_(ours.out.weight)
        if ours.qkv.bias is not None:
            theirs.in_proj_bias.copy_(ours.qkv.bias)
            theirs.out_proj.bias.copy_(ours.out.bias)
    return theirs


@pytest.mark.parametrize("fused", [True, False])
@pytest.mark.parametrize("bias", [True, False])
def test_multi_head_matches_torch(fused, bias):
    torch.manual_seed(0)
    d, h, t = 32, 4, 6
    ours = MultiHeadAttention(d, h, bias=bias, fused=fused)
    theirs = _torch_mha_copy(ours, d, h)
    x = torch.randn(2, t, d)
    future = torch.triu(torch.full((t, t), float("-inf")), diagonal=1)
    expected, expected_weights = theirs(x, x, x, attn_mask=future, need_weights=True, average_attn_weights=False)
    assert (ours(x) - expected).abs().max() < 1e-5
    assert (ours.weights(x) - expected_weights).abs().max() < 1e-6


def test_single_head_matches_torch_with_one_head():
    torch.manual_seed(0)
    d, t = 8, 5
    head = AttentionHead(d, d)
    theirs = nn.MultiheadAttention(d, 1, batch_first=True)
    with torch.no_grad():
        theirs.in_proj_weight.copy_(torch.cat([head.query.weight, head.key.weight, head.value.weight]))
        theirs.in_proj_bias.copy_(torch.cat([head.query.bias, head.key.bias, head.value.bias]))
        theirs.out_proj.weight.copy_(torch.eye(d))
        theirs.out_proj.bias.zero_()
    x = torch.randn(3, t, d)
    future = torch.triu(torch.full((t, t), float("-inf")), diagonal=1)
    expected, expected_weights = theirs(x, x, x, attn_mask=future)
    out, weights = head(x)
    assert (out - expected).abs().max() < 1e-5
    assert (weights - expected_weights).abs().max() < 1e-6


@pytest.mark.parametrize("fused", [True, False])
def test_multi_head_never_sees_the_future(fused):
    torch.manual_seed(0)
    mha = MultiHeadAttention(16, 2, fused=fused)
    x = torch.randn(1, 6, 16)
    changed = x.clone()
    changed[:, 4] += 10.0
    a, b = mha(x), mha(changed)
    assert torch.allclose(a[:, :4], b[:, :4], atol=1e-6)
    assert not torch.allclose(a[:, 4], b[:, 4])


def test_rope_scores_depend_only_on_relative_position():
    torch.manual_seed(0)
    d = 16
    rope = RotaryEmbedding(d, 64)
    q, k = torch.randn(1, 1, 1, d), torch.randn(1, 1, 1, d)

    def score(m: int, n: int) -> float:
        qm = apply_rope(q, *rope(torch.tensor([m])))
        kn = apply_rope(k, *rope(torch.tensor([n])))
        return float((qm * kn).sum())

    assert score(5, 2) == pytest.approx(score(33, 30), abs=1e-5)
    assert score(10, 10) == pytest.approx(float((q * k).sum()), abs=1e-5)
    assert score(5, 2) != pytest.approx(score(5, 4), abs=1e-3)


def test_rope_is_a_rotation():
    torch.manual_seed(0)
    rope = RotaryEmbedding(8, 32)
    x = torch.randn(2, 3, 10, 8)
    rotated = apply_rope(x, *rope(torch.arange(10)))
    assert torch.allclose(rotated.norm(dim=-1), x.norm(dim=-1), atol=1e-5)
    assert torch.allclose(rotated[..., 0, :], x[..., 0, :])  # position 0: angle 0


def test_repeat_kv_matches_hugging_face():
    llama = pytest.importorskip("transformers.models.llama.modeling_llama")
    x = torch.randn(2, 3, 5, 4)  # (B, H_kv, T, D)
    for n_rep in (1, 2, 4):
        assert torch.equal(repeat_kv(x, n_rep), llama.repeat_kv(x, n_rep))


@pytest.mark.parametrize("fused", [True, False])
@pytest.mark.parametrize("n_kv_heads", [1, 2, 6])
def test_grouped_query_attention_equals_a_loop_over_query_heads(fused, n_kv_heads):
    torch.manual_seed(0)
    b, t, c, h = 2, 7, 24, 6
    d, group = c // h, h // n_kv_heads
    mha = MultiHeadAttention(c, h, fused=fused, n_kv_heads=n_kv_heads)
    assert mha.qkv.weight.shape == (c + 2 * n_kv_heads * d, c)
    x = torch.randn(b, t, c)
    q, k, v = mha.qkv(x).split([c, n_kv_heads * d, n_kv_heads * d], dim=-1)
    heads = []
    for i in range(h):  # query head i reads kv head i // group: the slow, obviously right way
        j = i // group
        heads.append(nn.functional.scaled_dot_product_attention(
            q[..., i * d:(i + 1) * d], k[..., j * d:(j + 1) * d], v[..., j * d:(j + 1) * d], is_causal=True))
    expected = mha.out(torch.cat(heads, dim=-1))
    torch.testing.assert_close(mha(x), expected, rtol=1e-5, atol=1e-6)


def test_kv_heads_must_divide_query_heads():
    with pytest.raises(ValueError, match="n_kv_heads=4 must divide n_heads=6"):
        MultiHeadAttention(24, 6, n_kv_heads=4)


@pytest.mark.parametrize(("t_q", "t_k"), [(6, 6), (1, 9), (3, 9)])  # prefill, one cached token, a cached chunk
def test_fused_attention_shares_grouped_kv_heads(t_q, t_k):
    torch.manual_seed(0)
    q, k, v = torch.randn(2, 6, t_q, 4), torch.randn(2, 3, t_k, 4), torch.randn(2, 3, t_k, 4)
    expected, _ = attention(q, repeat_kv(k, 2), repeat_kv(v, 2))
    torch.testing.assert_close(fused_attention(q, k, v), expected, rtol=1e-5, atol=1e-6)
