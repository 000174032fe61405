"""Cross-entropy written from its definition, with the log-sum-exp shift that keeps it finite.

loss = mean over positions of  log(sum_j exp(z_j)) - z_target.  exp(z) overflows float32 once z > 88, so the
row's largest logit m is taken out first: log(sum_j exp(z_j)) = m + log(sum_j exp(z_j - m)), where every
exponent is <= 0. Lesson 09 shows the overflow; torch's F.cross_entropy does the same shift.
"""

from __future__ import annotations

import torch


def cross_entropy(logits: torch.Tensor, targets: torch.Tensor, ignore_index: int = -100) -> torch.Tensor:
    """Mean negative log-likelihood of `targets` (...,) under `logits` (..., V); targets equal to
    `ignore_index` are left out of the mean (like F.cross_entropy, which returns nan if all are ignored)."""
    if logits.shape[:-1] != targets.shape:
        raise ValueError(f"logits {tuple(logits.shape)} need targets of shape {tuple(logits.shape[:-1])} "
                         f"(one class id per row of V={logits.shape[-1]} scores), got {tuple(targets.shape)}")
    z = logits.flatten(0, -2) if logits.dim() > 1 else logits[None]  # (N, V)
    t = targets.flatten()  # (N,)
    keep = t != ignore_index  # (N,)
    m = z.max(dim=-1, keepdim=True).values.detach()  # (N, 1): a constant shift, so no gradient flows through it
    log_sum_exp = m.squeeze(-1) + (z - m).exp().sum(dim=-1).log()  # (N,)
    target_logit = z.gather(-1, t.where(keep, 0)[:, None]).squeeze(-1)  # (N,)
    losses = (log_sum_exp - target_logit)[keep]  # (N_kept,)
    return losses.sum() / keep.sum()
