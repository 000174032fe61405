"""Norms and MLPs against torch's own modules and formulas written independently here."""

import pytest
import torch
from torch import nn

from gptcourse import MLP, LayerNorm, RMSNorm, SwiGLU


def test_rmsnorm_matches_torch():
    torch.manual_seed(0)
    x = torch.randn(2, 16, 512)
    ours, theirs = RMSNorm(512, eps=1e-6), nn.RMSNorm(512, eps=1e-6)
    with torch.no_grad():
        ours.weight.copy_(torch.randn(512))
        theirs.weight.copy_(ours.weight)
    assert (ours(x) - theirs(x)).abs().max() < 1e-6


@pytest.mark.parametrize("bias", [True, False])
def test_layernorm_matches_torch(bias):
    torch.manual_seed(0)
    x = torch.randn(2, 16, 64) * 3 + 1
    ours, theirs = LayerNorm(64, eps=1e-5, bias=bias), nn.LayerNorm(64, eps=1e-5, bias=bias)
    with torch.no_grad():
        ours.weight.copy_(torch.randn(64))
        theirs.weight.copy_(ours.weight)
        if bias:
            ours.bias.copy_(torch.randn(64))
            theirs.bias.copy_(ours.bias)
    assert (ours(x) - theirs(x)).abs().max() < 1e-5


@pytest.mark.parametrize(("activation", "reference"), [
    ("relu", nn.ReLU()), ("gelu", nn.GELU()), ("gelu_tanh", nn.GELU(approximate="tanh")),
])
def test_mlp_matches_sequential(activation, reference):
    torch.manual_seed(0)
    mlp = MLP(16, 40, activation)
    seq = nn.Sequential(mlp.fc_in, reference, mlp.fc_out)
    x = torch.randn(3, 5, 16)
    assert torch.allclose(mlp(x), seq(x), atol=1e-6)


def test_gelu_variants_differ():
    x = torch.linspace(-3, 3, 101)
    exact, approx = MLP(1, 1, "gelu"), MLP(1, 1, "gelu_tanh")
    for m in (exact, approx):
        with torch.no_grad():
            m.fc_in.weight.fill_(1.0), m.fc_in.bias.zero_(), m.fc_out.weight.fill_(1.0), m.fc_out.bias.zero_()
    diff = (exact(x[:, None]) - approx(x[:, None])).abs().max()
    assert 1e-5 < diff < 1e-2


def test_swiglu_formula_and_sizes():
    torch.manual_seed(0)
    d, d_ff = 32, 64
    swiglu = SwiGLU(d, d_ff)
    assert swiglu.w_in.weight.shape == (2 * d_ff, d)  # the seed's fused d x 4d projection
    assert swiglu.w_out.weight.shape == (d, d_ff)
    x = torch.randn(2, 5, d)
    w_gate, w_value = swiglu.w_in.weight[:d_ff], swiglu.w_in.weight[d_ff:]
    gate, value = x @ w_gate.T, x @ w_value.T
    expected = (gate * torch.sigmoid(gate) * value) @ swiglu.w_out.weight.T
    assert torch.allclose(swiglu(x), expected, atol=1e-6)


def test_unknown_activation():
    with pytest.raises(ValueError, match="unknown activation 'tanh'"):
        MLP(4, 8, "tanh")
