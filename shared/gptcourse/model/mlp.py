"""The position-wise feed-forward network: ReLU/GELU MLPs and SwiGLU."""

from __future__ import annotations

import torch
from torch import nn
from torch.nn import functional as F

ACTIVATIONS = {
    "relu": F.relu,
    "gelu": F.gelu,
    "gelu_tanh": lambda x: F.gelu(x, approximate="tanh"),  # GPT-2's "gelu_new"
}


class MLP(nn.Module):
    """MLP(x) = W_out act(W_in x + b_in) + b_out, expanding C -> d_ff -> C."""

    def __init__(self, d: int, d_ff: int, activation: str = "gelu", bias: bool = True) -> None:
        super().__init__()
        if activation not in ACTIVATIONS:
            raise ValueError(f"unknown activation {activation!r}; expected one of {sorted(ACTIVATIONS)}")
        self.activation = activation
        self.fc_in = nn.Linear(d, d_ff, bias=bias)
        self.fc_out = nn.Linear(d_ff, d, bias=bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc_out(ACTIVATIONS[self.activation](self.fc_in(x)))  # (B, T, C)


class SwiGLU(nn.Module):
    """SwiGLU(x) = W_out (silu(x W_gate) * (x W_value)).

    The gate and value projections are stored as one fused (C -> 2 d_ff) matrix, as in the seed's code:
    its parameter count is C x 2 d_ff, which for the seed's d_ff = 2C is 4C^2 (not the 2C^2 its table says).
    """

    def __init__(self, d: int, d_ff: int, bias: bool = False) -> None:
        super().__init__()
        self.w_in = nn.Linear(d, 2 * d_ff, bias=bias)
        self.w_out = nn.Linear(d_ff, d, bias=bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        gate, value = self.w_in(x).chunk(2, dim=-1)  # each (B, T, d_ff)
        return self.w_out(F.silu(gate) * value)  # (B, T, C)


def make_mlp(kind: str, d: int, d_ff: int, bias: bool) -> nn.Module:
    """The feed-forward network a `GPTConfig.mlp` names."""
    if kind == "swiglu":
        return SwiGLU(d, d_ff, bias)
    return MLP(d, d_ff, kind, bias)
