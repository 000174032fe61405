"""Gradient clipping by the global norm: one norm over every gradient of the model, so a clipped update keeps
its direction (clipping each tensor on its own would turn it)."""

from __future__ import annotations

from collections.abc import Iterable

import torch


def clip_grad_norm(parameters: Iterable[torch.Tensor], max_norm: float) -> torch.Tensor:
    """Scale all gradients by max_norm / norm when their global L2 norm exceeds max_norm; returns the norm
    before clipping (as torch.nn.utils.clip_grad_norm_ does, with the same 1e-6 guard against a zero norm)."""
    if max_norm <= 0:
        raise ValueError(f"max_norm must be > 0, got {max_norm}")
    grads = [p.grad for p in parameters if p.grad is not None]
    if not grads:
        return torch.tensor(0.0)
    norm = torch.linalg.vector_norm(torch.stack([torch.linalg.vector_norm(g) for g in grads]))  # sqrt(sum |g|^2)
    scale = (max_norm / (norm + 1e-6)).clamp(max=1.0)
    torch._foreach_mul_(grads, scale)
    return norm
