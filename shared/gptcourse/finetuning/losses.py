"""The objectives of finetuning: next-token loss on the response only, and the Bradley-Terry preference loss.

Instruction tuning marks every target that must not be learned (the prompt, the padding) with IGNORE_INDEX,
-100, which `F.cross_entropy` skips (its default `ignore_index`, and Hugging Face's convention for `labels`).
"""

from __future__ import annotations

import torch
from torch.nn import functional as F

IGNORE_INDEX = -100


def response_labels(input_ids: torch.Tensor, prompt_lengths: torch.Tensor,
                    attention_mask: torch.Tensor | None = None) -> torch.Tensor:
    """Labels (B, T): the token id on response tokens, IGNORE_INDEX on the prompt and on pads.

    Row b holds a prompt of `prompt_lengths[b]` real tokens, then its response, padded on either side: a real
    token belongs to the response when at least that many real tokens come before it.
    """
    mask = torch.ones_like(input_ids) if attention_mask is None else attention_mask.long()
    real_index = mask.cumsum(dim=-1) - 1  # (B, T): 0 for the first real token of each row
    response = (real_index >= prompt_lengths[:, None]) & mask.bool()  # (B, T)
    return input_ids.masked_fill(~response, IGNORE_INDEX)


def masked_lm_loss(logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    """Mean cross-entropy of predicting labels[:, t + 1] from logits[:, t], over the labels that are not ignored
    (as GPT2LMHeadModel(labels=...) computes it)."""
    return F.cross_entropy(logits[:, :-1].flatten(0, 1), labels[:, 1:].flatten(),  # (B*(T-1), V), (B*(T-1),)
                           ignore_index=IGNORE_INDEX)


def bradley_terry_loss(chosen: torch.Tensor, rejected: torch.Tensor) -> torch.Tensor:
    """-log sigmoid(r_chosen - r_rejected), averaged over the pairs: the negative log-likelihood that the chosen
    answer wins under the Bradley-Terry model P(chosen > rejected) = sigmoid(r_chosen - r_rejected)."""
    return -F.logsigmoid(chosen - rejected).mean()  # logsigmoid: no overflow for large negative differences
