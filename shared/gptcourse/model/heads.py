"""Heads on top of `GPT.forward_hidden`: the same backbone, a different output.

A value head (used by PPO) predicts a scalar per position; a reward model scores a whole sequence with the
hidden state of its last token.
"""

from __future__ import annotations

import torch
from torch import nn

from .gpt import GPT


class ValueHead(nn.Module):
    """GPT backbone + Linear(C -> 1): one value per position, (B, T)."""

    def __init__(self, backbone: GPT) -> None:
        super().__init__()
        self.backbone = backbone
        self.head = nn.Linear(backbone.config.d_model, 1)

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        return self.head(self.backbone.forward_hidden(idx)).squeeze(-1)  # (B, T, 1) -> (B, T)


class RewardModel(ValueHead):
    """A value head read only at the last token: one reward per sequence, (B,)."""

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        return super().forward(idx)[:, -1]  # (B,)
