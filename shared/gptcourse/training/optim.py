"""AdamW written out (Loshchilov & Hutter, "Decoupled weight decay regularization"), update for update as
torch.optim.AdamW computes it:

    p <- p * (1 - lr * weight_decay)               decoupled decay: shrinks the weight, never enters m or v
    m <- beta1 * m + (1 - beta1) * g               first moment (momentum)
    v <- beta2 * v + (1 - beta2) * g^2             second moment (per-coordinate scale)
    p <- p - lr / (1 - beta1^t) * m / (sqrt(v / (1 - beta2^t)) + eps)      bias-corrected, t = 1, 2, ...

Without the corrections, step 1 would use m = 0.1 g (beta1 = 0.9): ten times too small. All parameters of a group
are updated together with torch's `_foreach_*` kernels (one call per operation instead of one per tensor), which
is what torch's own `foreach` implementation does; its `fused` kernel goes further (`python -m gptcourse.bench`).
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from typing import Any

import torch


class AdamW(torch.optim.Optimizer):
    """torch.optim.Optimizer with AdamW's update; same arguments and defaults as torch.optim.AdamW."""

    def __init__(self, params: Iterable[Any], lr: float = 1e-3, betas: tuple[float, float] = (0.9, 0.999),
                 eps: float = 1e-8, weight_decay: float = 1e-2) -> None:
        if lr < 0 or eps < 0 or weight_decay < 0:
            raise ValueError(f"lr, eps and weight_decay must be >= 0, got {lr}, {eps}, {weight_decay}")
        if not all(0.0 <= b < 1.0 for b in betas):
            raise ValueError(f"betas must each be in [0, 1), got {betas}")
        super().__init__(params, {"lr": lr, "betas": betas, "eps": eps, "weight_decay": weight_decay})

    @torch.no_grad()
    def step(self, closure: Any = None) -> Any:  # type: ignore[override]
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        for group in self.param_groups:
            params = [p for p in group["params"] if p.grad is not None]
            if not params:
                continue
            lr, (beta1, beta2), eps, decay = group["lr"], group["betas"], group["eps"], group["weight_decay"]
            for p in params:
                if not self.state[p]:
                    self.state[p] = {"step": 0, "exp_avg": torch.zeros_like(p), "exp_avg_sq": torch.zeros_like(p)}
            # Parameters that joined a group later have taken fewer steps: update each step count on its own.
            for step_count in sorted({self.state[p]["step"] for p in params}):
                self._update([p for p in params if self.state[p]["step"] == step_count], step_count + 1,
                             lr, beta1, beta2, eps, decay)
        return loss

    def _update(self, params: list[torch.Tensor], t: int, lr: float, beta1: float, beta2: float, eps: float,
                decay: float) -> None:
        grads = [p.grad for p in params]
        m = [self.state[p]["exp_avg"] for p in params]
        v = [self.state[p]["exp_avg_sq"] for p in params]
        if decay:
            torch._foreach_mul_(params, 1 - lr * decay)
        torch._foreach_lerp_(m, grads, 1 - beta1)  # m + (1 - beta1) (g - m) = beta1 m + (1 - beta1) g
        torch._foreach_mul_(v, beta2)
        torch._foreach_addcmul_(v, grads, grads, 1 - beta2)
        denom = torch._foreach_sqrt(v)
        torch._foreach_div_(denom, math.sqrt(1 - beta2**t))
        torch._foreach_add_(denom, eps)
        torch._foreach_addcdiv_(params, m, denom, -lr / (1 - beta1**t))
        for p in params:
            self.state[p]["step"] = t
