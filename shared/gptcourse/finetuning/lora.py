"""LoRA (Hu et al. 2021): freeze a pretrained weight W (out, in) and learn a low-rank update instead,

    y = x W^T + b + (alpha / r) x A^T B^T,    A (r, in), B (out, r),

so a layer trains r (in + out) numbers instead of in x out. B starts at zero, so the finetuned model starts as the
pretrained one exactly; A starts random (were both zero, neither would ever get a gradient). `merge_lora` folds
W + (alpha / r) B A back into a plain nn.Linear: the same outputs, no extra cost at inference.
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from contextlib import contextmanager

import torch
from torch import nn

from ..model.config import GPTConfig

# The linear layers of a decoder block, by name: (input width, output width) as functions of the config.
LINEAR_SHAPES = {
    "qkv": lambda c: (c.d_model, c.d_model + 2 * c.kv_heads * c.d_head),  # queries, then H_kv keys and values
    "out": lambda c: (c.d_model, c.d_model),
    "fc_in": lambda c: (c.d_model, c.hidden_width),
    "fc_out": lambda c: (c.hidden_width, c.d_model),
    "w_in": lambda c: (c.d_model, 2 * c.hidden_width),
    "w_out": lambda c: (c.hidden_width, c.d_model),
}


class LoRALinear(nn.Module):
    """A frozen `base` nn.Linear plus the trainable low-rank update (alpha / rank) B A."""

    def __init__(self, base: nn.Linear, rank: int, alpha: float) -> None:
        super().__init__()
        if not isinstance(base, nn.Linear):
            raise TypeError(f"LoRA wraps an nn.Linear, got {type(base).__name__}")
        if not isinstance(rank, int) or rank < 1:
            raise ValueError(f"rank must be a positive int, got {rank!r}")
        self.base = base.requires_grad_(False)
        self.rank, self.alpha, self.scaling = rank, alpha, alpha / rank
        self.A = nn.Parameter(torch.randn(rank, base.in_features) / math.sqrt(base.in_features))  # (r, in)
        self.B = nn.Parameter(torch.zeros(base.out_features, rank))  # (out, r): the update starts at zero
        self.enabled = True  # False: the base layer alone (see `adapters_disabled`)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if not self.enabled:
            return self.base(x)
        return self.base(x) + (x @ self.A.T @ self.B.T) * self.scaling  # (..., in) -> (..., r) -> (..., out)

    @torch.no_grad()
    def merged(self) -> nn.Linear:
        """A plain nn.Linear with weight W + (alpha / r) B A (and the base's bias, frozen as the base was)."""
        base = self.base
        linear = nn.Linear(base.in_features, base.out_features, bias=base.bias is not None,
                           device=base.weight.device, dtype=base.weight.dtype)
        linear.weight.copy_(base.weight + self.scaling * self.B @ self.A)  # (out, r) @ (r, in)
        if base.bias is not None:
            linear.bias.copy_(base.bias)
        return linear.requires_grad_(base.weight.requires_grad)


def _targets_in(model: nn.Module, targets: tuple[str, ...]) -> list[tuple[nn.Module, str]]:
    """(parent module, attribute name) of every nn.Linear whose own name is in `targets`."""
    found = [(parent, name) for parent in model.modules() for name, child in parent.named_children()
             if name in targets and isinstance(child, nn.Linear)]
    missing = set(targets) - {name for _, name in found}
    if missing:
        linears = sorted({name.rsplit(".", 1)[-1] for name, m in model.named_modules() if isinstance(m, nn.Linear)})
        raise ValueError(f"no nn.Linear named {sorted(missing)} in the model; its linear layers are named {linears}")
    return found


def add_lora(model: nn.Module, rank: int, alpha: float, targets: tuple[str, ...] = ("qkv",),
             keep_trainable: tuple[str, ...] = ()) -> nn.Module:
    """Freeze every parameter of `model` and wrap each nn.Linear named in `targets` (e.g. "qkv", "out", "fc_in",
    "fc_out") in a `LoRALinear`, in place. Modules named in `keep_trainable` (a new head, say "head") stay
    trainable. Returns the model."""
    found = _targets_in(model, tuple(targets))
    model.requires_grad_(False)
    for parent in model.modules():
        for name, child in parent.named_children():
            if name in keep_trainable:
                child.requires_grad_(True)
    for parent, name in found:
        setattr(parent, name, LoRALinear(getattr(parent, name), rank, alpha))
    return model


@contextmanager
def adapters_disabled(model: nn.Module) -> Iterator[nn.Module]:
    """Within the block, every `LoRALinear` of `model` computes its base layer alone: the model before finetuning,
    with no copy. The adapters come back on leaving the block, even after an error."""
    layers = [m for m in model.modules() if isinstance(m, LoRALinear)]
    states = [layer.enabled for layer in layers]
    for layer in layers:
        layer.enabled = False
    try:
        yield model
    finally:
        for layer, state in zip(layers, states, strict=True):
            layer.enabled = state


def merge_lora(model: nn.Module) -> nn.Module:
    """Replace every `LoRALinear` by its merged nn.Linear, in place: the outputs do not change. Returns the model."""
    for parent in list(model.modules()):
        for name, child in list(parent.named_children()):
            if isinstance(child, LoRALinear):
                setattr(parent, name, child.merged())
    return model


def lora_parameter_count(config: GPTConfig, rank: int, targets: tuple[str, ...] = ("qkv",)) -> int:
    """The closed form: N x sum over the targets of r (in + out), e.g. 4 r C per block for "qkv" (C -> 3C)."""
    unknown = set(targets) - set(LINEAR_SHAPES)
    if unknown:
        raise ValueError(f"unknown LoRA targets {sorted(unknown)}; expected some of {sorted(LINEAR_SHAPES)}")
    return config.n_layers * sum(rank * sum(LINEAR_SHAPES[t](config)) for t in targets)
