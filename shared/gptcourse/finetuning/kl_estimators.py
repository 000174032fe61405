"""Schulman's k3 estimator of KL(policy || reference) from samples of the policy (http://joschu.net/blog/kl-approx.html).

With r = log ref(y) - log policy(y) for y drawn from the policy, E[exp(r)] = 1, so exp(r) - r - 1 has mean
E[-r] = KL(policy || reference): unbiased, and never negative (exp(r) >= 1 + r), unlike -r alone (k1). Unbiased for
the value only: differentiated as a loss at the policy's samples (as GRPO does), its expected gradient is that of
KL(reference || policy), the other direction (Tang & Munos 2025).
"""

from __future__ import annotations

import torch


def kl_k3(logprobs: torch.Tensor, ref_logprobs: torch.Tensor) -> torch.Tensor:
    """exp(r) - r - 1 with r = ref_logprobs - logprobs, elementwise (any shape): per-token KL estimates of tokens
    sampled from the policy. The gradient flows through `logprobs` only."""
    if logprobs.shape != ref_logprobs.shape:
        raise ValueError(f"logprobs and ref_logprobs must have one shape, got {tuple(logprobs.shape)} and "
                         f"{tuple(ref_logprobs.shape)}")
    log_ratio = ref_logprobs.detach() - logprobs  # r
    return torch.exp(log_ratio) - log_ratio - 1
