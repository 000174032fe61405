"""Training a policy with GRPO on a task a program checks: sample a group of answers to each prompt with lesson
11's KV cache, score each with the verifier, turn the scores into group advantages, and step on `grpo_loss`
against a frozen reference. Checkpoints resume bit for bit (as `gptcourse.train`'s and `train_dpo`'s do).

A batch lays each answer out after its prompt, padded on the right: ids (N, T). Per-token quantities are (N, T - 1),
one per predicted token: position j holds log p(ids[j + 1] | ids[:j + 1]), and `completion_mask` marks the positions
whose token is part of an answer (the prompt and the pads never count).
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
from torch.nn import functional as F

from .group_baseline import group_advantages
from .grpo_objective import GRPOStats, grpo_loss
from .padding import pad_batch
from .policy_run import train_policy
from .stopping import decode_until_stop

Verifier = Callable[[Sequence[int], Sequence[int]], float]  # (prompt ids, answer ids) -> reward


class SampledGroups(NamedTuple):
    """`group_size` sampled answers to each prompt, row by row (the answers to prompt p are rows p G .. p G + G - 1):
    ids and attention_mask (N, T), completion_mask and old_logprobs (N, T - 1) (the sampling policy's log-probability
    of each answer token, 0 elsewhere), and each answer's tokens (up to and including the stop token)."""

    ids: torch.Tensor
    attention_mask: torch.Tensor
    completion_mask: torch.Tensor
    old_logprobs: torch.Tensor
    completions: list[list[int]]


class GRPOBatch(NamedTuple):
    """What one GRPO step needs: `SampledGroups`' tensors and the answers' advantages (N,)."""

    ids: torch.Tensor
    attention_mask: torch.Tensor
    completion_mask: torch.Tensor
    old_logprobs: torch.Tensor
    advantages: torch.Tensor


@dataclass(frozen=True)
class GRPOConfig:
    steps: int = 50
    prompts_per_step: int = 8
    group_size: int = 8  # answers sampled per prompt
    max_new_tokens: int = 6
    stop_id: int = 0  # the token that ends an answer
    pad_id: int = 0
    temperature: float = 1.0
    lr: float = 1e-3
    beta: float = 0.04  # weight of the k3 KL to the reference
    clip_eps: float = 0.2
    loss_type: str = "grpo"
    scale_rewards: bool = True  # divide by the group's std (Dr. GRPO drops this)
    updates_per_batch: int = 1  # optimizer steps on each sampled batch (GRPO's mu): > 1 makes the clip matter
    grad_clip: float = 1.0
    seed: int = 0


def sample_groups(model: nn.Module, prompts: Sequence[Sequence[int]], group_size: int, max_new_tokens: int,
                  stop_id: int, temperature: float = 1.0, pad_id: int = 0,
                  generator: torch.Generator | None = None) -> SampledGroups:
    """Sample `group_size` answers to each prompt (token id lists) at `temperature`, each ending at its first
    `stop_id` or after `max_new_tokens`. Rows with prompts of one length run as one batch with a KV cache; a row
    that stops leaves the batch and the cache. The old log-probabilities are those of the sampling distribution,
    log_softmax(logits / temperature), as `token_logprobs` computes them."""
    if group_size < 1 or max_new_tokens < 1 or temperature <= 0:
        raise ValueError(f"expected group_size >= 1, max_new_tokens >= 1 and temperature > 0, got {group_size}, "
                         f"{max_new_tokens} and {temperature}")
    if not prompts or any(len(p) == 0 for p in prompts):
        raise ValueError("sample_groups needs at least one prompt, and no empty ones")
    limit = model.config.context_length
    rows = [list(map(int, p)) for p in prompts for _ in range(group_size)]
    if max(map(len, rows)) >= limit:
        raise ValueError(f"a prompt of {max(map(len, rows))} tokens leaves no room to answer in the context window "
                         f"of {limit} tokens")
    sampled_logps: list[list[float]] = [[] for _ in rows]

    def sample(logits: torch.Tensor, running: list[int]) -> torch.Tensor:
        logps = F.log_softmax(logits.float() / temperature, dim=-1)  # (B, V)
        next_ids = torch.multinomial(logps.exp(), 1, generator=generator)  # (B, 1)
        for row, logp in zip(running, logps.gather(-1, next_ids)[:, 0].tolist(), strict=True):
            sampled_logps[row].append(logp)
        return next_ids[:, 0]  # (B,)

    completions = decode_until_stop(model, rows, stop_id, max_new_tokens, sample)
    ids, attention_mask = pad_batch([p + c for p, c in zip(rows, completions, strict=True)], pad_id=pad_id)
    completion_mask = torch.zeros(len(rows), ids.size(1) - 1)  # (N, T - 1)
    old_logprobs = torch.zeros(len(rows), ids.size(1) - 1)
    for row, (prompt, logps) in enumerate(zip(rows, sampled_logps, strict=True)):
        span = slice(len(prompt) - 1, len(prompt) - 1 + len(logps))  # the positions that predict the answer
        completion_mask[row, span] = 1.0
        old_logprobs[row, span] = torch.tensor(logps)
    return SampledGroups(ids, attention_mask, completion_mask, old_logprobs, completions)


def token_logprobs(model: Callable[..., torch.Tensor], ids: torch.Tensor, attention_mask: torch.Tensor,
                   temperature: float = 1.0) -> torch.Tensor:
    """(B, T - 1): log p(ids[:, j + 1] | ids[:, :j + 1]) under log_softmax(logits / temperature)."""
    logits = model(ids, attention_mask=attention_mask)  # (B, T, V)
    logps = F.log_softmax(logits[:, :-1].float() / temperature, dim=-1)  # (B, T - 1, V)
    return logps.gather(-1, ids[:, 1:, None]).squeeze(-1)  # (B, T - 1)


def grpo_step(policy: nn.Module, reference: Callable[..., torch.Tensor] | None, optimizer: torch.optim.Optimizer,
              batch: GRPOBatch, clip_eps: float, beta: float, loss_type: str = "grpo",
              max_completion_length: int | None = None, grad_clip: float | None = None,
              temperature: float = 1.0) -> tuple[torch.Tensor, GRPOStats]:
    """One update of `policy` on a `GRPOBatch`: `grpo_loss` of the policy's token log-probabilities against the
    batch's old ones and the reference's (run without gradients; None when beta is 0), then zero_grad, backward,
    the gradient norm clipped to `grad_clip` if given, and the optimizer's step. Returns the loss and its stats."""
    ids, attention_mask, completion_mask, old_logprobs, advantages = batch
    logprobs = token_logprobs(policy, ids, attention_mask, temperature)  # (N, T - 1)
    if reference is None:
        if beta != 0.0:
            raise ValueError(f"beta={beta} weighs the KL to a reference: pass one (frozen_copy(policy))")
        ref_logprobs = logprobs.detach()
    else:
        with torch.no_grad():
            ref_logprobs = token_logprobs(reference, ids, attention_mask, temperature)
    loss, stats = grpo_loss(logprobs, old_logprobs, ref_logprobs, advantages, completion_mask, clip_eps, beta,
                            loss_type, max_completion_length=max_completion_length)
    optimizer.zero_grad(set_to_none=True)
    loss.backward()
    if grad_clip is not None:
        torch.nn.utils.clip_grad_norm_([p for p in policy.parameters() if p.requires_grad], grad_clip)
    optimizer.step()
    return loss.detach(), stats


def _prompts_fingerprint(prompts: Sequence[Sequence[int]]) -> str:
    """A short hash of the prompts, so that a checkpoint is not resumed on other ones."""
    return hashlib.sha256(json.dumps([list(map(int, p)) for p in prompts]).encode()).hexdigest()[:16]


def train_grpo(policy: nn.Module, reference: Callable[..., torch.Tensor] | None, prompts: Sequence[Sequence[int]],
               verifier: Verifier, cfg: GRPOConfig, checkpoint: str | Path | None = None, checkpoint_every: int = 0,
               resume: str | Path | None = None, on_step: Callable[[int], dict] | None = None) -> list[dict]:
    """Train `policy` in place with GRPO against `reference` (`frozen_copy`, `without_adapters`, or None when
    cfg.beta is 0), AdamW on its trainable parameters. Each step draws `cfg.prompts_per_step` prompts, samples
    `cfg.group_size` answers to each, scores them with `verifier(prompt ids, answer ids)` and makes
    `cfg.updates_per_batch` `grpo_step`s on them. Returns one record per step: {"step", "reward" (the mean),
    "solved" (the share of answers with reward >= 1), "length" (mean answer tokens), "loss", "clip_fraction", "kl",
    "ratio"} (the last four from the batch's last update).

    checkpoint, checkpoint_every, resume: as `gptcourse.train`'s; a resumed run continues bit for bit.
    on_step: called after each step with its number; the dict it returns joins that step's record."""
    if not prompts:
        raise ValueError("train_grpo needs at least one prompt")

    def one_step(optimizer: torch.optim.Optimizer, gen: torch.Generator) -> dict:
        picks = torch.randint(len(prompts), (cfg.prompts_per_step,), generator=gen).tolist()
        chosen = [prompts[i] for i in picks]
        groups = sample_groups(policy, chosen, cfg.group_size, cfg.max_new_tokens, cfg.stop_id, cfg.temperature,
                               cfg.pad_id, generator=gen)
        rewards = torch.tensor([float(verifier(chosen[row // cfg.group_size], answer))
                                for row, answer in enumerate(groups.completions)])  # (N,)
        advantages = group_advantages(rewards, cfg.group_size, scale=cfg.scale_rewards)
        batch = GRPOBatch(groups.ids, groups.attention_mask, groups.completion_mask, groups.old_logprobs, advantages)
        for _ in range(cfg.updates_per_batch):
            loss, stats = grpo_step(policy, reference, optimizer, batch, cfg.clip_eps, cfg.beta, cfg.loss_type,
                                    cfg.max_new_tokens, cfg.grad_clip, cfg.temperature)
        return {"reward": rewards.mean().item(), "solved": (rewards >= 1).float().mean().item(),
                "length": sum(map(len, groups.completions)) / len(groups.completions), "loss": loss.item(),
                **asdict(stats)}

    return train_policy(policy, cfg.lr, cfg.seed, cfg.steps, lambda: {
        "grpo_config": asdict(cfg), "data": {"prompts": len(prompts), "sha256": _prompts_fingerprint(prompts)}},
        one_step, checkpoint, checkpoint_every, resume, on_step)
