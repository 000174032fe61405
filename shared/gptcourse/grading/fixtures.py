"""What several labs' cases share: a reference GPT with given weights, weights at a working network's scale, and
a comparison that computes its known mistakes only when it needs them.

Lab modules import these from here, never from one another (each lab's catalogue of mistakes stays in its lab).
"""

from __future__ import annotations

import copy
import math
import re
from collections.abc import Callable, Iterable, Mapping
from functools import cache, partial
from typing import Any

import torch
from torch import nn

from ..checks import CheckFailed, Mistake, check_causal, check_close, check_shape, fail, fmt_shape, perturbed_copies
from ..model.config import GPTConfig
from ..model.gpt import GPT
from .cases import Inputs, Outputs, tensor_rng
from .piece import Probe
from .student import as_tensor, build_module, load_weights

# The package's functions that take a log-softmax of logits for their caller (a loss, the log-probabilities of
# tokens or of continuations): each gives a next-token cross-entropy in one call, so the labs that teach the
# cross-entropy or the shift forbid them all (lab 07's next_token_loss, lab 09's cross_entropy).
LOG_SOFTMAX_FUNCTIONS = ("gptcourse.training.loop.lm_loss", "gptcourse.estimate_loss", "gptcourse.masked_lm_loss",
                         "gptcourse.sequence_logprobs", "gptcourse.finetuning.grpo_training.token_logprobs",
                         "gptcourse.evaluation.continuations.loglikelihood")
# Lesson 12's tiled attention: flash_attention is causal attention in one call (it groups the kv heads, aligns the
# queries to the last keys as a cache needs, and gives the weights too, through an identity as the values), and its
# `_allowed` builds a causal or padding mask; the labs that teach the mask or attention forbid the whole module
# (lab 02's causal_mask, attention and AttentionHead, lab 10's padding_mask, lab 11's cached and grouped attention).
TILED_ATTENTION = ("gptcourse.model.tiled_attention",)


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


@cache
def gpt_parameter_shapes(config: GPTConfig) -> tuple[tuple[str, torch.Size], ...]:
    """(name, shape) of each parameter of GPT(config), in `named_parameters` order: from a skeleton on the meta
    device, built once per config (every op of its init goes through torch's device mode, which costs far more
    than drawing the weights)."""
    with torch.device("meta"):  # shapes only
        skeleton = GPT(config)
    return tuple((name, p.shape) for name, p in skeleton.named_parameters())


def unit_scale_weights(shapes: Iterable[tuple[str, torch.Size]], gen: torch.Generator) -> dict[str, torch.Tensor]:
    """Weights of these (name, shape) parameters at the scale of a working network: unit-variance embeddings,
    matrices with std 1/sqrt(fan-in), norm gains near 1, small biases. The logits then depend on the tokens (with
    one scale for everything, one token can win at every position, and a sampler reading the wrong position would
    go unnoticed)."""
    weights = {}
    for name, shape in shapes:
        if name.startswith(("tok_emb.", "pos_emb.")):
            mean, std = 0.0, 1.0
        elif len(shape) == 2:
            mean, std = 0.0, 1 / math.sqrt(shape[1])
        elif name.endswith("bias"):
            mean, std = 0.0, 0.1
        else:  # norm gains
            mean, std = 1.0, 0.2
        weights[name] = mean + std * torch.randn(shape, generator=gen)
    return weights


def gpt_inputs(config: GPTConfig, gen: torch.Generator) -> dict[str, Any]:
    """A case's model, as {"config", "weights"} (weights at a working network's scale, drawn from `gen`), for
    `reference_gpt(inputs["config"], inputs["weights"])`."""
    return {"config": config, "weights": unit_scale_weights(gpt_parameter_shapes(config), gen)}


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
    computed through the same call as the student's code. Each `why` is a `Mistake` keyed by its switches
    (`switch_key`), unless it has a key of its own."""
    return {why if isinstance(why, Mistake) else Mistake(switch_key(call, wrong, flag), why):
            call(partial(wrong, **flag), inputs)[output] for why, flag in flags.items()}


def part_of(outputs: Callable[[], Any], key: Any) -> torch.Tensor:
    """Output `key` of a mistake's lazily computed outputs (`functools.cache` them where several keys are read)."""
    return outputs()[key]


def switch_key(call: Callable[..., Any], wrong: Callable[..., Any], flag: Mapping[str, Any]) -> str:
    """The key of the mistake a by-hand function's switches give: the graded lab (of `call`, else `wrong`), the
    function and its switches, e.g. "09.adamw_step:correct_m=False" for `_wrong_adamw_step(correct_m=False)`."""
    modules = [getattr(f, "__module__", None) or "" for f in (call, wrong)]
    lab = next((m.rsplit(".lab", 1)[1] + "." for m in modules if re.search(r"\.lab\d\d$", m)), "")
    name = getattr(wrong, "__name__", "by_hand").strip("_").removeprefix("wrong_")
    switches = "+".join(f"{key}={re.sub(r'[^A-Za-z0-9_.-]', '_', str(value))[:24]}"
                        for key, value in sorted(flag.items()))
    return f"{lab}{name}:{switches}"


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


def policy_and_reference(config: GPTConfig, seed: int, drift: float) -> tuple[GPT, GPT]:
    """A preference or RL step's two models: the policy at a working network's scale, with a stale gradient in
    every .grad (left by an earlier step: zero_grad must clear it), and the reference: the policy with noise of std
    `drift` added, as if the policy had trained, so that a step that uses the policy as its reference goes
    elsewhere. The reference is trainable on purpose: a step must not give it gradients."""
    gen = tensor_rng(seed)
    weights = unit_scale_weights(gpt_parameter_shapes(config), gen)
    with torch.random.fork_rng(devices=[]):
        policy = GPT(config)
    with torch.no_grad():
        for p, w in zip(policy.parameters(), weights.values(), strict=True):
            p.copy_(w)
        reference = copy.deepcopy(policy)
        for p, q in zip(policy.parameters(), reference.parameters(), strict=True):
            q.add_(drift * torch.randn(q.shape, generator=gen))
            p.grad = torch.randn(p.shape, generator=gen)
    return policy, reference


def record_calls(model: GPT) -> dict[str, int]:
    """Count, from now on, the model's forward passes, those without an attention mask and those that built a
    graph (logits that require grad); `model.forward(...)` called directly is counted too."""
    counts = {"runs": 0, "unmasked": 0, "graphs": 0}
    forward = model.forward

    def recorded(idx: torch.Tensor, cache: Any = None, attention_mask: torch.Tensor | None = None) -> torch.Tensor:
        out = forward(idx, cache, attention_mask)
        counts["runs"] += 1
        counts["unmasked"] += attention_mask is None
        counts["graphs"] += out.requires_grad
        return out

    model.forward = recorded
    return counts


def reference_step_outputs(policy: GPT, reference: GPT, step: Callable[[torch.optim.Optimizer], Any]) -> Outputs:
    """Run `step(optimizer)` (a student's step of `policy` against `reference`, SGD at lr 1 on the policy) and
    record what a judge of such a step reads: the policy after it, whether the reference changed or got
    gradients, how often the reference ran and built a graph, and the model calls without an attention mask."""
    before = flat_parameters(reference)
    policy_calls, reference_calls = record_calls(policy), record_calls(reference)
    step(torch.optim.SGD(policy.parameters(), lr=1.0))
    return {"policy": flat_parameters(policy), "reference_changed": not torch.equal(flat_parameters(reference), before),
            "reference_grads": any(p.grad is not None for p in reference.parameters()),
            "reference_runs": reference_calls["runs"], "reference_graphs": reference_calls["graphs"],
            "unmasked_calls": policy_calls["unmasked"] + reference_calls["unmasked"]}


def check_reference_step(got: Outputs, untrained: GPT, never_run: str | None, unmasked: str) -> None:
    """The checks every step against a frozen reference gets, in order: the reference unchanged, without gradients,
    run (`never_run` says why it must be; None where it need not run), without a graph; every call masked
    (`unmasked`: how, after the count); the policy moved from `untrained`."""
    if got["reference_changed"]:
        raise fail("the reference model changed: it must stay what the policy was before training; give the "
                   "optimizer the policy's parameters only, and never step the reference")
    if got["reference_grads"]:
        raise fail("the reference received gradients: compute its log-probabilities under torch.no_grad(), so that "
                   "it is a constant of the loss (and costs no memory for a backward pass)")
    if got["reference_runs"] == 0 and never_run is not None:
        raise fail(f"the reference model was never run: {never_run}")
    if got["reference_graphs"]:
        raise fail("the reference's forward pass built a graph (its logits require grad), then dropped it: "
                   ".detach() gives the same numbers, but only after every activation was kept for a backward "
                   "pass that never comes. Run the reference under `with torch.no_grad():`")
    if got["unmasked_calls"]:
        raise fail(f"{got['unmasked_calls']} model call(s) had no attention mask: {unmasked}")
    if torch.equal(got["policy"], flat_parameters(untrained)):
        raise fail("the policy's parameters did not change: call loss.backward() and then optimizer.step() (in "
                   "that order, after optimizer.zero_grad(): step() uses the gradients that backward() computed)")


STALE_GRADIENTS = ("the gradients left in .grad by the last step were added to: call optimizer.zero_grad() before "
                   "loss.backward(), or every step adds the old gradients to the new ones")


def update_by_hand(optimizer: torch.optim.Optimizer, loss: torch.Tensor, zero_grad: bool) -> None:
    """A by-hand step's update: zero_grad (skipped for the `STALE_GRADIENTS` mistake), backward, step."""
    if zero_grad:
        optimizer.zero_grad()
    loss.backward()
    optimizer.step()


def check_stepped_policy(got: Outputs, expected: Outputs, mistakes: Callable[[], Mapping[str, torch.Tensor]],
                         calls: str) -> None:
    """The policy after a step against the reference step's (the known `mistakes` computed only when off); where
    it is off, the message adds `calls`: which of the student's own functions the step ran, to fix first."""
    try:
        check_close_lazily(got["policy"], expected["policy"], "the policy's parameters after the step", mistakes)
    except CheckFailed as failed:
        if "largest error" not in str(failed):
            raise
        raise fail(f"{failed} {calls}: if their tests fail, fix them first") from None
