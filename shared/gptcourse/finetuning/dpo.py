"""Direct preference optimisation (Rafailov et al. 2023): the Bradley-Terry loss with the reward read off the model.

The policy that maximises reward - beta KL(policy || reference) is reference x exp(reward / beta) / Z, so the
reward of a response is beta log(policy / reference) + beta log Z, and Z cancels between two responses to the same
prompt. Bradley-Terry on those implicit rewards gives

    loss = -log sigmoid(beta [(log pi(y_w) - log ref(y_w)) - (log pi(y_l) - log ref(y_l))]),

averaged over the pairs: no reward model, no sampling, only log-probabilities of the policy and the reference.
"""

from __future__ import annotations

from typing import NamedTuple

import torch
from torch.nn import functional as F


class DPOLoss(NamedTuple):
    """The loss (a scalar, to minimise) and each pair's implicit rewards beta log(pi / ref), (B,) each, detached."""

    loss: torch.Tensor
    chosen_rewards: torch.Tensor
    rejected_rewards: torch.Tensor

    @property
    def accuracy(self) -> torch.Tensor:
        """The share of pairs whose chosen response has the higher implicit reward."""
        return (self.chosen_rewards > self.rejected_rewards).float().mean()


def dpo_loss(policy_chosen: torch.Tensor, policy_rejected: torch.Tensor, ref_chosen: torch.Tensor,
             ref_rejected: torch.Tensor, beta: float) -> DPOLoss:
    """DPO's loss from the summed log-probabilities (B,) of each pair's chosen and rejected responses under the
    policy and the reference (see `sequence_logprobs`). `beta` > 0: how far the policy may move from the
    reference (small beta, far). Stable for any margin: logsigmoid, never log(sigmoid(x))."""
    if not beta > 0:
        raise ValueError(f"beta must be positive, got {beta!r}")
    shapes = {tuple(t.shape) for t in (policy_chosen, policy_rejected, ref_chosen, ref_rejected)}
    if len(shapes) != 1 or policy_chosen.dim() != 1:
        raise ValueError(f"the four log-probabilities must each have shape (B,), got {sorted(shapes)}")
    chosen_logratio = policy_chosen - ref_chosen.detach()  # (B,): the reference is a constant
    rejected_logratio = policy_rejected - ref_rejected.detach()
    margin = beta * (chosen_logratio - rejected_logratio)  # (B,)
    return DPOLoss(-F.logsigmoid(margin).mean(), beta * chosen_logratio.detach(), beta * rejected_logratio.detach())
