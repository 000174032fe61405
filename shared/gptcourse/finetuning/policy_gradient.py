"""REINFORCE on sampled sequences: raise the log-probability of each sample in proportion to how much better than
a baseline it scored.

The gradient of the expected reward is E[(R - b) grad log p(y)] for any baseline b that does not depend on the
sample y (E[grad log p(y)] = 0), so the loss below, whose gradient is minus that average over the samples, is an
unbiased estimate with such a baseline; a good one only lowers its variance. The default baseline, the batch's own
mean reward, includes each sample's reward, so its estimate is shrunk: its mean is (B - 1) / B times the gradient.
"""

from __future__ import annotations

import torch


def policy_gradient_loss(logprobs: torch.Tensor, rewards: torch.Tensor, mask: torch.Tensor,
                         baseline: torch.Tensor | float | None = None) -> torch.Tensor:
    """REINFORCE's loss -mean_i (R_i - b) log p(y_i), from the per-token log-probabilities (B, T) of B sampled
    sequences under the policy, their rewards (B,) and the mask (B, T) of their real (non-padding) tokens.
    `baseline`: a number or (B,) tensor, treated as a constant; None uses the batch's mean reward (biased by the
    factor (B - 1) / B: see the module's docstring)."""
    if logprobs.dim() != 2 or mask.shape != logprobs.shape or rewards.shape != logprobs.shape[:1]:
        raise ValueError(f"expected logprobs and mask (B, T) and rewards (B,), got {tuple(logprobs.shape)}, "
                         f"{tuple(mask.shape)} and {tuple(rewards.shape)}")
    rewards = rewards.detach().to(logprobs.dtype)
    baseline = rewards.mean() if baseline is None else torch.as_tensor(baseline, dtype=logprobs.dtype).detach()
    sequence_logprobs = (logprobs * mask).sum(-1)  # (B,): log p(y_i), padding left out
    return -((rewards - baseline) * sequence_logprobs).mean()
