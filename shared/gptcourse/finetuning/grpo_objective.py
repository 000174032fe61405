"""GRPO's loss (Shao et al. 2024): PPO's clipped importance-ratio surrogate on group advantages, plus beta times
the k3 KL to a frozen reference, aggregated over tokens as TRL's `loss_type` names it.

Per token: ratio = exp(logp - old_logp); loss = -min(ratio A, clip(ratio, 1 - eps, 1 + eps) A) + beta k3. Then
`grpo`: each sequence's mean, then the mean over sequences (a long answer's tokens weigh less: Dr. GRPO's length
bias); `bnpo`: the sum over the batch's real tokens / their number; `dr_grpo`: the sum / (B x
max_completion_length); `dapo`: the sum / the real tokens of the whole generation batch (`num_items_in_batch`).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from .kl_estimators import kl_k3

LOSS_TYPES = ("grpo", "bnpo", "dr_grpo", "dapo")


@dataclass(frozen=True)
class GRPOStats:
    """Logged quantities, floats over the real tokens: the share clipped (ratio past 1 +- eps on the side the
    advantage pushes), the mean k3 KL to the reference, the mean importance ratio."""

    clip_fraction: float
    kl: float
    ratio: float


def grpo_loss(logprobs: torch.Tensor, old_logprobs: torch.Tensor, ref_logprobs: torch.Tensor,
              advantages: torch.Tensor, mask: torch.Tensor, clip_eps: float, beta: float, loss_type: str = "grpo",
              max_completion_length: int | None = None,
              num_items_in_batch: float | None = None) -> tuple[torch.Tensor, GRPOStats]:
    """The loss (a scalar) and its `GRPOStats` from per-token log-probabilities (B, T) under the policy, the
    policy that sampled (old) and the reference, advantages (B,) and the mask (B, T) of real tokens."""
    if loss_type not in LOSS_TYPES:
        raise ValueError(f"loss_type must be one of {LOSS_TYPES}, got {loss_type!r}")
    if loss_type == "dr_grpo" and max_completion_length is None:
        raise ValueError("loss_type='dr_grpo' divides by B x max_completion_length: pass max_completion_length")
    shapes = {tuple(t.shape) for t in (logprobs, old_logprobs, ref_logprobs, mask)}
    if len(shapes) != 1 or logprobs.dim() != 2 or advantages.shape != logprobs.shape[:1]:
        raise ValueError(f"expected four (B, T) tensors and advantages (B,), got {sorted(shapes)} and "
                         f"{tuple(advantages.shape)}")
    mask = mask.to(logprobs.dtype)
    adv = advantages.detach().unsqueeze(1)  # (B, 1)
    ratio = torch.exp(logprobs - old_logprobs.detach())  # (B, T)
    clipped = torch.clamp(ratio, 1 - clip_eps, 1 + clip_eps)
    per_token = -torch.min(ratio * adv, clipped * adv)  # (B, T)
    kl = kl_k3(logprobs, ref_logprobs)  # (B, T)
    if beta != 0.0:
        per_token = per_token + beta * kl
    total = (per_token * mask).sum()
    n_tokens = mask.sum().clamp(min=1.0)
    if loss_type == "grpo":
        loss = ((per_token * mask).sum(-1) / mask.sum(-1).clamp(min=1.0)).mean()
    elif loss_type == "bnpo":
        loss = total / n_tokens
    elif loss_type == "dr_grpo":
        loss = total / (logprobs.shape[0] * max_completion_length)
    else:  # dapo
        loss = total / (n_tokens if num_items_in_batch is None else max(float(num_items_in_batch), 1.0))
    was_clipped = ((ratio < 1 - clip_eps) & (adv < 0)) | ((ratio > 1 + clip_eps) & (adv > 0))  # (B, T)
    stats = GRPOStats(clip_fraction=float((was_clipped * mask).sum() / n_tokens),
                      kl=float((kl.detach() * mask).sum() / n_tokens),
                      ratio=float((ratio.detach() * mask).sum() / n_tokens))
    return loss, stats
