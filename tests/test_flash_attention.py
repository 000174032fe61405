"""Tiled attention (gptcourse.model.tiled_attention) against torch's F.scaled_dot_product_attention with the
equivalent boolean mask, in the output and all three gradients; gradcheck in float64; the online-softmax merge
against torch.softmax for any split; and what the tiling promises: no (T, T) tensor, computed or saved, and the
tiles a mask would empty never computed."""

from __future__ import annotations

import itertools

import pytest
import torch
from torch.nn import functional as F
from torch.utils._python_dispatch import TorchDispatchMode

from gptcourse import causal_mask, computed_tiles, flash_attention, flash_forward, online_softmax, padding_mask

# (B, H, H_kv, T, D, block_q, block_k, causal, window, padded)
CASES = {
    "causal": (2, 4, 4, 37, 8, 8, 16, True, None, False),
    "causal-T-a-multiple": (1, 2, 2, 32, 16, 8, 8, True, None, False),
    "not-causal": (2, 2, 2, 29, 5, 16, 8, False, None, False),
    "gqa": (2, 6, 2, 21, 4, 8, 4, True, None, False),
    "mqa-not-causal": (1, 4, 1, 13, 6, 4, 8, False, None, False),
    "padded": (3, 2, 2, 19, 4, 8, 4, True, None, True),
    "padded-not-causal": (3, 2, 1, 11, 4, 4, 4, False, None, True),
    "window": (2, 2, 1, 41, 4, 8, 8, True, 9, False),
    "window-uneven-blocks": (1, 2, 2, 30, 4, 4, 16, True, 5, False),
    "window-padded": (3, 2, 2, 17, 4, 4, 4, True, 3, True),
    "T-1": (1, 1, 1, 1, 3, 64, 64, True, None, False),
    "block-larger-than-T": (2, 2, 2, 9, 8, 64, 64, True, None, False),
}


def _pad(b: int, t: int) -> torch.Tensor:
    """(B, T) attention mask: row 0 padded on the right, row 1 on the left, the others full."""
    mask = torch.ones(b, t, dtype=torch.long)
    mask[0, t - t // 3 :] = 0
    if b > 1:
        mask[1, : t // 4 + 1] = 0
    return mask


def _boolean_mask(t: int, causal: bool, window: int | None, attention_mask: torch.Tensor | None) -> torch.Tensor | None:
    """The same rule as a (.., T, T) boolean mask for SDPA, built from lesson 02's and 10's masks."""
    if attention_mask is not None:
        mask = padding_mask(attention_mask) if causal else (attention_mask.bool()[:, None, None, :] |
                                                           torch.eye(t, dtype=torch.bool))
    else:
        mask = causal_mask(t) if causal else None
    if window is not None:
        mask = mask & ~causal_mask(t).tril(diagonal=-window)  # key j is out when j <= i - W
    return mask


def _inputs(case: tuple, dtype: torch.dtype = torch.float32, seed: int = 0) -> tuple:
    b, h, h_kv, t, d, *_ = case
    gen = torch.Generator().manual_seed(seed)
    q, k, v = (torch.randn(b, n, t, d, generator=gen, dtype=dtype).requires_grad_() for n in (h, h_kv, h_kv))
    return q, k, v


@pytest.mark.parametrize("name", sorted(CASES))
def test_equals_sdpa_in_output_and_gradients(name):
    b, h, h_kv, t, _, block_q, block_k, causal, window, padded = CASES[name]
    q, k, v = _inputs(CASES[name])
    attention_mask = _pad(b, t) if padded else None
    got = flash_attention(q, k, v, causal=causal, block_q=block_q, block_k=block_k, window=window,
                          attention_mask=attention_mask)
    want = F.scaled_dot_product_attention(q, k, v, attn_mask=_boolean_mask(t, causal, window, attention_mask),
                                          enable_gqa=h != h_kv)
    torch.testing.assert_close(got, want, atol=1e-5, rtol=0)
    grad_out = torch.randn_like(want)
    for ours, theirs, name_ in zip(torch.autograd.grad(got, (q, k, v), grad_out),
                                   torch.autograd.grad(want, (q, k, v), grad_out), "qkv", strict=True):
        torch.testing.assert_close(ours, theirs, atol=1e-5, rtol=0, msg=lambda m, n=name_: f"d{n}: {m}")


def test_queries_after_cached_keys_equal_sdpa():
    """Fewer queries than keys: the queries are the last positions, as with a KV cache (causal_mask's rule)."""
    gen = torch.Generator().manual_seed(1)
    q, k, v = torch.randn(1, 2, 5, 4, generator=gen), torch.randn(1, 2, 12, 4, generator=gen), \
        torch.randn(1, 2, 12, 4, generator=gen)
    got = flash_attention(q, k, v, block_q=2, block_k=3)
    torch.testing.assert_close(got, F.scaled_dot_product_attention(q, k, v, attn_mask=causal_mask(5, 12)),
                               atol=1e-5, rtol=0)


@pytest.mark.parametrize("case", [(1, 2, 1, 7, 3, 4, 2, True, None, False), (2, 1, 1, 6, 2, 2, 4, False, None, False),
                                  (2, 2, 2, 7, 3, 4, 2, True, 3, True)], ids=["gqa", "not-causal", "window-padded"])
def test_gradcheck_in_float64(case):
    b, _, _, t, _, block_q, block_k, causal, window, padded = case
    attention_mask = _pad(b, t) if padded else None
    assert torch.autograd.gradcheck(
        lambda q, k, v: flash_attention(q, k, v, causal=causal, block_q=block_q, block_k=block_k, window=window,
                                        attention_mask=attention_mask), _inputs(case, torch.float64))


@pytest.mark.parametrize("seed", range(5))
def test_online_softmax_equals_softmax_for_any_split(seed):
    gen = torch.Generator().manual_seed(seed)
    t_k = int(torch.randint(1, 40, (), generator=gen))
    scores = 8 * torch.randn(3, 5, t_k, generator=gen)  # (B, T_q, T_k), spread wide so the max moves
    scores[0, 0, : t_k // 2] = float("-inf")  # a row that begins masked: its first blocks hold nothing
    v = torch.randn(3, t_k, 6, generator=gen)  # (B, T_k, D)
    cuts = sorted(torch.randperm(t_k - 1, generator=gen)[: int(torch.randint(0, t_k, (), generator=gen))] + 1)
    bounds = [0, *[int(c) for c in cuts], t_k]
    m, denom, o = torch.full((3, 5), float("-inf")), torch.zeros(3, 5), torch.zeros(3, 5, 6)
    for k0, k1 in itertools.pairwise(bounds):
        m, denom, o = online_softmax(m, denom, o, scores[..., k0:k1], v[:, k0:k1])
    torch.testing.assert_close(o / denom[..., None], scores.softmax(dim=-1) @ v, atol=1e-6, rtol=0)
    torch.testing.assert_close(m + denom.log(), scores.logsumexp(dim=-1), atol=1e-6, rtol=0)


class _Ops(TorchDispatchMode):
    """Records every aten op run and the shape of what it returns."""

    def __init__(self) -> None:
        super().__init__()
        self.ops: list[tuple[str, tuple[int, ...]]] = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        for value in out if isinstance(out, (tuple, list)) else (out,):
            if isinstance(value, torch.Tensor):
                self.ops.append((func.overloadpacket.__name__, tuple(value.shape)))
        return out


def test_no_tensor_of_size_t_by_t_is_computed_or_saved():
    """T = 128 with blocks of 16: every tensor the forward or the backward makes, and every tensor saved for the
    backward, is at most one (16, 16) tile of scores or one (T, D) input per head; (T, T) would be 64 times that."""
    b, h, t, d, block = 2, 3, 128, 4, 16
    q, k, v = _inputs((b, h, h, t, d))
    saved: list[tuple[int, ...]] = []
    with torch.autograd.graph.saved_tensors_hooks(lambda x: saved.append(tuple(x.shape)) or x, lambda x: x), \
            _Ops() as ops:
        out = flash_attention(q, k, v, block_q=block, block_k=block)
        out.sum().backward()
    largest = b * h * max(block * block, t * d)
    assert ops.ops and max(torch.Size(s).numel() for _, s in ops.ops) <= largest
    assert saved and max(torch.Size(s).numel() for s in saved) <= largest
    assert not any(s[-2:] == (t, t) for _, s in ops.ops)


@pytest.mark.parametrize(("t_q", "t_k", "block_q", "block_k", "causal", "window"), [
    (37, 37, 8, 16, True, None), (32, 32, 8, 8, True, None), (30, 30, 4, 16, True, 5), (41, 41, 8, 8, True, 9),
    (5, 12, 2, 3, True, None), (13, 13, 4, 8, False, None), (16, 16, 16, 16, True, None),
])
def test_exactly_the_tiles_the_mask_leaves_something_in_are_computed(t_q, t_k, block_q, block_k, causal, window):
    """The tiles are those where the mask has a True (computed the slow, obvious way), and the forward multiplies
    q by k and p by v once for each of them: 2 matrix products a tile, none for the tiles it skips."""
    allowed = causal_mask(t_q, t_k) if causal else torch.ones(t_q, t_k, dtype=torch.bool)
    if window is not None:
        allowed = allowed & ~causal_mask(t_q, t_k).tril(diagonal=t_k - t_q - window)
    want = [(q0, min(q0 + block_q, t_q), k0, min(k0 + block_k, t_k))
            for q0 in range(0, t_q, block_q) for k0 in range(0, t_k, block_k)
            if allowed[q0 : q0 + block_q, k0 : k0 + block_k].any()]
    assert computed_tiles(t_q, t_k, block_q, block_k, causal, window) == want
    q, k, v = torch.randn(1, 2, t_q, 4), torch.randn(1, 2, t_k, 4), torch.randn(1, 2, t_k, 4)
    with torch.no_grad(), _Ops() as ops:
        flash_attention(q, k, v, causal=causal, block_q=block_q, block_k=block_k, window=window)
    assert sum(name in ("bmm", "mm") for name, _ in ops.ops) == 2 * len(want)


def test_causal_square_blocks_compute_the_lower_triangle_of_tiles():
    n = 8  # blocks of 16 over T = 128: the diagonal and below, n (n + 1) / 2 of the n^2 tiles
    assert len(computed_tiles(128, 128, 16, 16)) == n * (n + 1) // 2 == 36


def test_bfloat16_gradients_are_as_accurate_as_sdpas():
    """bfloat16 q, k, v: the output and dq, dk, dv, against float64 attention on the same (rounded) values, are
    within SDPA's own bfloat16 error (ours is kept in float32, as a GPU kernel keeps m, the denominator, o and L; with
    that state in bfloat16 the gradients' errors were 3-5 times SDPA's). The output comes back in bfloat16, L in
    float32."""
    gen = torch.Generator().manual_seed(0)
    q, k, v, grad_out = (torch.randn(1, 2, 256, 64, generator=gen).bfloat16() for _ in range(4))  # (B, H, T, D)
    exact = [x.double().requires_grad_() for x in (q, k, v)]
    want = F.scaled_dot_product_attention(*exact, is_causal=True)
    want_grads = torch.autograd.grad(want, exact, grad_out.double())
    errors = {}
    for name, fn in (("ours", lambda *x: flash_attention(*x, block_q=64, block_k=64)),
                     ("sdpa", lambda *x: F.scaled_dot_product_attention(*x, is_causal=True))):
        inputs = [x.clone().requires_grad_() for x in (q, k, v)]
        got = fn(*inputs)
        assert got.dtype == torch.bfloat16
        grads = torch.autograd.grad(got, inputs, grad_out)
        errors[name] = [float((a.double() - b).norm() / b.norm())
                        for a, b in zip((got.detach(), *grads), (want.detach(), *want_grads), strict=True)]
    for what, ours, sdpa in zip(("out", "dq", "dk", "dv"), errors["ours"], errors["sdpa"], strict=True):
        assert ours <= 1.25 * sdpa, f"{what}: relative error {ours:.2e} in bfloat16, SDPA's {sdpa:.2e}"
    assert flash_forward(q, k, v)[1].dtype == torch.float32


@pytest.mark.parametrize(("kwargs", "says"), [
    ({"q": (2, 4, 5, 8), "k": (2, 3, 5, 8)}, "H_kv must divide H"),
    ({"q": (2, 4, 5, 8), "k": (2, 4, 5, 6)}, "head width must agree"),
    ({"q": (4, 5, 8), "k": (4, 5, 8)}, "must be (B, H, T, D)"),
    ({"block_q": 0}, "positive ints"),
    ({"window": 3, "causal": False}, "needs causal=True"),
    ({"attention_mask": torch.ones(2, 4)}, "attention_mask must have shape (B, T) = (2, 5)"),
    ({"q": (2, 4, 6, 8)}, "more queries than keys"),
])
def test_bad_input_says_what_was_expected(kwargs, says):
    q, k = kwargs.pop("q", (2, 4, 5, 8)), kwargs.pop("k", (2, 4, 5, 8))
    with pytest.raises(ValueError, match=None) as error:
        flash_attention(torch.randn(q), torch.randn(k), torch.randn(k), **kwargs)
    assert says in str(error.value)
