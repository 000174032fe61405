"""The pieces lesson 09 writes by hand, each against torch's own: cross_entropy vs F.cross_entropy (also at
logits x1000, where the naive formula overflows), AdamW vs torch.optim.AdamW over 1000 steps for several
hyper-parameters, clip_grad_norm vs torch.nn.utils.clip_grad_norm_."""

from __future__ import annotations

import copy

import pytest
import torch
from torch.nn import functional as F

from gptcourse import AdamW, clip_grad_norm, cross_entropy


@pytest.mark.parametrize("scale", [1.0, 1000.0])
def test_cross_entropy_matches_torch_and_survives_large_logits(scale):
    gen = torch.Generator().manual_seed(0)
    logits = (torch.randn(3, 5, 11, generator=gen) * scale).requires_grad_()  # (B, T, V)
    targets = torch.randint(0, 11, (3, 5), generator=gen)
    targets[0, 2] = targets[2, 4] = -100
    ours = cross_entropy(logits, targets)
    theirs = F.cross_entropy(logits.flatten(0, 1), targets.flatten())
    assert torch.isfinite(ours)
    assert torch.allclose(ours, theirs, rtol=1e-6, atol=1e-6 * scale)
    (g_ours,) = torch.autograd.grad(ours, logits)
    (g_theirs,) = torch.autograd.grad(theirs, logits)
    assert torch.allclose(g_ours, g_theirs, atol=1e-7)
    naive = -(logits.exp() / logits.exp().sum(-1, keepdim=True)).log().gather(-1, targets.clamp(min=0)[..., None])
    assert torch.isfinite(naive).all() == (scale == 1.0)  # the overflow the log-sum-exp shift avoids


def test_cross_entropy_says_which_shapes_it_wants():
    with pytest.raises(ValueError, match=r"need targets of shape \(4,\)"):
        cross_entropy(torch.zeros(4, 7), torch.zeros(4, 1, dtype=torch.long))


def _tiny_models() -> tuple[torch.nn.Module, torch.nn.Module]:
    """A small next-token model (embedding, norm, MLP: matrices, gains and biases), cheap enough for 1000 steps."""
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Embedding(20, 16), torch.nn.LayerNorm(16), torch.nn.Linear(16, 32),
                                torch.nn.GELU(), torch.nn.Linear(32, 20))
    return model, copy.deepcopy(model)


HYPER_PARAMETERS = [(1e-3, (0.9, 0.999), 1e-8, 0.01), (3e-3, (0.8, 0.95), 1e-6, 0.1), (1e-2, (0.0, 0.99), 1e-8, 0.0)]


@pytest.mark.parametrize(("lr", "betas", "eps", "weight_decay"), HYPER_PARAMETERS)
def test_adamw_equals_torch_after_1000_steps(lr, betas, eps, weight_decay):
    ours_model, torch_model = _tiny_models()
    decay = [p for p in ours_model.parameters() if p.dim() >= 2]
    other = [p for p in ours_model.parameters() if p.dim() < 2]
    ours = AdamW([{"params": decay}, {"params": other, "weight_decay": 0.0}], lr=lr, betas=betas, eps=eps,
                 weight_decay=weight_decay)
    decay_t = [p for p in torch_model.parameters() if p.dim() >= 2]
    other_t = [p for p in torch_model.parameters() if p.dim() < 2]
    theirs = torch.optim.AdamW([{"params": decay_t}, {"params": other_t, "weight_decay": 0.0}], lr=lr, betas=betas,
                               eps=eps, weight_decay=weight_decay, foreach=False)
    gen = torch.Generator().manual_seed(1)
    for _ in range(1000):
        x, y = torch.randint(0, 20, (2, 4, 8), generator=gen)  # (B, T) each
        for model, optimizer in ((ours_model, ours), (torch_model, theirs)):
            optimizer.zero_grad()
            F.cross_entropy(model(x).flatten(0, 1), y.flatten()).backward()  # (B*T, V) vs (B*T,)
            optimizer.step()
    for (name, p), q in zip(ours_model.named_parameters(), torch_model.parameters(), strict=True):
        assert torch.allclose(p, q, rtol=0, atol=1e-6), f"{name}: {(p - q).abs().max():.2e}"


def test_adamw_state_round_trips_and_bad_arguments_are_refused():
    model, _ = _tiny_models()
    optimizer = AdamW(model.parameters(), lr=1e-3)
    model(torch.zeros(1, 4, dtype=torch.long)).sum().backward()
    optimizer.step()
    state = optimizer.state_dict()
    assert {s["step"] for s in state["state"].values()} == {1}
    fresh = AdamW(model.parameters(), lr=1e-3)
    fresh.load_state_dict(state)
    assert all(torch.equal(fresh.state[p]["exp_avg"], optimizer.state[p]["exp_avg"]) for p in model.parameters())
    with pytest.raises(ValueError, match=r"betas must each be in \[0, 1\)"):
        AdamW(model.parameters(), betas=(0.9, 1.0))


@pytest.mark.parametrize("max_norm", [0.1, 1e3])
def test_clip_grad_norm_matches_torch(max_norm):
    gen = torch.Generator().manual_seed(0)
    shapes = [(3, 4), (5,), (2, 2, 2)]
    ours = [torch.zeros(s, requires_grad=True) for s in shapes]
    theirs = [torch.zeros(s, requires_grad=True) for s in shapes]
    for a, b in zip(ours, theirs, strict=True):
        a.grad = torch.randn(a.shape, generator=gen)
        b.grad = a.grad.clone()
    norm = clip_grad_norm(ours, max_norm)
    expected = torch.nn.utils.clip_grad_norm_(theirs, max_norm)
    assert torch.allclose(norm, expected)
    for a, b in zip(ours, theirs, strict=True):
        assert torch.allclose(a.grad, b.grad, rtol=1e-6, atol=0)
    total = torch.linalg.vector_norm(torch.cat([a.grad.flatten() for a in ours]))
    assert total <= max_norm * (1 + 1e-5) if max_norm < 1 else torch.isclose(total, norm)
