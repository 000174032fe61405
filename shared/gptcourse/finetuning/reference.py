"""DPO's reference model: the policy as it was before training, never updated.

Two ways to have it. `frozen_copy`: a second copy of the weights, frozen (twice the memory of the model).
`without_adapters`: when the policy is a LoRA model (lesson 10), its frozen base *is* the reference: the same
forward with the adapters switched off gives it, with no second copy of anything.
"""

from __future__ import annotations

import copy

import torch
from torch import nn

from .lora import LoRALinear, adapters_disabled


def frozen_copy(model: nn.Module) -> nn.Module:
    """A deep copy of `model` in eval mode with every parameter frozen: what the policy was, kept as it is."""
    return copy.deepcopy(model).eval().requires_grad_(False)


class AdaptersOff:
    """The reference of a LoRA policy: calling it runs the policy's own modules with every adapter disabled and
    without gradients. It holds no weights (not an nn.Module): nothing to copy, move or train."""

    def __init__(self, policy: nn.Module) -> None:
        if not any(isinstance(m, LoRALinear) for m in policy.modules()):
            raise ValueError("without_adapters needs a policy with LoRA adapters (add_lora); for a model without "
                             "them, use frozen_copy")
        self.policy = policy

    def __call__(self, *args: object, **kwargs: object) -> torch.Tensor:
        with torch.no_grad(), adapters_disabled(self.policy):
            return self.policy(*args, **kwargs)


def without_adapters(policy: nn.Module) -> AdaptersOff:
    """The reference for a LoRA `policy`: its base model, read by turning its adapters off for each call."""
    return AdaptersOff(policy)
