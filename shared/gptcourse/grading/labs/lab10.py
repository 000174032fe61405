"""Lab 10, finetuning and rewards: `padding_mask(attention_mask)`, `last_real_token(hidden, attention_mask)`,
`response_labels(input_ids, prompt_lengths, attention_mask)`, `bradley_terry_loss(chosen, rejected)` and the class
`LoRALinear(base, rank, alpha)`.

Every piece works on tensors alone (no model), so the cases are fast. Padded batches are drawn with padding on the
right, on the left, and (hidden) mixed, with one row unpadded. The references are gptcourse's functions and class
of the same names, which the lab forbids.
"""

from __future__ import annotations

import math
from functools import partial
from typing import Any

import torch
from torch import nn
from torch.nn import functional as F
from torch.overrides import TorchFunctionMode

from ...checks import (
    LOG_EPSILONS,
    Mistake,
    check_close,
    check_dtype,
    check_shape,
    eps_in_log_mistakes,
    fail,
    fmt_shape,
    mistake_key,
)
from ...finetuning.lora import LoRALinear
from ...finetuning.losses import IGNORE_INDEX, bradley_terry_loss, response_labels
from ...model.causal_attention import causal_mask, padding_mask
from ...model.heads import last_real_token
from ..cases import Inputs, Outputs, sized, sizes_rng, tensor_rng
from ..fixtures import TILED_ATTENTION, check_differentiable, check_scalar_loss, loss_outputs
from ..piece import Piece, declare
from ..student import as_tensor, describe_mask, load_weights, module_class, returns


def _lengths_mask(lengths: list[int], t: int, sides: list[str]) -> torch.Tensor:
    """(B, T) attention mask, 1 on each row's `lengths[b]` real tokens, padded on `sides[b]`."""
    mask = torch.zeros(len(lengths), t, dtype=torch.long)
    for b, (n, side) in enumerate(zip(lengths, sides, strict=True)):
        mask[b, slice(0, n) if side == "right" else slice(t - n, t)] = 1
    return mask


def _padded_mask(b: int, t: int, side: str, seed: int) -> torch.Tensor:
    """B rows in a random order: one of full length T, the others shorter (1..T-1 real tokens), padded on `side`;
    "mixed" pads the shorter rows on the right and on the left in turn, so both kinds are there from B = 3."""
    r = sizes_rng(seed)
    rows = [(t, "right")] + [(r.randint(1, t - 1), side if side != "mixed" else ("right", "left")[i % 2])
                             for i in range(b - 1)]
    r.shuffle(rows)
    return _lengths_mask([n for n, _ in rows], t, [s for _, s in rows])


# ---- padding_mask(attention_mask (B, T)) -> (B, 1, T, T) bool


def _mask_inputs(b: int, t: int, side: str, seed: int) -> Inputs:
    return {"mask": _padded_mask(b, t, side, seed), "sizes": {"B": b, "T": t}}


def _mask_mistakes(inputs: Inputs) -> dict[str, torch.Tensor]:
    mask = inputs["mask"]
    t = mask.size(1)
    real_key, real_query = mask.bool()[:, None, None, :], mask.bool()[:, None, :, None]
    itself, causal = torch.eye(t, dtype=torch.bool), causal_mask(t)
    return {
        Mistake("10.mask_not_causal", "it is not causal: combine the padding with the causal mask (key j <= query "
                                      "i), or real tokens see the future"): real_key | itself,
        Mistake("10.mask_pad_queries", "it masks the pad *queries* instead of the pad *keys*: a real query must not "
                                       "look at a pad key, so index the attention mask along the last axis, "
                                       "attention_mask[:, None, None, :]"): causal & (real_query | itself),
        Mistake("10.mask_inverted", "True and False are swapped for the padding: True marks a real token "
                                    "(attention_mask == 1) that may be attended to"): causal & (~real_key | itself),
        Mistake("10.mask_pad_query_sees_nothing", "a pad query sees nothing at all: its row is all False, and a "
                                                  "softmax over a row of -inf is NaN (which reaches the gradients). "
                                                  "Let every position attend to itself: | torch.eye(T, "
                                                  "dtype=torch.bool)"):
            causal & real_key,
    }


def _mask_judge(got: Outputs, expected: Outputs, inputs: Inputs) -> None:
    allowed, want, mask = got["allowed"], expected["allowed"], inputs["mask"]
    check_dtype(allowed, torch.bool, "the mask", "True where query i may attend to key j, the convention of "
                                                 "F.scaled_dot_product_attention's boolean attn_mask")
    if allowed.dim() == 3:
        raise fail(f"the mask has shape {fmt_shape(allowed.shape)}, expected (B, 1, T, T): keep a size-1 axis for "
                   "the heads, so that it broadcasts against scores (B, H, T, T), "
                   "e.g. attention_mask[:, None, None, :]", mistake="10.mask_no_head_axis")
    check_shape(allowed, "B 1 T T", inputs["sizes"], "the mask")
    if torch.equal(allowed, want):
        return
    for what, wrong in _mask_mistakes(inputs).items():
        if torch.equal(allowed, wrong.expand_as(allowed)):
            raise fail(f"the mask: {what}.", mistake_key(what))
    diff = (allowed != want).nonzero()
    b, _, i, j = (int(v) for v in diff[0])
    raise fail(f"the mask: {len(diff)} of {allowed.numel()} entries are wrong, e.g. [{b}, 0, {i}, {j}] is "
               f"{bool(allowed[b, 0, i, j])}, expected {bool(want[b, 0, i, j])} (row {b} of the attention mask is "
               f"{mask[b].tolist()}): query i may attend to key j when j <= i and key j is real, and every position "
               "to itself.")


# ---- last_real_token(hidden (B, T, C), attention_mask (B, T)) -> (B, C)


def _gather(hidden: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
    return hidden[torch.arange(hidden.size(0)), positions]  # (B, C)


def _pool_inputs(b: int, t: int, c: int, side: str, seed: int) -> Inputs:
    return {"hidden": torch.randn(b, t, c, generator=tensor_rng(seed)), "mask": _padded_mask(b, t, side, seed),
            "sizes": {"B": b, "T": t, "C": c}}


def _pool_mistakes(inputs: Inputs) -> dict[str, torch.Tensor]:
    hidden, mask = inputs["hidden"], inputs["mask"]
    first_real = torch.tensor([int(row.nonzero().min()) for row in mask])
    last_real = torch.tensor([int(row.nonzero().max()) for row in mask])
    return {
        Mistake("10.pool_position_minus_one", "position -1 was read: in a right-padded batch that is a pad for "
                                              "every sequence but the longest. Read each row at its last real token "
                                              "(the rightmost 1 of its attention mask)"): hidden[:, -1],
        Mistake("10.pool_mask_sum", "the last real token was taken at attention_mask.sum(-1) - 1: that is right "
                                    "only when the padding is on the right. With left padding the last real token "
                                    "is at T - 1; find the rightmost 1 of each row instead, e.g. (torch.arange(T) * "
                                    "attention_mask).argmax(-1)"): _gather(hidden, (mask.sum(-1) - 1).clamp(min=0)),
        Mistake("10.pool_first_real", "the first real token was read: only the last real token has attended to the "
                                      "whole sequence"):
            _gather(hidden, first_real),
        Mistake("10.pool_row_index", "the row index is not the batch index: hidden[last % B, last] (or hidden[last, "
                                     "last]) reads row last[b] for sequence b. Pair each row with its own position, "
                                     "hidden[torch.arange(B), last]"):
            hidden[last_real % hidden.size(0), last_real],
        Mistake("10.pool_averaged", "the states were averaged: read the one state of the last real token"):
            (hidden * mask[..., None]).sum(1)
            / mask.sum(1, keepdim=True),
    }


# ---- response_labels(input_ids (B, T), prompt_lengths (B,), attention_mask (B, T)) -> labels (B, T)


def _labels_inputs(b: int, t: int, side: str, seed: int) -> Inputs:
    mask = _padded_mask(b, t, side, seed)
    gen = tensor_rng(seed)
    ids = torch.randint(1, 50, (b, t), generator=gen).masked_fill(mask == 0, 0)  # pads are id 0
    lengths = mask.sum(-1)
    prompt = torch.tensor([int(torch.randint(0, int(n), (1,), generator=gen)) for n in lengths])  # < length
    return {"ids": ids, "mask": mask, "prompt": prompt, "sizes": {"B": b, "T": t}}


def _labels_mistakes(inputs: Inputs) -> dict[str, torch.Tensor]:
    ids, mask, prompt = inputs["ids"], inputs["mask"], inputs["prompt"][:, None]
    real, index = mask.bool(), mask.cumsum(-1) - mask  # (B, T): how many real tokens come before each position

    def keeping(kept: torch.Tensor, fill: int = IGNORE_INDEX) -> torch.Tensor:
        return ids.masked_fill(~kept, fill)

    return {
        Mistake("10.labels_mask_response", "the response is masked instead of the prompt: the model must learn to "
                                           "produce the response, so -100 goes on the prompt (and the padding), and "
                                           "the response keeps its token ids"): keeping((index < prompt) & real),
        Mistake("10.labels_padding_kept", "the padding is not masked: pads are not text to learn, give them -100 too"):
            keeping(~((index < prompt) & real)),
        Mistake("10.labels_fill_zero", "the masked positions hold 0: F.cross_entropy skips targets equal to -100 "
                                       "(its ignore_index), 0 is a token id it would learn"):
            keeping((index >= prompt) & real, fill=0),
        Mistake("10.labels_last_prompt_kept", "the last prompt token is kept: the first prompt_lengths[b] real "
                                              "tokens of row b are the prompt"):
            keeping((index >= prompt - 1) & real),
        Mistake("10.labels_first_response_masked", "the first response token is masked: the response starts right "
                                                   "after the prompt_lengths[b] prompt tokens"):
            keeping((index > prompt) & real),
        Mistake("10.labels_prompt_from_zero", "the prompt was counted from position 0 of the row: with left padding "
                                              "the prompt starts after the pads, so count real tokens "
                                              "(attention_mask.cumsum(-1) - 1 is each real token's index in its "
                                              "sequence)"):
            keeping((torch.arange(ids.size(1))[None, :] >= prompt) & real),
        Mistake("10.labels_shifted", "the labels are shifted by one: labels[:, t] is the token at t itself (or "
                                     "-100); the loss does the shift, comparing logits[:, t] with labels[:, t + 1]"):
            F.pad(keeping((index >= prompt) & real)[:, 1:], (0, 1),
                                                             value=IGNORE_INDEX),
    }


# ---- bradley_terry_loss(chosen (B,), rejected (B,)) -> mean of -log sigmoid(chosen - rejected)


def _bt_inputs(b: int, scale: float, seed: int) -> Inputs:
    gen = tensor_rng(seed)
    chosen, rejected = torch.randn(b, generator=gen) * scale, torch.randn(b, generator=gen) * scale
    if scale > 50:  # one pair far the wrong way round: sigmoid(chosen - rejected) underflows to 0
        rejected[0] = chosen[0] + 2 * scale
    return {"chosen": chosen, "rejected": rejected}


# what students clamp a probability to before its log: the eps they add inside it, and float32's own
CLAMPS = (*LOG_EPSILONS, 1e-7, torch.finfo(torch.float32).eps, torch.finfo(torch.float32).tiny)


def _bt_call(fn: Any, inputs: Inputs) -> Outputs:
    chosen = inputs["chosen"].clone().requires_grad_(True)
    rejected = inputs["rejected"].clone().requires_grad_(True)
    return loss_outputs(fn(chosen, rejected),
                        f"bradley_terry_loss(chosen {fmt_shape(chosen.shape)}, rejected {fmt_shape(rejected.shape)})")


def _bt_judge(got: Outputs, expected: Outputs, inputs: Inputs) -> None:
    loss = got["loss"]
    check_scalar_loss(loss, "average over the pairs with .mean()")
    if not bool(torch.isfinite(loss)):
        raise fail("the loss is inf or NaN: for a large negative difference sigmoid(d) rounds to 0 and log(0) is "
                   "-inf. Use F.logsigmoid(d), which computes log sigmoid(d) without forming sigmoid(d)",
                   mistake="10.bt_log_of_sigmoid")
    check_close(loss.double(), expected["loss"].double(), "the loss", atol=1e-5,
                mistakes=partial(_bt_mistakes, inputs))
    check_differentiable(got["differentiable"], "return the tensor computed from the rewards (not .item() or a "
                         "detached copy), so that loss.backward() reaches the reward model")


def _bt_mistakes(inputs: Inputs) -> dict[str, torch.Tensor]:
    """The losses the usual mistakes give ({why: loss}), for a loss that is wrong."""
    chosen, rejected = inputs["chosen"], inputs["rejected"]
    d = chosen - rejected
    return {
        Mistake("10.bt_swapped", "chosen and rejected are swapped: the loss is small when the chosen answer's "
                                 "reward is the larger, -log sigmoid(chosen - rejected)"):
            -F.logsigmoid(rejected - chosen).mean(),
        Mistake("10.bt_no_minus", "the minus sign is missing: minimise -log sigmoid(chosen - rejected), the "
                                  "negative log-likelihood"):
            F.logsigmoid(d).mean(),
        Mistake("10.bt_no_log", "the log is missing: the loss is -log sigmoid(chosen - rejected)"):
            -torch.sigmoid(d).mean(),
        Mistake("10.bt_summed", "the loss is summed over the pairs: average it with .mean()"): -F.logsigmoid(d).sum(),
        Mistake("10.bt_mean_before_log_sigmoid", "the differences were averaged before the log-sigmoid: the loss is "
                                                 "the mean of each pair's -log sigmoid(chosen - rejected)"):
            -F.logsigmoid(d.mean()),
    } | eps_in_log_mistakes(torch.sigmoid(d), "sigmoid(d)", "pair", "for a pair far the wrong way round sigmoid(d) "
                            "is 0 in float32. Use F.logsigmoid(d), which never forms sigmoid(d)") | {
        Mistake("10.bt_clamped_before_log", f"sigmoid(d) was clamped to at least {eps:g} before the log: finite, "
                f"but it caps each pair's loss at -log({eps:g}) = {-math.log(eps):.1f} and gives that pair no "
                "gradient. Use F.logsigmoid(d), which never forms sigmoid(d)"):
            -torch.sigmoid(d).clamp(min=eps).log().mean() for eps in CLAMPS}


# ---- LoRALinear(base: nn.Linear, rank, alpha): base(x) + (alpha / rank) x A^T B^T, base frozen, B = 0 at first


def _lora_inputs(d_in: int, d_out: int, rank: int, alpha: float, x_shape: tuple[int, ...], seed: int) -> Inputs:
    gen = tensor_rng(seed)
    return {"base": {"weight": torch.randn(d_out, d_in, generator=gen) / math.sqrt(d_in),
                     "bias": torch.randn(d_out, generator=gen) * 0.1},
            "A": torch.randn(rank, d_in, generator=gen) / math.sqrt(d_in),
            "B": torch.randn(d_out, rank, generator=gen) * 0.5,
            "x": torch.randn(*x_shape, d_in, generator=gen), "rank": rank, "alpha": alpha}


def _base_linear(inputs: Inputs) -> nn.Linear:
    weight = inputs["base"]["weight"]
    with torch.random.fork_rng(devices=[]):
        base = nn.Linear(weight.size(1), weight.size(0))
    with torch.no_grad():
        base.weight.copy_(weight)
        base.bias.copy_(inputs["base"]["bias"])
    return base


def _lora_call(cls: Any, inputs: Inputs) -> Outputs:
    d_out, d_in = inputs["base"]["weight"].shape
    what = f"LoRALinear(nn.Linear({d_in}, {d_out}), rank={inputs['rank']}, alpha={inputs['alpha']})"
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(0)
        layer = module_class(cls, what)(_base_linear(inputs), inputs["rank"], inputs["alpha"])
    x = inputs["x"]
    with torch.no_grad():
        at_init = as_tensor(layer(x.clone()), f"{what} on x {fmt_shape(x.shape)}")
    trainable = sorted(name for name, p in layer.named_parameters() if p.requires_grad)
    params = dict(layer.named_parameters())
    a_is_zero = "A" in params and not bool(params["A"].detach().any())
    load_weights(layer, {"base.weight": inputs["base"]["weight"], "base.bias": inputs["base"]["bias"],
                         "A": inputs["A"], "B": inputs["B"]}, what)
    full = _FullMatrices((d_out, d_in))
    with full:
        out = layer(x.clone())
    as_tensor(out, what)
    out.square().sum().backward()
    grads = {f"grad_{name}": as_tensor(params[name].grad, name) if params[name].grad is not None else torch.zeros(0)
             for name in ("A", "B")}
    return {"at_init": at_init, "trainable": " ".join(trainable), "a_is_zero": a_is_zero,
            "out": as_tensor(out, what), "full_matrices": full.count, **grads}


class _FullMatrices(TorchFunctionMode):
    """Counts the torch calls of a forward that return a tensor of `shape`, the base weight's (out, in): LoRA's
    update x A^T B^T never forms one (x is 3-D or has a batch row count other than out_features here)."""

    def __init__(self, shape: tuple[int, int]) -> None:
        super().__init__()
        self.shape, self.count = shape, 0

    def __torch_function__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        result = func(*args, **(kwargs or {}))
        self.count += isinstance(result, torch.Tensor) and tuple(result.shape) == self.shape
        return result


def _lora_forward(inputs: Inputs, scaling: float, a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    base = inputs["base"]
    return inputs["x"] @ base["weight"].T + base["bias"] + scaling * (inputs["x"] @ a.T @ b.T)


def _lora_judge(got: Outputs, expected: Outputs, inputs: Inputs) -> None:
    x_shape = tuple(inputs["x"].shape)
    d_out = inputs["base"]["weight"].size(0)
    if tuple(got["at_init"].shape) != (*x_shape[:-1], d_out):
        raise fail(f"the output has shape {fmt_shape(got['at_init'].shape)}, expected "
                   f"{fmt_shape((*x_shape[:-1], d_out))}: like the base layer's, (..., out_features)")
    base = [name for name in got["trainable"].split() if name.startswith("base.")]
    if base:
        raise fail(f"the base layer is trainable ({', '.join(base)}): freeze the whole layer "
                   "(base.requires_grad_(False) freezes its weight and its bias), so that only A and B learn",
                   mistake="10.lora_base_trainable")
    if got["trainable"] != "A B":
        raise fail(f"the trainable parameters are [{got['trainable']}], expected [A B]")
    if got["a_is_zero"]:
        raise fail("A starts at zero: with A = B = 0 neither ever gets a gradient (each one's gradient is a product "
                   "with the other). Start A random and only B at zero", mistake="10.lora_a_zero")
    if not torch.allclose(got["at_init"], expected["at_init"], atol=1e-5):
        raise fail("a fresh LoRALinear does not compute what the base layer computes: B must start at zero "
                   "(torch.zeros(out_features, rank)), so that finetuning starts from the pretrained model exactly",
                   mistake="10.lora_b_not_zero")
    check_close(got["out"], expected["out"], "the output with A and B loaded", atol=1e-4,
                mistakes=partial(_lora_mistakes, inputs))
    for name in ("A", "B"):
        check_close(got[f"grad_{name}"], expected[f"grad_{name}"], f"the gradient of {name}", atol=1e-3)
    if got["full_matrices"]:
        d_out, d_in = inputs["base"]["weight"].shape
        raise fail(f"the output and gradients are right, but forward built a full (out_features, in_features) = "
                   f"({d_out}, {d_in}) matrix (B @ A, or W + scale * B @ A): that is the matrix LoRA exists to avoid "
                   "(its memory and its gradient are the full layer's). Keep the update low-rank, "
                   "base(x) + scale * (x @ A.T) @ B.T, whose middle is (..., rank)", mistake="10.lora_full_matrix")


def _lora_mistakes(inputs: Inputs) -> dict[str, torch.Tensor]:
    """The outputs the usual mistakes of scale and base give ({why: output}), for an output that is wrong."""
    r, alpha = inputs["rank"], inputs["alpha"]
    a, b = inputs["A"], inputs["B"]
    return {
        Mistake("10.lora_scaled_by_alpha",
                f"the update is scaled by alpha = {alpha}: scale it by alpha / rank = {alpha / r:g}"):
            _lora_forward(inputs, alpha, a, b),
        Mistake("10.lora_unscaled",
            f"the update is not scaled: multiply it by alpha / rank = {alpha / r:g}"): _lora_forward(inputs, 1.0, a, b),
        Mistake("10.lora_rank_over_alpha",
                f"the update is scaled by rank / alpha: the scale is alpha / rank = {alpha / r:g}"):
            _lora_forward(inputs, r / alpha, a, b),
        Mistake("10.lora_rslora",
                f"the update is scaled by alpha / sqrt(rank) = {alpha / math.sqrt(r):g}, rank-stabilised LoRA's scale "
        f"(PEFT's use_rslora): this layer is the original LoRA, scaled by alpha / rank = {alpha / r:g}"):
            _lora_forward(inputs, alpha / math.sqrt(r), a, b),
        Mistake("10.lora_no_base", "the base layer's output is missing: y = base(x) + (alpha / rank) x A^T B^T"):
            _lora_forward(inputs, alpha / r, a, b) - _lora_forward(inputs, 0.0, a, b),
    }


PIECES = declare(
    Piece("10", "padding_mask", padding_mask,
          returns("allowed", lambda i: f"padding_mask({describe_mask(i['mask'])})", "mask"), judge=_mask_judge,
          forbidden=("gptcourse.padding_mask", "gptcourse.GPT", "gptcourse.model.gpt", *TILED_ATTENTION),
          visible=[("visible", "padding_mask of a right-padded batch (B, T) = (3, 5)",
                    lambda seed: _mask_inputs(3, 5, "right", seed)),
                   ("left", "padding_mask of a left-padded batch (B, T) = (3, 6)",
                    lambda seed: _mask_inputs(3, 6, "left", seed))],
          hidden=[("hidden_single", "padding_mask of one unpadded sequence (B=1): the causal mask",
                   lambda seed: _mask_inputs(1, 4, "right", seed)),
                  ("hidden_mixed", "padding_mask with other sizes, rows padded on either side",
                   sized(lambda r, seed: _mask_inputs(r.randint(3, 5), r.randint(2, 9), "mixed", seed)))]),
    Piece("10", "last_real_token", last_real_token,
          returns("pooled", lambda i: f"last_real_token(hidden {fmt_shape(i['hidden'].shape)}, "
                  f"{describe_mask(i['mask'])})", "hidden", "mask"), mistakes=_pool_mistakes, label="the pooled states",
          shape="B C", atol=1e-6, forbidden=("gptcourse.last_real_token", "gptcourse.model.heads"),
          visible=[("visible", "last_real_token of a right-padded batch, hidden (B, T, C) = (4, 6, 5)",
                    lambda seed: _pool_inputs(4, 6, 5, "right", seed)),
                   ("left", "last_real_token of a left-padded batch, hidden (B, T, C) = (3, 5, 4)",
                    lambda seed: _pool_inputs(3, 5, 4, "left", seed))],
          hidden=[("hidden_mixed", "last_real_token with other sizes, rows padded on either side",
                   sized(lambda r, seed: _pool_inputs(r.randint(3, 5), r.randint(2, 9), r.randint(3, 7), "mixed",
                                                      seed)))]),
    Piece("10", "response_labels", response_labels,
          returns("labels", lambda i: f"response_labels(input_ids {fmt_shape(i['ids'].shape)}, prompt_lengths="
                  f"{i['prompt'].tolist()}, {describe_mask(i['mask'])})", "ids", "prompt", "mask"),
          mistakes=_labels_mistakes, label="the labels",
          shape="B T", dtype=(torch.int64, "token ids (and -100) for F.cross_entropy"), atol=0, rtol=0,
          forbidden=("gptcourse.response_labels", "gptcourse.finetuning.losses"),
          visible=[("visible", "response_labels of a right-padded batch (B, T) = (4, 8)",
                    lambda seed: _labels_inputs(4, 8, "right", seed)),
                   ("left", "response_labels of a left-padded batch (B, T) = (3, 7)",
                    lambda seed: _labels_inputs(3, 7, "left", seed))],
          hidden=[("hidden_mixed", "response_labels with other sizes, rows padded on either side",
                   sized(lambda r, seed: _labels_inputs(r.randint(3, 5), r.randint(3, 10), "mixed", seed)))]),
    Piece("10", "bradley_terry_loss", bradley_terry_loss, _bt_call, judge=_bt_judge,
          forbidden=("gptcourse.bradley_terry_loss", "gptcourse.finetuning.losses", "gptcourse.finetuning.dpo"),
          visible=[("visible", "bradley_terry_loss of 6 pairs of rewards", lambda seed: _bt_inputs(6, 1.5, seed)),
                   ("large", "bradley_terry_loss with rewards of size 100, one pair far the wrong way round (sigmoid "
                             "rounds to 0: log-sigmoid needed)", lambda seed: _bt_inputs(5, 100.0, seed))],
          hidden=[("hidden_large", "bradley_terry_loss with rewards of size 100 (sigmoid rounds to 0 or 1)",
                   lambda seed: _bt_inputs(5, 100.0, seed)),
                  ("hidden_sizes", "bradley_terry_loss with other sizes, a single pair among them",
                   sized(lambda r, seed: _bt_inputs(r.randint(1, 12), r.uniform(0.5, 3.0), seed)))]),
    Piece("10", "LoRALinear", LoRALinear, _lora_call, judge=_lora_judge,
          forbidden=("gptcourse.LoRALinear", "gptcourse.finetuning.lora"),
          visible=[("visible", "LoRALinear(nn.Linear(6, 5), rank=2, alpha=4) on x (3, 6)",
                    lambda seed: _lora_inputs(6, 5, 2, 4.0, (3,), seed)),
                   ("sequence", "LoRALinear(nn.Linear(8, 12), rank=4, alpha=8) on x (2, 5, 8)",
                    lambda seed: _lora_inputs(8, 12, 4, 8.0, (2, 5), seed))],
          hidden=[("hidden_rank_one", "LoRALinear with rank 1 on a single vector",
                   lambda seed: _lora_inputs(7, 3, 1, 2.0, (1,), seed)),
                  ("hidden_sizes", "LoRALinear with other sizes, ranks and alphas",
                   sized(lambda r, seed: _lora_inputs(r.randint(3, 12), r.randint(3, 12), r.randint(1, 3),
                                                      float(r.choice([1, 4, 16])), (r.randint(1, 3), r.randint(1, 5)),
                                                      seed)))]),
)
