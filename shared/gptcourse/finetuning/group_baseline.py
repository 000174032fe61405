"""GRPO's baseline: each answer's reward against the other answers to the same prompt, in place of PPO's learned
value model (Shao et al. 2024, DeepSeekMath).

The rewards come group by group, `group_size` consecutive answers per prompt. An answer's advantage is its reward
minus its group's mean, divided by the group's standard deviation (Bessel-corrected, as TRL's `nanstd`) plus `eps`
when `scale`. A group whose answers all score the same teaches nothing: its advantages are exactly zero.
"""

from __future__ import annotations

import torch


def group_advantages(rewards: torch.Tensor, group_size: int, scale: bool = True, eps: float = 1e-4) -> torch.Tensor:
    """The advantages (N,) of N = prompts x group_size rewards (N,) laid out group by group. `eps` (TRL's 1e-4)
    keeps a group of nearly equal rewards from blowing up; a group of one has advantage zero."""
    if rewards.dim() != 1 or group_size < 1 or rewards.numel() % group_size:
        raise ValueError(f"expected rewards (N,) with N a multiple of group_size, got shape {tuple(rewards.shape)} "
                         f"and group_size={group_size!r}")
    groups = rewards.view(-1, group_size)  # (P, G): one row per prompt
    advantages = groups - groups.mean(dim=1, keepdim=True)  # (P, G)
    if scale and group_size > 1:
        advantages = advantages / (groups.std(dim=1, keepdim=True) + eps)  # std: Bessel-corrected
    return advantages.reshape(-1)  # (N,)
