"""LayerNorm and RMSNorm, each applied to every token vector over its C features."""

from __future__ import annotations

import torch
from torch import nn


class LayerNorm(nn.Module):
    """LN(x) = gamma * (x - mean) / sqrt(var + eps) + beta, statistics over the last axis."""

    def __init__(self, d: int, eps: float = 1e-5, bias: bool = True) -> None:
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(d))
        self.bias = nn.Parameter(torch.zeros(d)) if bias else None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        # The fused kernel computes exactly the formula above (biased variance), in one pass.
        return nn.functional.layer_norm(x, x.shape[-1:], self.weight, self.bias, self.eps)


class RMSNorm(nn.Module):
    """RMSNorm(x) = gamma * x / sqrt(mean(x^2) + eps): no mean subtraction and no beta."""

    def __init__(self, d: int, eps: float = 1e-6) -> None:
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(d))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        rms_inv = torch.rsqrt(x.pow(2).mean(dim=-1, keepdim=True) + self.eps)  # (B, T, 1)
        return x * rms_inv * self.weight


def make_norm(kind: str, d: int, eps: float, bias: bool = True) -> nn.Module:
    """The norm a `GPTConfig.norm` names."""
    if kind == "layernorm":
        return LayerNorm(d, eps, bias)
    if kind == "rmsnorm":
        return RMSNorm(d, eps)
    raise ValueError(f"unknown norm {kind!r}; expected 'layernorm' or 'rmsnorm'")
