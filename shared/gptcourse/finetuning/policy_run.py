"""The loop that `train_dpo` and `train_grpo` share: AdamW on the policy's trainable parameters, a data generator
seeded once, one record per step, and checkpoints that resume bit for bit (`run_state` / `resume_run`)."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
from torch import nn

from ..training.checkpoint import resume_run, run_state, save_checkpoint

PolicyStep = Callable[[torch.optim.Optimizer, torch.Generator], dict[str, Any]]


def train_policy(policy: nn.Module, lr: float, seed: int, steps: int, settings: Callable[[], dict[str, Any]],
                 one_step: PolicyStep, checkpoint: str | Path | None = None, checkpoint_every: int = 0,
                 resume: str | Path | None = None, on_step: Callable[[int], dict] | None = None) -> list[dict]:
    """Run `steps` steps of `one_step(optimizer, generator)` on `policy` in train mode (eval mode after), each
    returning its record; returns [{"step": n, **record}, ...] with `on_step(n)`'s dict added to each.
    settings: called once the policy is checked; what a checkpoint must match to be resumed.
    checkpoint, checkpoint_every, resume: as `gptcourse.train`'s."""
    trainable = [p for p in policy.parameters() if p.requires_grad]
    if not trainable:
        raise ValueError("the policy has no trainable parameters")
    optimizer = torch.optim.AdamW(trainable, lr=lr, weight_decay=0.0)
    gen = torch.Generator().manual_seed(seed)
    run_settings = settings()
    history: list[dict] = []
    first_step = 0
    if resume is not None:
        first_step, history = resume_run(resume, run_settings, policy, optimizer, gen)

    def save(step: int) -> None:
        if checkpoint is not None:
            save_checkpoint(checkpoint, run_state(run_settings, step, policy, optimizer, gen, history))

    policy.train()
    for step in range(first_step, steps):
        history.append({"step": step + 1} | one_step(optimizer, gen))
        if on_step is not None:
            history[-1].update(on_step(step + 1))
        if checkpoint_every > 0 and (step + 1) % checkpoint_every == 0 and step + 1 < steps:
            save(step + 1)
    save(steps)
    policy.eval()
    return history
