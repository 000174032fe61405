"""Heads on top of `GPT.forward_hidden`: the same backbone, a different output.

A sequence classifier and a reward model score a whole sequence with the hidden state of its last *real* token
(the only one that has seen every other token); a value head (used by PPO) predicts a scalar per position. Each
takes `attention_mask` (B, T), 1 for real tokens and 0 for pads (None: no padding), as `GPT.forward` does. In a
right-padded batch position -1 is a pad for every sequence but the longest, so reading it gives wrong scores.
"""

from __future__ import annotations

import torch
from torch import nn

from .gpt import GPT


def last_real_token(hidden: torch.Tensor, attention_mask: torch.Tensor | None = None) -> torch.Tensor:
    """hidden (B, T, C) -> (B, C): each sequence's state at its last real token (the last 1 in its mask row).

    The rightmost 1, not `mask.sum() - 1`: that is the last real index only when padding is on the right.
    """
    if attention_mask is None:
        return hidden[:, -1]  # (B, C)
    t = hidden.size(1)
    last = (torch.arange(t, device=hidden.device) * attention_mask.long()).argmax(dim=-1)  # (B,)
    return hidden[torch.arange(hidden.size(0), device=hidden.device), last]  # (B, C)


class SequenceClassifier(nn.Module):
    """GPT backbone + Linear(C -> n_classes, no bias, as GPT-2's) on the last real token: logits (B, n_classes)."""

    def __init__(self, backbone: GPT, n_classes: int) -> None:
        super().__init__()
        if not isinstance(n_classes, int) or n_classes < 1:
            raise ValueError(f"n_classes must be a positive int, got {n_classes!r}")
        self.backbone = backbone
        self.head = nn.Linear(backbone.config.d_model, n_classes, bias=False)

    def forward(self, idx: torch.Tensor, attention_mask: torch.Tensor | None = None) -> torch.Tensor:
        hidden = self.backbone.forward_hidden(idx, attention_mask=attention_mask)  # (B, T, C)
        return self.head(last_real_token(hidden, attention_mask))  # (B, n_classes)


class RewardModel(SequenceClassifier):
    """A one-class sequence classifier: one reward per sequence, (B,). Trained on pairs with
    `bradley_terry_loss`, which sees only differences of rewards, so a bias would learn nothing."""

    def __init__(self, backbone: GPT) -> None:
        super().__init__(backbone, 1)

    def forward(self, idx: torch.Tensor, attention_mask: torch.Tensor | None = None) -> torch.Tensor:
        return super().forward(idx, attention_mask).squeeze(-1)  # (B, 1) -> (B,)


class ValueHead(nn.Module):
    """GPT backbone + Linear(C -> 1): one value per position, (B, T), 0 at pads."""

    def __init__(self, backbone: GPT) -> None:
        super().__init__()
        self.backbone = backbone
        self.head = nn.Linear(backbone.config.d_model, 1)

    def forward(self, idx: torch.Tensor, attention_mask: torch.Tensor | None = None) -> torch.Tensor:
        hidden = self.backbone.forward_hidden(idx, attention_mask=attention_mask)  # (B, T, C)
        values = self.head(hidden).squeeze(-1)  # (B, T, 1) -> (B, T)
        return values if attention_mask is None else values * attention_mask.to(values.dtype)
