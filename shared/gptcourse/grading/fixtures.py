"""What several labs' cases share: a reference GPT with given weights, weights at a working network's scale, and
a comparison that computes its known mistakes only when it needs them.

Lab modules import these from here, never from one another (each lab's catalogue of mistakes stays in its lab).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from functools import partial
from typing import Any

import torch
from torch import nn

from ..checks import check_causal, check_close, check_shape, fail, fmt_shape, perturbed_copies
from ..model.config import GPTConfig
from ..model.gpt import GPT
from .cases import Inputs, Outputs, tensor_rng
from .piece import Probe
from .student import as_tensor, build_module, load_weights


def gpt_config(v: int, c: int, h: int, n: int, t_max: int, **changes: Any) -> GPTConfig:
    """A case's small model: vocabulary v, width c, h heads, n layers, context t_max (and any other `changes`)."""
    return GPTConfig(vocab_size=v, d_model=c, n_heads=h, n_layers=n, context_length=t_max, **changes)


def reference_gpt(config: GPTConfig, weights: dict[str, torch.Tensor]) -> nn.Module:
    """gptcourse.GPT(config) with `weights` (drawn by `random_weights` from its parameters), in eval mode."""
    with torch.random.fork_rng(devices=[]):  # GPT's own init must not move the caller's random state
        model = GPT(config)
    return load_gpt_weights(model, config, weights, "the reference GPT")


def case_gpt(inputs: Inputs) -> nn.Module:
    """The reference GPT of a case whose inputs hold its "config" and "weights" (`gpt_inputs`)."""
    return reference_gpt(inputs["config"], inputs["weights"])


def load_gpt_weights(model: nn.Module, config: GPTConfig, weights: dict[str, torch.Tensor], what: str) -> nn.Module:
    """Load the reference weights; with tie_weights, `lm_head.weight` (shared or, wrongly, separate) gets the token
    table, so a model that forgot to tie still computes the right logits and fails only the tying test."""
    if config.tie_weights and "lm_head.weight" in dict(model.named_parameters(remove_duplicate=False)):
        weights = weights | {"lm_head.weight": weights["tok_emb.weight"]}
    load_weights(model, weights, what)
    return model.eval()


def check_close_lazily(got: torch.Tensor, expected: torch.Tensor, name: str,
                       mistakes: Callable[[], Mapping[str, torch.Tensor]], atol: float = 1e-5) -> None:
    """`check_close`, computing the known mistakes (a model run each) only when `got` is off."""
    if tuple(got.shape) != tuple(expected.shape) or not torch.allclose(got.double(), expected.double(), atol=atol,
                                                                        rtol=1e-4):
        check_close(got, expected, name, atol=atol, mistakes=mistakes())


def unit_scale_weights(module: torch.nn.Module, gen: torch.Generator) -> dict[str, torch.Tensor]:
    """Weights at the scale of a working network: unit-variance embeddings, matrices with std 1/sqrt(fan-in),
    norm gains near 1, small biases. The logits then depend on the tokens (with one scale for everything, one
    token can win at every position, and a sampler reading the wrong position would go unnoticed)."""
    weights = {}
    for name, p in module.named_parameters():
        if name.startswith(("tok_emb.", "pos_emb.")):
            mean, std = 0.0, 1.0
        elif p.dim() == 2:
            mean, std = 0.0, 1 / math.sqrt(p.shape[1])
        elif name.endswith("bias"):
            mean, std = 0.0, 0.1
        else:  # norm gains
            mean, std = 1.0, 0.2
        weights[name] = mean + std * torch.randn(p.shape, generator=gen)
    return weights


def gpt_inputs(config: GPTConfig, gen: torch.Generator) -> dict[str, Any]:
    """A case's model, as {"config", "weights"} (weights at a working network's scale, drawn from `gen`), for
    `reference_gpt(inputs["config"], inputs["weights"])`."""
    with torch.device("meta"):  # shapes only: the weights are drawn from `gen`
        skeleton = GPT(config)
    return {"config": config, "weights": unit_scale_weights(skeleton, gen)}


def gpt_with_tokens(config: GPTConfig, seed: int, shape: tuple[int, ...], name: str = "tokens",
                    **extra: Any) -> Inputs:
    """A case's model (`gpt_inputs`) and the token ids `name` of `shape`, drawn after its weights from the seed,
    with any `extra` inputs."""
    gen = tensor_rng(seed)
    return gpt_inputs(config, gen) | {name: torch.randint(0, config.vocab_size, shape, generator=gen)} | extra


def causal_probe(what: Callable[[Inputs], str], forward: Callable[[nn.Module, torch.Tensor, Inputs], torch.Tensor],
                 label: str, piece: str) -> Probe:
    """A case that a sequence module is causal: built with the case's `init` and `weights`, run (`forward`) on
    copies of x (B, T, C) changed at later positions only (`perturbed_copies`), its earlier outputs never move."""

    def call(cls: Any, inputs: Inputs) -> Outputs:
        module = build_module(cls, what(inputs), inputs["init"], inputs["weights"])
        return {"outputs": torch.stack([forward(module, x, inputs) for x in perturbed_copies(inputs["x"])])}

    def judge(got: Outputs, expected: Outputs, inputs: Inputs) -> None:
        check_shape(got["outputs"][0], "B T C", inputs["sizes"], label)
        check_causal(got["outputs"], piece)

    return Probe(call, judge)


def mistaken(call: Callable[[Any, Inputs], Outputs], wrong: Callable[..., Any], flags: Mapping[str, dict[str, Any]],
             inputs: Inputs, output: str) -> dict[str, torch.Tensor]:
    """{why: `output` of `call` run on `wrong` with that mistake's keyword flags}: what each known mistake gives,
    computed through the same call as the student's code."""
    return {why: call(partial(wrong, **flag), inputs)[output] for why, flag in flags.items()}


def flat_parameters(model: nn.Module) -> torch.Tensor:
    """Every parameter of `model`, detached and flattened into one vector: what a training step changed."""
    return torch.cat([p.detach().flatten() for p in model.parameters()])


def loss_outputs(loss: Any, what: str) -> Outputs:
    """A returned loss as a case's outputs: the loss, and whether loss.backward() reaches what it came from."""
    differentiable = isinstance(loss, torch.Tensor) and loss.requires_grad
    return {"loss": as_tensor(loss, what), "differentiable": differentiable}


def check_scalar_loss(loss: torch.Tensor, how: str) -> None:
    """A loss is a single number; `how` says how to make it one."""
    if loss.dim() != 0:
        raise fail(f"the loss has shape {fmt_shape(loss.shape)}, expected a single number (a 0-dim tensor): {how}")


def check_differentiable(differentiable: bool, how: str) -> None:
    """The loss must carry its graph; `how` says how to keep it."""
    if not differentiable:
        raise fail(f"the loss does not require grad: {how}")
