"""How likely a model finds each response: the summed log-probability of its tokens, given its prompt.

DPO compares these sums between a policy and a reference model. The labels are `response_labels`' (Hugging
Face's convention): label t is the token at position t, predicted from the logits at t - 1; IGNORE_INDEX (-100)
marks the prompt and the pads, which do not count. Left or right padding gives the same sums, as long as the
model is given the attention mask.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch.nn import functional as F

from .losses import IGNORE_INDEX


def sequence_logprobs(model: Callable[..., torch.Tensor], ids: torch.Tensor, attention_mask: torch.Tensor,
                      labels: torch.Tensor) -> torch.Tensor:
    """log p(response | prompt) of each row, (B,): the sum over the labelled tokens t of log p(ids[t] | ids[<t]).

    A sum, not a mean: the log-probability of a sequence is the sum of its tokens' (a mean would make a long
    response count as much as a short one)."""
    if ids.shape != labels.shape or ids.shape != attention_mask.shape or ids.dim() != 2:
        raise ValueError(f"ids, attention_mask and labels must share one shape (B, T), got {tuple(ids.shape)}, "
                         f"{tuple(attention_mask.shape)} and {tuple(labels.shape)}")
    logits = model(ids, attention_mask=attention_mask)  # (B, T, V)
    targets = labels[:, 1:]  # (B, T-1): the token that the logits at t - 1 predict
    counted = targets != IGNORE_INDEX
    logprobs = F.log_softmax(logits[:, :-1].float(), dim=-1)  # (B, T-1, V)
    picked = logprobs.gather(-1, targets.clamp(min=0)[..., None]).squeeze(-1)  # (B, T-1); -100 read as 0, dropped
    return picked.masked_fill(~counted, 0.0).sum(dim=-1)  # (B,)
