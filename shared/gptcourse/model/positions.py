"""Position information: a learned absolute table (GPT-2) or rotary embeddings, RoPE (Llama).

Attention alone is permutation-equivariant: without one of these, a model only knows order through the causal
mask. A learned table adds a vector per position to the token embeddings; RoPE rotates q and k inside attention
by an angle proportional to the position, so their dot product depends only on the *relative* position.
"""

from __future__ import annotations

import torch
from torch import nn
from torch.nn import functional as F


class LearnedPositions(nn.Module):
    """E_pos, a (T_max, C) table: row t is added to the embedding of the token at position t."""

    def __init__(self, context_length: int, d: int) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.randn(context_length, d) * 0.02)

    def forward(self, positions: torch.Tensor) -> torch.Tensor:
        # F.embedding, not self.weight[positions]: on a CPU with several threads, indexing's backward adds the
        # rows of repeated positions (a padded batch's (B, T) positions) in whatever order the threads finish, so
        # training would not repeat itself run to run; the embedding's backward adds them in a fixed order.
        return F.embedding(positions, self.weight)  # (T, C) or (B, T, C)


Rope = tuple[torch.Tensor, torch.Tensor]  # (cos, sin), each (T, D): what RotaryEmbedding gives for T positions


class RotaryEmbedding(nn.Module):
    """Precomputed cos/sin tables for RoPE; no parameters.

    Uses the "rotate half" layout of GPT-NeoX and Hugging Face Llama: feature i is paired with feature
    i + D/2 and the pair is rotated by angle t * theta^(-2i/D).
    """

    def __init__(self, d_head: int, context_length: int, theta: float = 10000.0) -> None:
        super().__init__()
        if d_head % 2:
            raise ValueError(f"RoPE needs an even head width, got d_head={d_head}")
        inv_freq = theta ** (-torch.arange(0, d_head, 2, dtype=torch.float64) / d_head)  # (D/2,)
        angles = torch.outer(torch.arange(context_length, dtype=torch.float64), inv_freq)  # (T_max, D/2)
        angles = torch.cat([angles, angles], dim=-1)  # (T_max, D)
        self.register_buffer("cos", angles.cos().float(), persistent=False)
        self.register_buffer("sin", angles.sin().float(), persistent=False)

    def forward(self, positions: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return self.cos[positions], self.sin[positions]  # each (T, D)


def rotate_half(x: torch.Tensor) -> torch.Tensor:
    x1, x2 = x.chunk(2, dim=-1)
    return torch.cat([-x2, x1], dim=-1)


def apply_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotate q or k, shape (B, H, T, D), by the angles of its positions; cos/sin are (T, D)."""
    return x * cos + rotate_half(x) * sin
