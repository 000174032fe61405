"""Lab 07, training and generation: `next_token_loss(model, tokens)`, `train_step(model, optimizer, tokens,
grad_clip)`, `next_token_probs(logits, temperature, top_k)` and `sample_next_token(model, idx, temperature, top_k,
generator)`.

The model is gptcourse.GPT with reference weights (earlier labs' pieces come from the package); the optimizer is
torch's SGD, whose update is plain enough that a missing clip or a gradient left over from the previous step shows
in the parameters. The references below are written with torch alone (cross_entropy, clip_grad_norm_, SGD, topk,
multinomial), not with gptcourse.train or gptcourse.generate (the functions) or their modules.
"""

from __future__ import annotations

from typing import Any

import torch
from torch.nn import functional as F

from ...checks import check_close, check_dtype, check_shape, fail, fmt_shape
from ...model.config import GPTConfig
from ...model.gpt import GPT
from ..cases import Inputs, Outputs, case_family, register, sizes_rng, tensor_rng
from ..fixtures import check_close_lazily, reference_gpt, unit_scale_weights
from ..student import as_tensor

_TRAINING = ("gptcourse.train", "gptcourse.training.loop", "gptcourse.training.loop.lm_loss",
             "gptcourse.training.loop.train_step", "gptcourse.estimate_loss")
_SAMPLING = ("gptcourse.generate", "gptcourse.inference.sampling", "gptcourse.filter_logits",
             "gptcourse.widgets.TemperatureSampler")
FORBIDDEN: dict[str, tuple[str, ...]] = {"loss": _TRAINING, "step": _TRAINING, "probs": _SAMPLING,
                                         "sample": _SAMPLING}


def _model_inputs(config: GPTConfig, gen: torch.Generator) -> Inputs:
    with torch.device("meta"):  # shapes only: the weights are drawn from `gen`
        skeleton = GPT(config)
    return {"config": config, "weights": unit_scale_weights(skeleton, gen)}


def _model(inputs: Inputs) -> torch.nn.Module:
    return reference_gpt(inputs["config"], inputs["weights"])


def _config(v: int, c: int, h: int, n: int, t_max: int, **changes: Any) -> GPTConfig:
    return GPTConfig(vocab_size=v, d_model=c, n_heads=h, n_layers=n, context_length=t_max, **changes)


def _lm_loss(model: torch.nn.Module, x: torch.Tensor, y: torch.Tensor, reduction: str = "mean") -> torch.Tensor:
    logits = model(x)  # (B, T, V)
    return F.cross_entropy(logits.flatten(0, 1), y.flatten(), reduction=reduction)  # (B*T, V) vs (B*T,)


# ---- next_token_loss(model, tokens (B, T + 1)) -> the mean cross-entropy of predicting tokens[:, 1:]


def _loss_inputs(config: GPTConfig, b: int, t: int, seed: int) -> Inputs:
    gen = tensor_rng(seed)
    inputs = _model_inputs(config, gen)
    inputs["tokens"] = torch.randint(0, config.vocab_size, (b, t + 1), generator=gen)  # (B, T + 1)
    return inputs


def _loss_run(fn: Any, inputs: Inputs) -> Outputs:
    tokens = inputs["tokens"]
    loss = fn(_model(inputs), tokens.clone())
    differentiable = isinstance(loss, torch.Tensor) and loss.requires_grad
    return {"loss": as_tensor(loss, f"next_token_loss(model, tokens {fmt_shape(tokens.shape)})"),
            "differentiable": differentiable}


def _loss_reference(inputs: Inputs) -> Outputs:
    tokens = inputs["tokens"]
    with torch.no_grad():
        return {"loss": _lm_loss(_model(inputs), tokens[:, :-1], tokens[:, 1:]), "differentiable": True}


def _loss_mistakes(inputs: Inputs) -> dict[str, torch.Tensor]:
    model, tokens = _model(inputs), inputs["tokens"]
    x, y = tokens[:, :-1], tokens[:, 1:]  # each (B, T)
    with torch.no_grad():
        logits = model(x)  # (B, T, V)
        mistakes = {
            "the targets are not shifted: the target at position t is the next token, so x = tokens[:, :-1] and "
            "y = tokens[:, 1:]": _lm_loss(model, x, x),
            "x and y are swapped: the model reads x = tokens[:, :-1] and predicts y = tokens[:, 1:]":
                _lm_loss(model, y, x),
            "the logits went through a softmax first: F.cross_entropy takes the raw logits (it applies "
            "log_softmax itself)": F.cross_entropy(logits.softmax(-1).flatten(0, 1), y.flatten()),
            "the loss is summed over the B x T positions: average it (F.cross_entropy's default "
            "reduction='mean')": _lm_loss(model, x, y, reduction="sum"),
            "only the last position is scored: every position t predicts token t + 1":
                F.cross_entropy(logits[:, -1], y[:, -1]),
        }
        if tokens.size(1) <= inputs["config"].context_length:
            mistakes["the targets are not shifted: x and y are both the whole sequence; use x = tokens[:, :-1] "
                     "and y = tokens[:, 1:]"] = _lm_loss(model, tokens, tokens)
    return mistakes


def _loss_judge(got: Outputs, expected: Outputs, inputs: Inputs) -> None:
    loss = got["loss"]
    if loss.dim() != 0:
        raise fail(f"the loss has shape {fmt_shape(loss.shape)}, expected a single number (a 0-dim tensor): "
                   "average over all B x T positions, as F.cross_entropy(logits.flatten(0, 1), y.flatten()) does")
    check_close_lazily(loss, expected["loss"], "the loss", lambda: _loss_mistakes(inputs))
    if not got["differentiable"]:
        raise fail("the loss does not require grad: return the tensor computed from the model's logits (not "
                   "loss.item() or a detached copy), so that loss.backward() reaches the parameters")


_loss_case = case_family(_loss_run, _loss_reference, _loss_judge)


def _loss_hidden(seed: int) -> Inputs:
    r = sizes_rng(seed)
    h = r.choice([1, 2, 4])
    return _loss_inputs(_config(r.randint(20, 60), 8 * h, h, r.randint(1, 2), 16), r.randint(2, 5),
                        r.randint(2, 15), seed)


SMALL = _config(23, 16, 2, 1, 8)
register(
    _loss_case("07.loss.visible", "next_token_loss on tokens (B, T + 1) = (3, 7), V=23",
               lambda seed: _loss_inputs(SMALL, 3, 6, seed)),
    _loss_case("07.loss.hidden_single", "next_token_loss on one pair of tokens (B=1, T + 1 = 2)",
               lambda seed: _loss_inputs(_config(17, 12, 3, 1, 4), 1, 1, seed), hidden=True),
    _loss_case("07.loss.hidden_sizes", "next_token_loss with other sizes", _loss_hidden, hidden=True),
)

# ---- train_step(model, optimizer, tokens, grad_clip) -> the loss before the update


def _step_inputs(config: GPTConfig, b: int, t: int, steps: int, seed: int, momentum: float = 0.0,
                 weight_decay: float = 0.0) -> Inputs:
    gen = tensor_rng(seed)
    inputs = _model_inputs(config, gen)
    inputs |= {"batches": [torch.randint(0, config.vocab_size, (b, t + 1), generator=gen) for _ in range(steps)],
               "lr": 0.5, "grad_clip": 0.5, "momentum": momentum, "weight_decay": weight_decay}
    return inputs


def _optimizer(model: torch.nn.Module, inputs: Inputs) -> torch.optim.Optimizer:
    return torch.optim.SGD(model.parameters(), lr=inputs["lr"], momentum=inputs["momentum"],
                           weight_decay=inputs["weight_decay"])


def _flat(model: torch.nn.Module) -> torch.Tensor:
    return torch.cat([p.detach().flatten() for p in model.parameters()])


def _as_number(value: Any, what: str) -> float:
    if isinstance(value, torch.Tensor) and value.numel() == 1:
        return float(value.detach())
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        return float(value)
    raise fail(f"{what} returned {type(value).__name__}, expected the loss (a number or a 0-dim tensor)")


def _step_run(fn: Any, inputs: Inputs) -> Outputs:
    model = _model(inputs).train()
    optimizer = _optimizer(model, inputs)
    losses = [_as_number(fn(model, optimizer, tokens.clone(), inputs["grad_clip"]),
                         f"train_step(model, optimizer, tokens {fmt_shape(tokens.shape)}, grad_clip)")
              for tokens in inputs["batches"]]
    return {"losses": torch.tensor(losses, dtype=torch.float64), "parameters": _flat(model)}


def _train(inputs: Inputs, *, zero_grad: bool = True, clip: bool = True, shift: bool = True) -> Outputs:
    """What len(batches) training steps compute, right or with one of the usual mistakes."""
    model = _model(inputs).train()
    optimizer = _optimizer(model, inputs)
    losses = []
    for tokens in inputs["batches"]:
        x = tokens[:, :-1]  # (B, T)
        y = tokens[:, 1:] if shift else x  # (B, T)
        if zero_grad:
            optimizer.zero_grad()
        loss = _lm_loss(model, x, y)
        loss.backward()
        if clip:
            torch.nn.utils.clip_grad_norm_(model.parameters(), inputs["grad_clip"])
        optimizer.step()
        losses.append(loss.item())
    return {"losses": torch.tensor(losses, dtype=torch.float64), "parameters": _flat(model)}


def _step_reference(inputs: Inputs) -> Outputs:
    return _train(inputs)


STEP_MISTAKES = {
    "the gradients are not clipped: call torch.nn.utils.clip_grad_norm_(model.parameters(), grad_clip) after "
    "loss.backward() and before optimizer.step()": {"clip": False},
    "the gradients accumulate from one step to the next: call optimizer.zero_grad() before loss.backward(), or "
    "each step adds the old gradients to the new ones": {"zero_grad": False},
    "the targets are not shifted: the target at position t is the next token, tokens[:, t + 1]": {"shift": False},
}


def _step_judge(got: Outputs, expected: Outputs, inputs: Inputs) -> None:
    start = _flat(_model(inputs))
    if torch.equal(got["parameters"], start):
        raise fail("the parameters did not change: call loss.backward() and then optimizer.step() (in that order: "
                   "step() uses the gradients that backward() computed)")
    variants: dict[str, Outputs] = {}

    def mistakes(output: str) -> dict[str, torch.Tensor]:
        if not variants:
            variants.update({what: _train(inputs, **flags) for what, flags in STEP_MISTAKES.items()})
        return {what: v[output] for what, v in variants.items()}

    check_close_lazily(got["parameters"], expected["parameters"], "the parameters after training",
                       lambda: mistakes("parameters"))
    check_close_lazily(got["losses"], expected["losses"], "the returned losses (before each update)",
                       lambda: mistakes("losses"))


_step_case = case_family(_step_run, _step_reference, _step_judge)


register(
    _step_case("07.step.visible", "one train_step with SGD(lr=0.5), grad_clip=0.5, tokens (3, 7)",
               lambda seed: _step_inputs(SMALL, 3, 6, 1, seed)),
    _step_case("07.step.twice", "two train_steps in a row on two batches (gradients must not accumulate)",
               lambda seed: _step_inputs(SMALL, 3, 6, 2, seed)),
    _step_case("07.step.hidden_momentum", "three train_steps with momentum and weight decay, batch 1",
               lambda seed: _step_inputs(_config(31, 12, 3, 2, 10), 1, 9, 3, seed, momentum=0.9,
                                         weight_decay=0.01), hidden=True),
    _step_case("07.step.hidden_tied_rope", "two train_steps of a tied RoPE model with other sizes",
               lambda seed: _step_inputs(_config(29, 16, 4, 1, 12, position="rope", norm="rmsnorm", mlp="swiglu"),
                                         2, sizes_rng(seed).randint(3, 11), 2, seed), hidden=True),
)

# ---- next_token_probs(logits (B, V), temperature, top_k) -> probabilities (B, V)


def _filter_top_k(logits: torch.Tensor, k: int | None, strict: bool = False) -> torch.Tensor:
    """-inf outside the k largest logits of each row; `strict` also drops the k-th (the off-by-one mistake)."""
    if k is None:
        return logits
    kth = torch.topk(logits, min(k, logits.size(-1)), dim=-1).values[..., -1:]  # (B, 1)
    return logits.masked_fill(logits <= kth if strict else logits < kth, float("-inf"))


def _probs(logits: torch.Tensor, temperature: float, top_k: int | None) -> torch.Tensor:
    return _filter_top_k(logits / temperature, top_k).softmax(dim=-1)


def _probs_inputs(b: int, v: int, temperature: float, top_k: int | None, seed: int) -> Inputs:
    logits = torch.randn(b, v, generator=tensor_rng(seed)) * 2.0
    return {"logits": logits, "temperature": temperature, "top_k": top_k, "sizes": {"B": b, "V": v}}


def _probs_what(inputs: Inputs) -> str:
    return (f"next_token_probs(logits {fmt_shape(inputs['logits'].shape)}, temperature={inputs['temperature']}, "
            f"top_k={inputs['top_k']})")


def _probs_run(fn: Any, inputs: Inputs) -> Outputs:
    out = fn(inputs["logits"].clone(), temperature=inputs["temperature"], top_k=inputs["top_k"])
    return {"probs": as_tensor(out, _probs_what(inputs))}


def _probs_reference(inputs: Inputs) -> Outputs:
    return {"probs": _probs(inputs["logits"], inputs["temperature"], inputs["top_k"])}


def probs_mistakes(logits: torch.Tensor, temperature: float, top_k: int | None) -> dict[str, torch.Tensor]:
    """What common wrong temperature / top-k samplers give as next-token probabilities (B, V)."""
    k, tau = top_k, temperature
    mistakes = {
        "the temperature is applied after the softmax: divide the logits by it first, softmax(logits / "
        "temperature)": _filter_top_k(logits, k).softmax(-1) / tau,
        "the temperature is not applied: divide the logits by it before the softmax":
            _filter_top_k(logits, k).softmax(-1),
        "the logits are multiplied by the temperature: divide them, so that a temperature below 1 sharpens the "
        "distribution": _filter_top_k(logits * tau, k).softmax(-1),
        "the softmax runs over the batch axis: each row (one sequence) is a distribution over the V tokens, "
        "softmax(dim=-1)": _filter_top_k(logits / tau, k).softmax(0),
    }
    if k is not None:
        kept = _filter_top_k(logits / tau, k).isfinite()
        mistakes |= {
            "top-k keeps k - 1 tokens: mask only the logits *below* the k-th largest (logits < kth), keep the "
            "k-th itself": _filter_top_k(logits / tau, k, strict=True).softmax(-1),
            "top-k keeps k + 1 tokens: the k-th largest is torch.topk(logits, k).values[..., -1:], the last of "
            "the k": _filter_top_k(logits / tau, k + 1).softmax(-1),
            "the tokens outside the top k are set to 0, not -inf: exp(0) still gives them probability":
                (logits / tau).masked_fill(~kept, 0.0).softmax(-1),
            "the probabilities outside the top k are zeroed after the softmax without renormalising: set those "
            "logits to -inf before the softmax, so the k left sum to 1": (logits / tau).softmax(-1) * kept,
        }
    return mistakes


def _probs_judge(got: Outputs, expected: Outputs, inputs: Inputs) -> None:
    check_shape(got["probs"], "B V", inputs["sizes"], "the probabilities")
    empty = got["probs"].isnan().all(dim=-1)
    if inputs["top_k"] is not None and bool(empty.any()):
        raise fail(f"the probabilities: row {int(empty.nonzero()[0])} is all NaN, every logit was masked: top-k "
                   "keeps the k largest, so mask only the logits below the k-th largest (logits < kth, not <=)")
    check_close(got["probs"], expected["probs"], "the probabilities", atol=1e-6,
                mistakes=probs_mistakes(inputs["logits"], inputs["temperature"], inputs["top_k"]))


_probs_case = case_family(_probs_run, _probs_reference, _probs_judge)


def _probs_hidden(seed: int) -> Inputs:
    r = sizes_rng(seed)
    v = r.randint(20, 60)
    return _probs_inputs(r.randint(2, 5), v, round(r.uniform(0.3, 2.5), 2), r.randint(2, v - 1), seed)


register(
    _probs_case("07.probs.visible", "next_token_probs of logits (3, 12) at temperature 0.7, no top-k",
                lambda seed: _probs_inputs(3, 12, 0.7, None, seed)),
    _probs_case("07.probs.top_k", "next_token_probs of logits (3, 12) at temperature 1.5 with top_k=4",
                lambda seed: _probs_inputs(3, 12, 1.5, 4, seed)),
    _probs_case("07.probs.hidden_single", "next_token_probs with batch 1 and top_k=1 (greedy by filtering)",
                lambda seed: _probs_inputs(1, 9, 1.0, 1, seed), hidden=True),
    _probs_case("07.probs.hidden_all", "next_token_probs with top_k = V (nothing filtered)",
                lambda seed: _probs_inputs(2, 7, 0.5, 7, seed), hidden=True),
    _probs_case("07.probs.hidden_sizes", "next_token_probs with other sizes, temperatures and k", _probs_hidden,
                hidden=True),
)

# ---- sample_next_token(model, idx, temperature, top_k, generator) -> (B, 1)


def _sample_inputs(config: GPTConfig, b: int, t: int, temperature: float, top_k: int | None, seed: int) -> Inputs:
    gen = tensor_rng(seed)
    inputs = _model_inputs(config, gen)
    inputs |= {"idx": torch.randint(0, config.vocab_size, (b, t), generator=gen), "temperature": temperature,
               "top_k": top_k, "sample_seed": seed}
    return inputs


def _sample_what(inputs: Inputs) -> str:
    return (f"sample_next_token(model, idx {fmt_shape(inputs['idx'].shape)}, temperature={inputs['temperature']}, "
            f"top_k={inputs['top_k']}, generator)")


def _sample_run(fn: Any, inputs: Inputs) -> Outputs:
    generator = torch.Generator().manual_seed(inputs["sample_seed"])
    with torch.no_grad():
        out = fn(_model(inputs), inputs["idx"].clone(), temperature=inputs["temperature"], top_k=inputs["top_k"],
                 generator=generator)
    return {"next_id": as_tensor(out, _sample_what(inputs))}


def _draw(logits: torch.Tensor, inputs: Inputs, **changes: Any) -> torch.Tensor:
    """One token per row from last-position logits (B, V), with the case's seeded generator."""
    settings = {"temperature": inputs["temperature"], "top_k": inputs["top_k"]} | changes
    if settings["temperature"] == 0:
        return logits.argmax(dim=-1, keepdim=True)  # (B, 1)
    probs = _probs(logits, settings["temperature"], settings["top_k"])
    return torch.multinomial(probs, 1, generator=torch.Generator().manual_seed(inputs["sample_seed"]))  # (B, 1)


def _last_logits(inputs: Inputs, position: int = -1) -> torch.Tensor:
    window = inputs["idx"][:, -inputs["config"].context_length:]  # at most T_max tokens fit the model
    with torch.no_grad():
        return _model(inputs)(window)[:, position]  # (B, V)


def _sample_reference(inputs: Inputs) -> Outputs:
    return {"next_id": _draw(_last_logits(inputs), inputs)}


def _sample_judge(got: Outputs, expected: Outputs, inputs: Inputs) -> None:
    next_id, b = got["next_id"], inputs["idx"].size(0)
    if tuple(next_id.shape) != (b, 1):
        raise fail(f"the next tokens have shape {fmt_shape(next_id.shape)}, expected (B, 1) = ({b}, 1), one id per "
                   "sequence, ready for torch.cat([idx, next_id], dim=1): torch.multinomial(probs, 1) and "
                   "argmax(dim=-1, keepdim=True) give that shape")
    check_dtype(next_id, torch.int64, "the next tokens", "token ids are torch.long")
    logits = _last_logits(inputs)
    mistakes = {"the logits of the first position were used: the next token follows the *last* position, "
                "logits[:, -1]": _draw(_last_logits(inputs, position=0), inputs)}
    if inputs["temperature"] > 0:
        mistakes |= {
            "the most likely token was taken (argmax): at temperature > 0, draw from the probabilities with "
            "torch.multinomial(probs, 1, generator=generator)": _draw(logits, inputs, temperature=0),
            "temperature and top-k were not applied: use next_token_probs(logits, temperature, top_k)":
                _draw(logits, inputs, temperature=1.0, top_k=None),
        }
    check_close(next_id, expected["next_id"], "the next tokens", atol=0, rtol=0, mistakes=mistakes)


_sample_case = case_family(_sample_run, _sample_reference, _sample_judge)


SAMPLER = _config(40, 16, 2, 1, 8)
register(
    _sample_case("07.sample.greedy", "sample_next_token at temperature 0 (greedy) on idx (5, 6)",
                 lambda seed: _sample_inputs(SAMPLER, 5, 6, 0.0, None, seed)),
    _sample_case("07.sample.visible", "sample_next_token at temperature 0.8 with top_k=5 on idx (6, 4)",
                 lambda seed: _sample_inputs(SAMPLER, 6, 4, 0.8, 5, seed)),
    _sample_case("07.sample.hidden_single", "sample_next_token on a single token (B=1, T=1), temperature 1.3",
                 lambda seed: _sample_inputs(SAMPLER, 1, 1, 1.3, None, seed), hidden=True),
    _sample_case("07.sample.hidden_long", "sample_next_token on idx longer than the context (crop to the last "
                 "context_length tokens)", lambda seed: _sample_inputs(SAMPLER, 4, 11, 1.0, 10, seed), hidden=True),
    # One draw per row can agree with the right one by chance, whatever the probabilities: 64 rows at a high
    # temperature make a wrong temperature show in every student's draws, not only in some.
    _sample_case("07.sample.hidden_many", "sample_next_token on 64 sequences at temperature 1.5",
                 lambda seed: _sample_inputs(SAMPLER, 64, 3, 1.5, None, seed), hidden=True),
)
