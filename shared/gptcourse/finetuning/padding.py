"""Batches of sequences of different lengths: padded to the longest, with a mask that says which tokens are real."""

from __future__ import annotations

from collections.abc import Sequence

import torch


def pad_batch(sequences: Sequence[Sequence[int]], pad_id: int = 0,
              side: str = "right") -> tuple[torch.Tensor, torch.Tensor]:
    """Token id lists -> ids (B, T) and attention_mask (B, T) (1 real, 0 pad), T the longest length, padded with
    `pad_id` on the "right" (after each sequence) or the "left" (before it, as for generation)."""
    if side not in ("left", "right"):
        raise ValueError(f"side must be 'left' or 'right', got {side!r}")
    if not sequences or any(len(s) == 0 for s in sequences):
        raise ValueError("pad_batch needs at least one sequence, and no empty ones")
    t = max(len(s) for s in sequences)
    ids = torch.full((len(sequences), t), pad_id, dtype=torch.long)
    mask = torch.zeros(len(sequences), t, dtype=torch.long)
    for row, seq in enumerate(sequences):
        span = slice(0, len(seq)) if side == "right" else slice(t - len(seq), t)
        ids[row, span] = torch.as_tensor(list(seq), dtype=torch.long)
        mask[row, span] = 1
    return ids, mask
