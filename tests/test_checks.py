"""gptcourse.checks: every diagnostic, each produced by a known-wrong implementation of the real thing.

The wrong implementations are written here with torch's own modules (nn.LayerNorm, nn.RMSNorm,
nn.MultiheadAttention, scaled_dot_product_attention) or the reference GPT with one piece left out.
"""

from __future__ import annotations

import math
import re

import pytest
import torch
from torch import nn
from torch.nn import functional as F

from gptcourse import GPT, DecoderBlock, MultiHeadAttention, preset
from gptcourse.checks import (
    CheckFailed,
    check_attention_weights,
    check_causal,
    check_causal_mask,
    check_close,
    check_parameter_count,
    check_shape,
    gpt_module_breakdown,
    perturbed_copies,
)
from gptcourse.grading.labs.lab03 import (
    merge_heads_mistakes,
    rope_mistakes,
    rope_table_mistakes,
    split_heads_mistakes,
)
from gptcourse.grading.labs.lab04 import block_mistakes, check_block_parameter_count, norm_mistakes, swiglu_mistakes
from gptcourse.grading.piece import PIECES

TINY = preset("seed-tiny")  # V=100, C=32, H=4, N=2, tied: 24,096 parameters


def _fails(match: str):
    return pytest.raises(CheckFailed, match=match)


def _weights(scores: torch.Tensor, mask: torch.Tensor, dim: int = -1) -> torch.Tensor:
    return scores.masked_fill(~mask, float("-inf")).softmax(dim)


@pytest.fixture
def qkv() -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    gen = torch.Generator().manual_seed(0)
    return tuple(torch.randn(2, 5, 8, generator=gen) for _ in range(3))


# ---- shapes


def test_missing_output_projection_is_named():
    model = GPT(TINY)
    hidden = model.forward_hidden(torch.randint(0, 100, (2, 5)))  # forgot lm_head: (B, T, C)
    with _fails(r"shape \(B, T, C\) = \(2, 5, 32\), expected \(B, T, V\) = \(2, 5, 100\): axis 2 \(V\) has size "
                r"32 = C, expected 100: the output projection \(C -> V\) is missing"):
        check_shape(hidden, "B T V", {"B": 2, "T": 5, "C": 32, "V": 100}, "logits")


def test_unmerged_heads_are_named():
    mha = nn.MultiheadAttention(32, 4, batch_first=True)
    x = torch.randn(2, 5, 32)
    q = mha.in_proj_weight[:32] @ x.transpose(1, 2)  # (B, C, T)
    per_head = q.transpose(1, 2).view(2, 5, 4, 8).transpose(1, 2)  # (B, H, T, D), never merged back
    with _fails(r"\(B, H, T, D\) = \(2, 4, 5, 8\), expected \(B, T, C\).*the heads are not merged"):
        check_shape(per_head, "B T C", {"B": 2, "H": 4, "T": 5, "D": 8, "C": 32}, "attention output")


def test_transposed_axes_are_named():
    x = torch.randn(2, 5, 32)
    with _fails(r"axes 1 \(T\) and 2 \(C\) are swapped"):
        check_shape(x.transpose(1, 2), "B T C", {"B": 2, "T": 5, "C": 32}, "block output")


def test_missing_value_projection_is_named_with_a_lab_cause():
    x = torch.randn(2, 5, 12)
    out = F.scaled_dot_product_attention(x, x, x, is_causal=True)  # v = x: no value projection
    cause = {("D", "C"): "the value projection is missing"}
    with _fails(r"axis 2 \(D\) has size 12 = C, expected 8: the value projection is missing"):
        check_shape(out, "B T D", {"B": 2, "T": 5, "C": 12, "D": 8}, "head output", causes=cause)


def test_missing_batch_axis_is_named():
    with _fails("the batch axis is missing"):
        check_shape(torch.zeros(5, 32), "B T C", {"B": 2, "T": 5, "C": 32}, "embeddings")


def test_right_shape_passes():
    check_shape(torch.zeros(2, 5, 32), "B T C", {"B": 2, "T": 5, "C": 32}, "x")


# ---- values


def test_softmax_over_the_wrong_axis(qkv):
    q, k, _ = qkv
    scores = q @ k.transpose(-2, -1) / math.sqrt(8)
    wrong = _weights(scores, torch.ones(5, 5, dtype=torch.bool).tril(), dim=-2)
    with _fails(r"softmax is over the wrong axis.*softmax\(dim=-1\)"):
        check_attention_weights(wrong)


def test_a_query_with_every_key_masked_is_named(qkv):
    q, k, _ = qkv
    scores = q @ k.transpose(-2, -1) / math.sqrt(8)
    wrong = _weights(scores, torch.ones(5, 5, dtype=torch.bool).tril(diagonal=-1))  # row 0 keeps no key: NaN
    with _fails(r"row \(0, 0\) is NaN.*every key of that query masked.*itself"):
        check_attention_weights(wrong)


def test_mask_on_the_wrong_triangle(qkv):
    q, k, _ = qkv
    scores = q @ k.transpose(-2, -1) / math.sqrt(8)
    wrong = _weights(scores, torch.ones(5, 5, dtype=torch.bool).triu())
    with _fails("the mask is on the wrong triangle"):
        check_attention_weights(wrong)


def test_future_positions_are_listed(qkv):
    q, k, _ = qkv
    mask = torch.ones(5, 5, dtype=torch.bool).tril()
    mask[1, 3] = True  # one leak
    with _fails(r"weight on the future \(position 1 sees 3\)"):
        check_attention_weights(_weights(q @ k.transpose(-2, -1), mask))


def test_missing_scale_is_a_constant_ratio(qkv):
    q, k, _ = qkv
    expected = q @ k.transpose(-2, -1) / math.sqrt(8)
    unscaled = q @ k.transpose(-2, -1)
    with _fails(r"times 2\.828 everywhere \(= sqrt\(D\)\): a division by sqrt\(D\) is missing"):
        check_close(unscaled, expected, "scores", scales={"sqrt(D)": math.sqrt(8)})


def test_largest_error_and_where():
    expected = torch.zeros(2, 3, 4)
    got = expected.clone()
    got[1, 2, 3] = 0.5
    got[0, 0, 0] = 0.1
    with _fails(r"largest error 0\.5 at index \(1, 2, 3\): got 0\.5, expected 0; 2 of 24 entries are off"):
        check_close(got, expected, "output")


def test_rmsnorm_with_mean_subtraction_is_recognised():
    x = torch.randn(2, 5, 16) + 3.0  # a non-zero mean, so the mistake matters
    reference = nn.RMSNorm(16, eps=1e-6)
    wrong = nn.LayerNorm(16, eps=1e-6, bias=False)  # what "RMSNorm" minus the mean computes
    with torch.no_grad():
        reference.weight.uniform_(0.5, 1.5)
        wrong.weight.copy_(reference.weight)
        got, expected = wrong(x), reference(x)
    with _fails("it subtracts the mean"):
        check_close(got, expected, "RMSNorm output", mistakes=norm_mistakes(x, reference.weight.detach(), 1e-6))


def test_a_known_mistake_that_gives_the_right_answer_is_not_blamed():
    expected = torch.ones(1, 1, 1)
    check_close(expected.clone(), expected, "weights", mistakes={"softmax over the wrong axis": expected.clone()})


# ---- the mask and causality


@pytest.mark.parametrize(("wrong", "message"), [
    (lambda t: torch.ones(t, t, dtype=torch.bool).triu(), "on the wrong triangle"),
    (lambda t: torch.ones(t, t, dtype=torch.bool).tril(-1), "the diagonal is masked"),
    (lambda t: ~torch.ones(t, t, dtype=torch.bool).tril(), "True and False are swapped"),
    (lambda t: torch.ones(t, t).tril(), "dtype torch.float32, expected torch.bool"),
])
def test_causal_mask_mistakes(wrong, message):
    with _fails(message):
        check_causal_mask(wrong(4), torch.tril(torch.ones(4, 4)).bool())


def test_non_causal_model_lists_positions_that_see_the_future():
    mha = nn.MultiheadAttention(8, 2, batch_first=True)  # no attn_mask: bidirectional
    x = torch.randn(2, 4, 8)
    with torch.no_grad():
        outputs = torch.stack([mha(c, c, c, need_weights=False)[0] for c in perturbed_copies(x)])
    with _fails(r"not causal.*position 0 sees 1, 2, 3; position 1 sees 2, 3; position 2 sees 3"):
        check_causal(outputs, "attention")


def test_causal_model_passes_the_probe():
    mha = nn.MultiheadAttention(8, 2, batch_first=True)
    x = torch.randn(2, 4, 8)
    mask = torch.ones(4, 4, dtype=torch.bool).triu(1)  # True = blocked, torch's convention
    with torch.no_grad():
        outputs = torch.stack([mha(c, c, c, attn_mask=mask, need_weights=False)[0] for c in perturbed_copies(x)])
    check_causal(outputs, "attention")


def test_token_ids_are_perturbed_within_the_vocabulary():
    copies = perturbed_copies(torch.tensor([[0, 99]]), vocab_size=100)
    assert copies.tolist() == [[[0, 99]], [[1, 99]], [[0, 0]]]


# ---- parameter counts


def test_untied_output_projection_is_explained():
    untied = sum(p.numel() for p in GPT(preset("seed-tiny-untied")).parameters())  # 27,296
    with _fails(r"27,296, expected 24,096: \+3,200 = V x d: untied output projection\?"):
        check_parameter_count(untied, TINY)


def test_missing_position_table_is_explained():
    config = preset("seed-repo")  # learned positions, T_max=64, d=128
    without_positions = sum(p.numel() for n, p in GPT(config).named_parameters() if not n.startswith("pos_emb"))
    with _fails(r"-8,192 = T_max x d: the learned position table is missing\?"):
        check_parameter_count(without_positions, config)


def test_component_breakdown_names_the_wrong_component():
    model = GPT(TINY)
    model.final_norm = nn.Identity()  # forgot the final norm
    with _fails(r"1 component\(s\) wrong: final_norm is 0, expected 32 \(-32 = one norm: the final norm is "
                r"missing\?\)"):
        check_parameter_count(gpt_module_breakdown(model), TINY)


def test_correct_counts_pass():
    model = GPT(TINY)
    check_parameter_count(sum(p.numel() for p in model.parameters()), TINY)
    check_parameter_count(gpt_module_breakdown(model), TINY)


# ---- display


def test_notebook_display_is_the_message_only():
    error = CheckFailed("logits: shape (2, 5, 32), expected (2, 5, 100)")
    rendered = "\n".join(error._render_traceback_())
    assert "logits: shape (2, 5, 32), expected (2, 5, 100)" in rendered
    assert "Traceback" not in rendered and "File" not in rendered
    assert isinstance(error, AssertionError)  # nbgrader scores a cell with any error output 0


# ---- labs 05-07: the assembled model, parameter counts, training and sampling, judged through their cases


def _judged(test_id: str, obj) -> str:
    """The failure message of case `test_id` on `obj` (a known-wrong implementation). The wrong models below
    subclass gptcourse.GPT to leave one step out, which a graded `check` refuses to run (it is the reference of
    lab 05); so the case is run and judged here directly, as `check` does for an honest submission."""
    from gptcourse.grading import case_seed, get_case, judge_payload
    from gptcourse.grading.kernel import run_case

    case = get_case(test_id)
    passed, message = judge_payload(run_case(case, case_seed(case), obj))
    assert not passed, f"{test_id} passed on a known-wrong {obj!r}"
    return " ".join(message.split())  # unwrapped


class _GPTWithout(GPT):
    """gptcourse.GPT with one step of the forward pass left out, as a student might write it."""

    skip = ""

    def forward_hidden(self, idx, cache=None):
        positions = torch.arange(idx.size(1))
        x = self.tok_emb(idx)
        if self.pos_emb is not None and self.skip != "positions":
            x = x + self.pos_emb(positions)
        rope = self.rope(positions) if self.rope is not None and self.skip != "rope" else None
        for block in self.blocks:
            x = block(x, rope=rope)
        return x if self.skip == "final_norm" else self.final_norm(x)

    def forward(self, idx, cache=None):
        hidden = self.forward_hidden(idx)
        return hidden if self.skip == "lm_head" else self.lm_head(hidden)


@pytest.mark.parametrize(("skip", "test_id", "message"), [
    ("lm_head", "05.GPT.visible", r"logits: shape \(B, T, C\) = \(2, 5, 32\), expected \(B, T, V\) = \(2, 5, 100\): "
                                  r"axis 2 \(V\) has size 32 = C, expected 100: the output projection is missing"),
    ("final_norm", "05.GPT.visible", "logits: the final norm is missing"),
    ("final_norm", "05.GPT.forward_hidden", "forward_hidden: the final norm is missing"),
    ("positions", "05.GPT.visible", "logits: the positions are missing"),
    ("rope", "05.GPT.rope", "logits: RoPE is not used"),
])
def test_assembly_mistakes_are_named(skip, test_id, message):
    wrong = type(f"GPTWithout_{skip}", (_GPTWithout,), {"skip": skip})
    assert re.search(message, _judged(test_id, wrong))


def test_a_model_that_never_ties_is_explained():
    class NeverTied(GPT):
        def __init__(self, config):
            super().__init__(config.replace(tie_weights=False))

    assert "+3,200 = V x d: untied output projection?" in _judged("05.GPT.tying", NeverTied)


def test_layernorm_without_bias_is_explained_per_component():
    config = preset("gpt2-small")
    with torch.device("meta"):  # shapes without memory
        counts = gpt_module_breakdown(GPT(config.replace(norm_bias=False)))
    # one norm per block with its bias is off by as much (N x 2d = 2N x d): the message names both
    with _fails(r"block_norms is 18,432, expected 36,864 \(-18,432 = N norms: one norm per block counted\? Each "
                r"block has two, one before attention and one before the MLP; or 2N x d: the block norms' LayerNorm "
                r"bias \(beta\) is not counted\?\); final_norm is 768, expected 1,536 \(-768 = d: the final "
                r"LayerNorm's bias \(beta\) is not counted\?\)"):
        check_parameter_count(counts, config)


def _train_step(model, optimizer, tokens, grad_clip, *, zero_grad=True, clip=True, shift=True):
    """A training step written with torch alone, with one of the usual mistakes when asked."""
    x = tokens[:, :-1]
    y = tokens[:, 1:] if shift else x
    if zero_grad:
        optimizer.zero_grad()
    loss = F.cross_entropy(model(x).flatten(0, 1), y.flatten())
    loss.backward()
    if clip:
        nn.utils.clip_grad_norm_(model.parameters(), grad_clip)
    optimizer.step()
    return loss.item()


def test_training_mistakes_are_named():
    def unshifted_loss(model, tokens):
        return F.cross_entropy(model(tokens[:, :-1]).flatten(0, 1), tokens[:, :-1].flatten())

    assert "the loss: the targets are not shifted" in _judged("07.next_token_loss.visible", unshifted_loss)
    assert "the loss is summed over the B x T positions" in _judged(
        "07.next_token_loss.visible",
        lambda m, t: F.cross_entropy(m(t[:, :-1]).flatten(0, 1), t[:, 1:].flatten(), reduction="sum"))
    no_zero_grad = _judged("07.train_step.twice", lambda *a: _train_step(*a, zero_grad=False))
    assert "the gradients accumulate from one step to the next" in no_zero_grad
    assert "the gradients are not clipped" in _judged("07.train_step.visible", lambda *a: _train_step(*a, clip=False))


def _probs(logits, temperature=1.0, top_k=None, *, after_softmax=False, keep="<"):
    if not after_softmax:
        logits = logits / temperature
    if top_k is not None:
        kth = torch.topk(logits, top_k, dim=-1).values[:, -1:]
        logits = logits.masked_fill(logits < kth if keep == "<" else logits <= kth, float("-inf"))
    probs = logits.softmax(dim=-1)
    return probs / temperature if after_softmax else probs


def test_sampling_mistakes_are_named():
    after = _judged("07.next_token_probs.visible", lambda *a, **k: _probs(*a, **k, after_softmax=True))
    assert "the temperature is applied after the softmax" in after
    assert "top-k keeps k - 1 tokens" in _judged("07.next_token_probs.top_k",
                                                 lambda *a, **k: _probs(*a, **k, keep="<="))

    def first_position(model, idx, temperature=1.0, top_k=None, generator=None):
        idx = idx[:, -model.config.context_length:]  # the crop is right; only the position is wrong
        return model(idx)[:, 0].argmax(dim=-1, keepdim=True)

    assert "the logits of the first position were used" in _judged("07.sample_next_token.greedy", first_position)


# ---- heads, RoPE, SwiGLU, the decoder block (labs 03 and 04): each wrong implementation written independently


def _split_by_slices(x: torch.Tensor, h: int) -> torch.Tensor:
    d = x.size(-1) // h
    return torch.stack([x[..., i * d:(i + 1) * d] for i in range(h)], dim=1)  # (B, H, T, D)


@pytest.mark.parametrize(("wrong", "message"), [
    (lambda x: x.reshape(2, 3, 5, 4), r"cut with view\(B, H, T, D\) straight from \(B, T, C\)"),
    (lambda x: torch.stack([x[..., i::3] for i in range(3)], dim=1), "each head took every H-th feature"),
])
def test_split_heads_mistakes(wrong, message):
    x = torch.randn(2, 5, 12)
    with _fails(message):
        check_close(wrong(x), _split_by_slices(x, 3), "split_heads", mistakes=split_heads_mistakes(x, 3))


@pytest.mark.parametrize(("wrong", "message"), [
    (lambda y: y.reshape(2, 5, 12), r"reshaped to \(B, T, C\) without transpose\(1, 2\)"),
    (lambda y: torch.stack(list(y.unbind(1)), dim=-1).flatten(-2), "the heads' features are interleaved"),
])
def test_merge_heads_mistakes(wrong, message):
    y = torch.randn(2, 3, 5, 4)
    expected = torch.cat(list(y.unbind(1)), dim=-1)  # head after head: (B, T, C)
    with _fails(message):
        check_close(wrong(y), expected, "merge_heads", mistakes=merge_heads_mistakes(y))


def _angles(t: int, d: int, theta: float = 10000.0) -> torch.Tensor:
    """(T, D/2): position m times pair i's frequency, from the formula, one number at a time."""
    return torch.tensor([[m * theta ** (-2 * i / d) for i in range(d // 2)] for m in range(t)], dtype=torch.float64)


def _rope_complex(x: torch.Tensor, angles: torch.Tensor, pairs: str) -> torch.Tensor:
    """RoPE as complex multiplication; pairs "half" = (i, i + D/2), "interleaved" = (2i, 2i + 1)."""
    rotation = torch.polar(torch.ones_like(angles), angles)  # (T, D/2)
    if pairs == "half":
        x1, x2 = x.chunk(2, dim=-1)
        z = torch.complex(x1, x2) * rotation
        return torch.cat([z.real, z.imag], dim=-1)
    z = torch.view_as_complex(x.reshape(*x.shape[:-1], -1, 2).contiguous()) * rotation
    return torch.view_as_real(z).flatten(-2)


def test_rope_mistakes_are_recognised():
    x = torch.randn(2, 3, 5, 8, dtype=torch.float64)
    angles = _angles(5, 8)
    cos, sin = torch.cat([angles, angles], -1).cos(), torch.cat([angles, angles], -1).sin()
    expected = _rope_complex(x, angles, "half")
    mistakes = rope_mistakes(x, cos, sin)
    with _fails(r"the pairs are interleaved, feature 2i with 2i\+1, each turned by pair i's angle"):
        check_close(_rope_complex(x, angles, "interleaved"), expected, "RoPE", mistakes=mistakes)
    pairs_swapped = torch.stack([-x[..., 1::2], x[..., 0::2]], dim=-1).flatten(-2)  # rotate_half on (2i, 2i + 1)
    with _fails(r"the pairs are interleaved, feature 2i with 2i\+1 \(the RoPE paper's"):
        check_close(x * cos + pairs_swapped * sin, expected, "RoPE", mistakes=mistakes)
    with _fails("the rotation goes the wrong way"):
        check_close(_rope_complex(x, -angles, "half"), expected, "RoPE", mistakes=mistakes)


def test_rope_table_mistakes_are_recognised():
    angles = _angles(6, 8)
    expected = torch.cat([angles, angles], dim=-1).cos()
    mistakes = {what: a.cos() for what, a in rope_table_mistakes(8, 6, 10000.0).items()}
    with _fails("the angles are in the interleaved layout"):
        check_close(angles.repeat_interleave(2, dim=-1).cos(), expected, "cos", mistakes=mistakes)
    slow = _angles(6, 16)[:, :4]  # theta^(-2i/16) = theta^(-i/8): half the exponent
    with _fails(r"the frequencies use theta\^\(-i/D\)"):
        check_close(torch.cat([slow, slow], dim=-1).cos(), expected, "cos", mistakes=mistakes)


def _sdpa_attention(x, layer, h, rope=None, rotate_v=False, scale=None):
    """A multi-head attention written with nn.Linear weights and scaled_dot_product_attention."""
    q, k, v = (_split_by_slices(z, h) for z in F.linear(x, layer.qkv.weight, layer.qkv.bias).chunk(3, -1))
    if rope is not None:
        q, k = _rope_complex(q, rope, "half"), _rope_complex(k, rope, "half")
        v = _rope_complex(v, rope, "half") if rotate_v else v
    y = F.scaled_dot_product_attention(q, k, v, is_causal=True, scale=scale)  # (B, H, T, D)
    return F.linear(torch.cat(list(y.unbind(1)), dim=-1), layer.out.weight, layer.out.bias)


@pytest.mark.parametrize(("wrong", "message"), [
    ({"rotate_v": True}, "RoPE is applied to v as well"),
    ({"rope": None}, "RoPE is missing"),
    ({"scale": 1 / math.sqrt(32)}, r"divided by sqrt\(C\) = sqrt\(32\), the model.s width"),
])
def test_multi_head_mistakes(wrong, message):
    torch.manual_seed(0)
    layer, x = MultiHeadAttention(32, 4), torch.randn(2, 6, 32)
    angles = _angles(6, 8).float()
    rope = torch.cat([angles, angles], -1).cos(), torch.cat([angles, angles], -1).sin()
    with torch.no_grad():
        expected = layer(x, rope=rope)
        got = _sdpa_attention(x, layer, 4, **{"rope": angles} | wrong)
    inputs = {"init": {"d_model": 32, "n_heads": 4}, "weights": layer.state_dict(), "x": x, "cos": rope[0],
              "sin": rope[1]}
    mistakes = PIECES["03.MultiHeadAttention"].known_mistakes("y", inputs)  # through the piece's call, lazily
    with _fails(message):
        check_close(got, expected, "attention output", mistakes=mistakes)


@pytest.mark.parametrize(("hidden", "message"), [
    (lambda g, v: F.silu(v) * g, "the gate and the value are swapped"),
    (lambda g, v: F.silu(g) * F.silu(v), "SiLU is applied to the value too"),
    (lambda g, v: F.silu(g * v), "SiLU is applied to the product"),
    (lambda g, v: g * v, "the gate's SiLU is missing"),
    (lambda g, v: F.relu(g) * v, "ReLU instead of SiLU"),
    (lambda g, v: torch.sigmoid(g) * v, "sigmoid instead of SiLU"),
    (lambda g, v: F.silu(g) + v, "the gate and the value are added"),
])
def test_swiglu_mistakes(hidden, message):
    gate, value, out = nn.Linear(16, 24, bias=False), nn.Linear(16, 24, bias=False), nn.Linear(24, 16, bias=False)
    x = torch.randn(2, 5, 16)
    w_in = torch.cat([gate.weight, value.weight]).detach()  # rows [gate; value]
    with torch.no_grad():
        expected = out(x @ gate.weight.T * torch.sigmoid(x @ gate.weight.T) * value(x))  # silu(g) = g sigmoid(g)
        got = out(hidden(gate(x), value(x)))
    with _fails(message):
        check_close(got, expected, "SwiGLU", mistakes=swiglu_mistakes(x, w_in, out.weight.detach()))


def _torch_block(x, block, order):
    """A decoder block written with torch.nn.RMSNorm and the block's attention and MLP."""
    norm1, norm2 = nn.RMSNorm(32, eps=1e-6), nn.RMSNorm(32, eps=1e-6)
    norm1.weight.data, norm2.weight.data = block.norm1.weight.data, block.norm2.weight.data
    if order == "post-norm":
        u = norm1(x + block.attn(x))
        return norm2(u + block.mlp(u))
    if order == "parallel":
        return x + block.attn(norm1(x)) + block.mlp(norm2(x))
    u = x + block.attn(norm1(x))
    return {"no-mlp-residual": block.mlp(norm2(u)), "norm1-twice": u + block.mlp(norm1(u))}[order]


@pytest.mark.parametrize(("order", "message"), [
    ("post-norm", "post-norm: the norms are applied after the residual additions"),
    ("parallel", r"the MLP reads norm2\(x\), not norm2\(u\)"),
    ("no-mlp-residual", "the MLP's residual is missing"),
    ("norm1-twice", "norm1 is used before both sublayers"),
])
def test_block_mistakes(order, message):
    torch.manual_seed(0)
    block = DecoderBlock(TINY)
    with torch.no_grad():
        block.norm1.weight.uniform_(0.5, 1.5)
        block.norm2.weight.uniform_(0.5, 1.5)
        x = torch.randn(2, 5, 32) + 0.5
        expected, got = block(x), _torch_block(x, block, order)
        mistakes = block_mistakes(x, block.attn, block.mlp, block.norm1, block.norm2)
    with _fails(message):
        check_close(got, expected, "block output", mistakes=mistakes)


def _block_counts(block: nn.Module) -> dict[str, int]:
    counts = {"attention": 0, "mlp": 0, "norms": 0}
    for name, p in block.named_parameters():
        counts[{"attn": "attention", "mlp": "mlp", "norm1": "norms", "norm2": "norms"}[name.split(".")[0]]] += p.numel()
    return counts


@pytest.mark.parametrize(("change", "message"), [
    ({"mlp_bias": True}, r"mlp has 6,304, expected 6,144 \(\+160: SwiGLU's linear layers have biases"),
    ({"norm": "layernorm"}, r"norms has 128, expected 64 \(\+64: a bias \(beta\) in each norm: RMSNorm has only"),
    ({"mlp": "relu"}, r"mlp has 4,096, expected 6,144 \(-2,048: w_in maps C -> d_ff"),
    ({"attn_bias": False}, r"attention has 4,096, expected 4,224 \(-128: the attention biases are missing"),
])
def test_block_parameter_mistakes_are_explained(change, message):
    wrong = DecoderBlock(TINY.replace(**{"mlp_bias": False} | change))  # a real block with one thing changed
    with _fails(message):
        check_block_parameter_count(_block_counts(wrong), TINY)
    check_block_parameter_count(_block_counts(DecoderBlock(TINY)), TINY)
