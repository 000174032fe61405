"""Training a policy with DPO on preference pairs: batches, one step, and a loop with checkpoints that resume bit
for bit (as `gptcourse.train`'s do).

Each batch holds B pairs as one padded batch of 2B rows, the B chosen responses then the B rejected ones, so the
policy and the reference each run once per step. Only the response tokens count (`response_labels`).
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import NamedTuple

import torch
from torch import nn

from .dpo import DPOLoss, dpo_loss
from .log_likelihood import sequence_logprobs
from .losses import response_labels
from .padding import pad_batch
from .policy_run import train_policy


class PreferencePair(NamedTuple):
    """Token ids of a prompt and of two responses to it, the one preferred (chosen) and the other (rejected)."""

    prompt: Sequence[int]
    chosen: Sequence[int]
    rejected: Sequence[int]


@dataclass(frozen=True)
class DPOConfig:
    steps: int = 100
    batch_size: int = 16  # pairs per step: 2 x batch_size sequences
    lr: float = 1e-3
    beta: float = 0.1
    grad_clip: float = 1.0
    seed: int = 0
    pad_id: int = 0


def dpo_batch(pairs: Sequence[PreferencePair], pad_id: int = 0,
              side: str = "right") -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """ids, attention_mask and labels (2B, T): prompt + chosen for each pair, then prompt + rejected; the labels
    are the response tokens (the prompt and the pads at IGNORE_INDEX)."""
    if not pairs:
        raise ValueError("dpo_batch needs at least one preference pair")
    rows = [list(p.prompt) + list(p.chosen) for p in pairs] + [list(p.prompt) + list(p.rejected) for p in pairs]
    ids, mask = pad_batch(rows, pad_id=pad_id, side=side)
    prompt_lengths = torch.tensor([len(p.prompt) for p in pairs] * 2)  # (2B,)
    return ids, mask, response_labels(ids, prompt_lengths, mask)


def dpo_step(policy: nn.Module, reference: Callable[..., torch.Tensor], optimizer: torch.optim.Optimizer,
             batch: tuple[torch.Tensor, torch.Tensor, torch.Tensor], beta: float,
             grad_clip: float | None = None) -> DPOLoss:
    """One update of `policy` on a `dpo_batch` (its gradient norm clipped to `grad_clip`, if given); the reference
    runs without gradients and is never changed."""
    ids, mask, labels = batch
    policy_logps = sequence_logprobs(policy, ids, mask, labels)  # (2B,)
    with torch.no_grad():
        ref_logps = sequence_logprobs(reference, ids, mask, labels)  # (2B,)
    result = dpo_loss(*policy_logps.chunk(2), *ref_logps.chunk(2), beta)
    optimizer.zero_grad(set_to_none=True)
    result.loss.backward()
    if grad_clip is not None:
        torch.nn.utils.clip_grad_norm_([p for p in policy.parameters() if p.requires_grad], grad_clip)
    optimizer.step()
    return result


def _pairs_fingerprint(pairs: Sequence[PreferencePair]) -> str:
    """A short hash of the pairs, so that a checkpoint is not resumed on other data."""
    data = json.dumps([[list(map(int, part)) for part in pair] for pair in pairs]).encode()
    return hashlib.sha256(data).hexdigest()[:16]


def train_dpo(policy: nn.Module, reference: Callable[..., torch.Tensor], pairs: Sequence[PreferencePair],
              cfg: DPOConfig, checkpoint: str | Path | None = None, checkpoint_every: int = 0,
              resume: str | Path | None = None, on_step: Callable[[int], dict] | None = None) -> list[dict]:
    """Train `policy` in place with DPO against `reference` (`frozen_copy` or `without_adapters`), AdamW on its
    trainable parameters, `cfg.batch_size` pairs drawn at random each step. Returns one record per step,
    {"step", "loss", "accuracy", "margin"} (margin: the mean of beta x the log-ratio margin).

    checkpoint, checkpoint_every, resume: as `gptcourse.train`'s; a resumed run continues bit for bit.
    on_step: called after each step with its number (1, 2, ...); the dict it returns joins that step's record
    (e.g. a KL measured on the policy's samples every few steps)."""
    if not pairs:
        raise ValueError("train_dpo needs at least one preference pair")

    def one_step(optimizer: torch.optim.Optimizer, gen: torch.Generator) -> dict:
        picks = torch.randint(len(pairs), (cfg.batch_size,), generator=gen).tolist()
        batch = dpo_batch([pairs[i] for i in picks], pad_id=cfg.pad_id)
        result = dpo_step(policy, reference, optimizer, batch, cfg.beta, cfg.grad_clip)
        return {"loss": result.loss.item(), "accuracy": result.accuracy.item(),
                "margin": (result.chosen_rewards - result.rejected_rewards).mean().item()}

    return train_policy(policy, cfg.lr, cfg.seed, cfg.steps, lambda: {
        "dpo_config": asdict(cfg), "data": {"pairs": len(pairs), "sha256": _pairs_fingerprint(pairs)}}, one_step,
        checkpoint, checkpoint_every, resume, on_step)
