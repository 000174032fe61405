"""Lab 16, mixture of experts: `route(router_logits, top_k)`, `dispatch_combine(x, weights, experts, expert_fns)`,
`load_balancing_loss(router_logits, top_k, attention_mask)` and `moe_parameter_counts(config)`.

A routing is compared as a dense (N, E) matrix of weights (0 where an expert is not chosen), so the order of a
token's k experts does not matter. `dispatch_combine` is given its experts as opaque functions that count the
tokens they are called on: each expert must see exactly the tokens routed to it, never all of them (the dense
computation gives the right numbers at E / k times the cost). Its reference is a slow loop, token by token (the
package's `MoE` routes by itself); the loss's wraps gptcourse's, which takes the number of experts as well. The
counts' reference is gptcourse.GPT's tensors on the meta device, its active count less the experts a token skips.
"""

from __future__ import annotations

import math
import random
from typing import Any

import torch
from torch.nn import functional as F

from ...checks import Mistake, fail, fmt_shape, mistake_key
from ...model.config import GPTConfig, MoESpec
from ...model.gpt import GPT
from ...model.load_balancing import load_balancing_loss
from ...model.mixture_of_experts import MoE, top_k_routing
from ..cases import Inputs, Outputs, sized, tensor_rng
from ..fixtures import check_close_lazily
from ..piece import Piece, Rows, declare
from ..student import TensorsMade, as_number, as_tensor

# Each piece forbids its own references: a student who imports one loses that piece alone. MoE both routes and
# dispatches, so it costs both pieces; its module defines top_k_routing as well, so the module is the router's alone.
_ROUTE = ("gptcourse.top_k_routing", "gptcourse.MoE", "gptcourse.model.mixture_of_experts")
_DISPATCH = ("gptcourse.MoE",)
_BALANCE = ("gptcourse.load_balancing_loss", "gptcourse.router_z_loss", "gptcourse.model.load_balancing")
_COUNTS = ("gptcourse.count_parameters", "gptcourse.parameter_breakdown", "gptcourse.block_breakdown",
           "gptcourse.model.params", "gptcourse.GPT", "gptcourse.model.gpt", "gptcourse.checks.gpt_module_breakdown")


# ---- route(router_logits (N, E), top_k) -> (weights (N, k), experts (N, k))


def _dense(weights: torch.Tensor, experts: torch.Tensor, n_experts: int) -> torch.Tensor:
    """A routing as one (N, E) matrix: each token's weight on each expert, 0 where it is not chosen."""
    return torch.zeros(weights.shape[0], n_experts, dtype=torch.float64).scatter(1, experts, weights.double())


def _route_inputs(n: int, e: int, k: int, seed: int, ties: bool = False) -> Inputs:
    logits = torch.randn(n, e, generator=tensor_rng(seed)) * 1.5
    if ties:  # each token's two best logits equal: both among its top k >= 2, in either order
        best = logits.topk(2, dim=-1).indices  # (N, 2)
        logits.scatter_(1, best[:, 1:], logits.gather(1, best[:, :1]))
    return {"logits": logits, "top_k": k, "sizes": {"N": n, "E": e, "k": k}}


def _route_call(fn: Any, inputs: Inputs) -> Outputs:
    logits, k = inputs["logits"], inputs["top_k"]
    (n, e), what = logits.shape, f"route(router_logits {fmt_shape(inputs['logits'].shape)}, top_k={k})"
    result = fn(logits.clone(), k)
    if not isinstance(result, tuple) or len(result) != 2:
        raise fail(f"{what} returned {type(result).__name__}, expected a tuple (weights, experts), each (N, top_k)")
    weights, experts = as_tensor(result[0], f"{what}'s weights"), as_tensor(result[1], f"{what}'s experts")
    for name, t in (("weights", weights), ("experts", experts)):
        if tuple(t.shape) != (n, k):
            raise fail(f"{what}: {name} of shape {fmt_shape(t.shape)}, expected (N, top_k) = ({n}, {k})")
    if experts.is_floating_point() or experts.dtype == torch.bool:
        raise fail(f"{what}: experts are {experts.dtype}, expected integer indices (the .indices of topk)")
    if experts.numel() and (int(experts.min()) < 0 or int(experts.max()) >= e):
        raise fail(f"{what}: an expert index {int(experts.max())} or {int(experts.min())} is out of range 0..{e - 1}")
    if k > 1 and bool((experts.sort(-1).values.diff(dim=-1) == 0).any()):
        row = int((experts.sort(-1).values.diff(dim=-1) == 0).any(-1).nonzero()[0])
        raise fail(f"{what}: token {row} is sent to the same expert twice, {experts[row].tolist()}: its top_k experts "
                   "are k different ones, logits.topk(k, dim=-1).indices", mistake="16.route_same_expert_twice")
    return {"weights": _dense(weights, experts.long(), e)}


def _routing(logits: torch.Tensor, k: int, *, scores: str = "softmax", weights: str = "renormalised",
             axis: int = -1, largest: bool = True, by_position: bool = False) -> torch.Tensor:
    """A routing (N, E), right or with one of the usual mistakes: the experts scored by a softmax over `axis`, a
    sigmoid (`scores` "sigmoid"), a log_softmax ("log_softmax") or the logits themselves ("logits"); the chosen
    scores kept as they are
    (`weights` "raw") or a softmax over them ("softmax again"); the k smallest (`largest`); each token's experts
    by its position (`by_position`)."""
    double = logits.double()
    score = {"softmax": F.softmax(double, dim=axis), "sigmoid": torch.sigmoid(double),
             "log_softmax": F.log_softmax(double, dim=axis), "logits": double}[scores]
    n, e = logits.shape
    if by_position:
        experts = (torch.arange(n)[:, None] + torch.arange(k)) % e  # (N, k): token n to n, n + 1, ... mod E
    else:
        experts = score.topk(k, dim=-1, largest=largest).indices  # (N, k): the logits' order, along `axis`
    chosen = score.gather(1, experts)  # (N, k)
    value = {"renormalised": chosen / chosen.sum(-1, keepdim=True), "raw": chosen,
             "softmax again": F.softmax(chosen, dim=-1)}[weights]
    return _dense(value, experts, e)


def _route_mistakes(inputs: Inputs) -> dict[str, torch.Tensor]:
    logits, k = inputs["logits"], inputs["top_k"]
    return {
        Mistake("16.route_not_renormalised",
               "the weights are the top-k probabilities as they are, not renormalised: they sum to less than 1, so the "
        "output shrinks; divide them by their sum (Mixtral's renormalisation)"): _routing(logits, k, weights="raw"),
        Mistake("16.route_softmax_twice",
            "a second softmax ran over the top-k probabilities: softmax-then-top-k keeps the probabilities and divides "
            "them by their sum; a softmax of probabilities flattens them toward 1/k"): _routing(logits, k,
                                                                                          weights="softmax again"),
        Mistake("16.route_raw_logits",
              "the weights are the chosen logits, without a softmax: take the softmax over the E experts, then the top "
              "k, then renormalise"): _routing(logits, k, scores="logits", weights="raw"),
        Mistake("16.route_logits_normalised",
               "the weights are the chosen logits divided by their sum, without a softmax: a logit can be negative, so "
        "a weight can be negative or blow up where the logits nearly cancel; take the softmax over the E experts "
        "first, then the top k, then renormalise the probabilities"): _routing(logits, k, scores="logits"),
        Mistake("16.route_sigmoid",
                "the experts were scored by a sigmoid of each logit (DeepSeek-V3's gates), not a softmax over the E "
                "experts: the lab's router takes the softmax over each token's E logits, then the top k, then "
                "renormalises"): _routing(logits, k, scores="sigmoid"),
        Mistake("16.route_log_softmax",
                "the weights are the top-k log-probabilities (log_softmax) divided by their sum: log-probabilities are "
        "negative, so the most likely expert gets the smallest weight; take the softmax over the E experts, then "
        "the top k, then divide the probabilities by their sum"): _routing(logits, k, scores="log_softmax"),
        Mistake("16.route_softmax_over_tokens",
              "the softmax ran over the tokens (dim=0): each token's router probabilities are a softmax over its own E "
              "logits, dim=-1"): _routing(logits, k, axis=0),
        Mistake("16.route_smallest",
                "the k *smallest* logits were chosen: topk(k, dim=-1) takes the largest (largest=True)"):
            _routing(logits, k, largest=False),
        Mistake("16.route_by_position",
              "the tokens were routed by their position (token n to expert n mod E): a router routes each token by its "
              "own logits, the top k of its row"): _routing(logits, k, by_position=True),
    }


@sized
def _route_hidden(r: random.Random, seed: int) -> Inputs:
    e = r.randint(2, 12)
    return _route_inputs(r.randint(1, 20), e, r.randint(1, e), seed)


# ---- dispatch_combine(x (N, C), weights (N, k), experts (N, k), expert_fns) -> y (N, C)


def _dispatch_inputs(n: int, c: int, e: int, k: int, seed: int, idle: int | None = None) -> Inputs:
    """Tokens, a routing (from random logits, expert `idle` never chosen) and E SwiGLU experts' weights."""
    gen = tensor_rng(seed)
    logits = torch.randn(n, e, generator=gen) * 2
    if idle is not None:
        logits[:, idle] = -1e4
    weights, experts = top_k_routing(logits, k)
    f = max(2, c // 2)
    return {"x": torch.randn(n, c, generator=gen), "weights": weights, "experts": experts,
            "w_in": torch.randn(e, c, 2 * f, generator=gen) / math.sqrt(c),
            "w_out": torch.randn(e, f, c, generator=gen) / math.sqrt(f), "sizes": {"N": n, "C": c}}


class _Expert:
    """One expert, SwiGLU with the case's weights, that counts the calls and the token rows it is called on."""

    def __init__(self, w_in: torch.Tensor, w_out: torch.Tensor, index: int) -> None:
        self.w_in, self.w_out, self.index, self.rows, self.calls = w_in, w_out, index, 0, 0

    def __call__(self, h: Any) -> torch.Tensor:
        c = self.w_in.shape[0]
        if not isinstance(h, torch.Tensor) or h.dim() != 2 or h.shape[1] != c:
            given = fmt_shape(h.shape) if isinstance(h, torch.Tensor) else type(h).__name__
            raise fail(f"expert_fns[{self.index}] was called with {given}: an expert takes the rows of its tokens, "
                       f"a (tokens, C) = (n, {c}) tensor, x[token_ids]", mistake="16.expert_called_with_wrong_rows")
        self.rows += h.shape[0]
        self.calls += 1
        gate, value = (h @ self.w_in).chunk(2, dim=-1)  # each (n, F)
        return (F.silu(gate) * value) @ self.w_out  # (n, C)


def _experts(inputs: Inputs) -> list[_Expert]:
    return [_Expert(w_in, w_out, i) for i, (w_in, w_out) in enumerate(zip(inputs["w_in"], inputs["w_out"],
                                                                                    strict=True))]


def _dispatch_call(fn: Any, inputs: Inputs) -> Outputs:
    experts = _experts(inputs)
    what = f"dispatch_combine(x {fmt_shape(inputs['x'].shape)}, weights, experts, {len(experts)} expert_fns)"
    y = as_tensor(fn(inputs["x"].clone(), inputs["weights"].clone(), inputs["experts"].clone(), list(experts)), what)
    return {"y": y, "rows": torch.tensor([expert.rows for expert in experts]),
            "calls": torch.tensor([expert.calls for expert in experts])}


def _dispatch_expected(inputs: Inputs) -> Outputs:
    """A slow loop: each token's own experts on its row alone, weighted and added."""
    experts, x = _experts(inputs), inputs["x"]
    y = torch.zeros_like(x)
    for n in range(x.shape[0]):
        for weight, e in zip(inputs["weights"][n].tolist(), inputs["experts"][n].tolist(), strict=True):
            y[n] += weight * experts[e](x[n : n + 1])[0]
    routed = torch.bincount(inputs["experts"].flatten(), minlength=len(experts))  # (E,)
    # one call an expert with tokens (an idle one: none, or one on no row; the judge allows either)
    return {"y": y, "rows": routed, "calls": (routed > 0).long()}


def _combined(inputs: Inputs, *, weighted: str = "own", overwrite: bool = False) -> torch.Tensor:
    """The output (N, C), right or with one of the usual mistakes: each expert's output added with its slot's
    weight (`weighted` "own"), with weight 1 ("none"), with the first slot's weight ("first"); only the first slot
    ("first only"), with the weight in the column of the expert's index, e mod k ("expert index"); written over
    the row instead of added (`overwrite`: the last expert in index order stays)."""
    experts, x, weights, chosen = _experts(inputs), inputs["x"], inputs["weights"], inputs["experts"]
    y = torch.zeros_like(x)
    for e, expert in enumerate(experts):
        token, slot = (chosen == e).nonzero(as_tuple=True)  # (N_e,) each
        if weighted == "first only":
            token = token[slot == 0]
            slot = slot[slot == 0]
        w = {"own": weights[token, slot], "none": torch.ones(len(token)), "first": weights[token, 0],
             "first only": weights[token, slot], "expert index": weights[token, e % weights.shape[1]]}[weighted]
        out = expert(x[token]) * w[:, None]  # (N_e, C)
        if overwrite:
            y[token] = out
        else:
            y.index_add_(0, token, out)
    return y


def _dispatch_mistakes(inputs: Inputs) -> dict[str, torch.Tensor]:
    return {
        Mistake("16.dispatch_unweighted",
               "the experts' outputs were added without their routing weights: multiply each by its token's weight for "
               "that expert, weights[token_ids, slot]"): _combined(inputs, weighted="none"),
        Mistake("16.dispatch_first_weight",
                "every expert's output was weighted by the token's first weight, weights[:, 0]: each slot has its own "
                "weight, weights[token_ids, slot]"): _combined(inputs, weighted="first"),
        Mistake("16.dispatch_first_only",
                "only each token's first expert was added: all k experts a token is routed to contribute, weighted"):
            _combined(inputs, weighted="first only"),
        Mistake("16.dispatch_weight_by_expert_index",
                "expert e's outputs were weighted by column e (mod k) of weights, weights[token_ids, e]: weights is "
        "(N, top_k), its columns are a token's slots, not the experts; take the weight of the slot that chose e, "
        "weights[token_ids, slot]"): _combined(inputs, weighted="expert index"),
        Mistake("16.dispatch_overwrite",
                "the outputs were written into the rows (y[token_ids] = ...), so a token's later expert overwrites the "
                "earlier one: add them, y.index_add_(0, token_ids, out)"): _combined(inputs, overwrite=True),
    }


def _dispatch_judge(got: Outputs, expected: Outputs, inputs: Inputs) -> None:
    rows, routed, n = got["rows"], expected["rows"], inputs["x"].shape[0]
    if not torch.equal(rows, routed):
        everyone = [e for e in range(len(rows)) if int(rows[e]) >= n and int(routed[e]) < n]
        if everyone:
            raise fail(f"expert(s) {everyone} ran on all {n} tokens, but only {routed[everyone].tolist()} were routed "
                       "to them: this is the dense computation, every expert on every token, then masked (E / k "
                       "times the work). Give each expert only its tokens: token_ids, slot = (experts == e)"
                       ".nonzero(as_tuple=True), expert_fns[e](x[token_ids])", mistake="16.dispatch_dense")
        zero = routed.new_zeros(1)
        for shifted, fn in ((torch.cat([routed[1:], zero]), "expert_fns[e - 1]"),
                            (torch.cat([zero, routed[:-1]]), "expert_fns[e + 1]")):  # (E,): each expert's neighbour's
            if torch.equal(rows, shifted):
                raise fail(f"the experts saw {rows.tolist()} token rows, but {routed.tolist()} were routed to them: "
                           f"each expert ran the tokens of its neighbour, {fn} on the tokens routed to e: the "
                           "expert indices are off by one. topk's indices count from 0, so expert e's tokens are "
                           "(experts == e) and its function expert_fns[e] (enumerate(expert_fns), no start=1)",
                           mistake="16.dispatch_off_by_one")
        idle = [e for e in range(len(rows)) if int(routed[e]) == 0 and int(rows[e]) > 0]
        used = routed[routed > 0]  # the routed counts of the experts that got a token, in index order
        if idle and torch.equal(rows[: len(used)], used):
            raise fail(f"expert {idle[0]} was routed no token, yet ran on {int(rows[idle[0]])} rows, and the experts "
                       f"saw {rows.tolist()} rows where {routed.tolist()} were routed: the expert functions were "
                       "taken by their position among the experts that got a token (experts.unique()), so each "
                       "expert after an empty one ran another's tokens; call expert_fns[e] for expert e itself",
                       mistake="16.dispatch_by_unique_position")
        raise fail(f"the experts saw {rows.tolist()} token rows, but {routed.tolist()} were routed to them (one row "
                   "per token and slot that chose the expert): call each expert once on exactly its tokens")
    calls = got["calls"]
    if bool((calls > 1).any()):
        e = int((calls > 1).nonzero()[0])
        raise fail(f"expert {e} was called {int(calls[e])} times for its {int(routed[e])} tokens (the experts were "
                   f"called {calls.tolist()} times): call each expert once, on all of its tokens in one batch, "
                   "expert_fns[e](x[token_ids]); a call per token runs N k small matrix products instead of E large "
                   "ones", mistake="16.dispatch_called_per_token")
    check_close_lazily(got["y"], expected["y"], "the combined output", lambda: _dispatch_mistakes(inputs))


@sized
def _dispatch_hidden(r: random.Random, seed: int) -> Inputs:
    e = r.randint(2, 8)
    return _dispatch_inputs(r.randint(3, 30), r.choice([4, 6, 8]), e, r.randint(1, e), seed)


# ---- load_balancing_loss(router_logits (N, E), top_k, attention_mask (B, T) or None) -> scalar


def _lb_inputs(b: int, t: int, e: int, k: int, seed: int, padded: bool = False, skew: float = 0.0) -> Inputs:
    gen = tensor_rng(seed)
    logits = torch.randn(b * t, e, generator=gen) * 1.5
    logits[:, 0] += skew  # a router that favours expert 0
    mask = None
    if padded:  # right padding, each sequence a real length of its own; the pads' logits far from the rest
        mask = torch.ones(b, t, dtype=torch.long)
        for row in range(b):
            mask[row, max(1, t - 1 - row) :] = 0
        logits[mask.flatten() == 0] = torch.tensor([6.0] + [0.0] * (e - 1))
    return {"logits": logits, "top_k": k, "mask": mask}


def _lb_call(fn: Any, inputs: Inputs) -> Outputs:
    mask = inputs["mask"]
    what = (f"load_balancing_loss(router_logits {fmt_shape(inputs['logits'].shape)}, top_k={inputs['top_k']}"
            + (f", attention_mask {fmt_shape(mask.shape)})" if mask is not None else ")"))
    args = (inputs["logits"].clone(), inputs["top_k"]) + ((mask.clone(),) if mask is not None else ())
    value = as_number(fn(*args), what, "a number (a scalar tensor)")
    return {"loss": torch.tensor(float(value), dtype=torch.float64)}


def _lb_expected(inputs: Inputs) -> Outputs:
    """gptcourse's takes the number of experts too; the lab's reads it from the logits."""
    logits = inputs["logits"]
    loss = load_balancing_loss(logits, logits.shape[-1], inputs["top_k"], inputs["mask"])
    return {"loss": loss.double()}


def _balance(logits: torch.Tensor, k: int, mask: torch.Tensor | None = None, *, probs_of: str = "all",
             counts: str = "top-k", masked: str = "both", times_e: bool = True) -> torch.Tensor:
    """E sum_e f_e P_e, right or with one of the usual mistakes: P_e from the top-k probabilities (`probs_of`
    "top-k": as they are, "renormalised": divided by their sum) or from the logits ("logits"); f_e from the first
    choice only (`counts` "first"), the first choice counted k times ("first k times"), divided by k ("per
    slot"), k P_e, the probabilities for counts ("soft"), or one share for every expert, all the routed slots
    over the tokens ("one share"); the mask on f_e only (`masked` "counts only"), on P_e only ("probs only"), on
    neither ("none"), or flattened column-major ("transposed"), or both sums masked but divided by every position,
    pads included ("all positions"); without the factor E (`times_e`)."""
    n, e = logits.shape
    if mask is None or masked == "none":
        mask = torch.ones(n)
    flat = mask.t().flatten() if masked == "transposed" else mask.flatten()  # (N,): B T, row by row
    real = flat.double()
    probs = F.softmax(logits.double(), dim=-1)  # (N, E)
    top = probs.topk(k, dim=-1)
    first = counts in ("first", "first k times")
    routed = F.one_hot(top.indices[:, :1] if first else top.indices, e).sum(1).double()  # (N, E)
    kept = {"all": probs, "logits": logits.double(),
            "top-k": _dense(top.values, top.indices, e),
            "renormalised": _dense(top.values / top.values.sum(-1, keepdim=True), top.indices, e)}[probs_of]
    tokens = float(n) if masked == "all positions" else real.sum()
    mean = (kept * real[:, None]).sum(0) / tokens  # (E,)
    if masked == "counts only":
        mean = kept.mean(0)
    share = (routed * real[:, None]).sum(0) / tokens  # (E,)
    if masked == "probs only":
        share = routed.mean(0)
    share = {"top-k": share, "first": share, "first k times": k * share, "per slot": share / k,
             "soft": k * mean, "one share": share.sum()}[counts]
    return (e if times_e else 1) * (share * mean).sum()


# why -> the switches of `_balance` that make that mistake
_BALANCE_MISTAKES = {
    Mistake("16.balance_p_top_k",
            "P_e was averaged over the top-k probabilities only (0 for the experts not chosen): P_e is the mean of the "
            "router's full softmax over all E experts, which is what gives every expert a gradient"):
        {"probs_of": "top-k"},
    Mistake("16.balance_p_renormalised",
            "P_e was averaged over the renormalised top-k weights: P_e is the mean of the router's full softmax over "
            "all E experts, before top-k"):
        {"probs_of": "renormalised"},
    Mistake("16.balance_p_logits",
            "P_e was averaged over the logits: take the softmax first, P_e is a mean probability"):
        {"probs_of": "logits"},
    Mistake("16.balance_f_first",
            "f_e counts only each token's first choice: a token is routed to all of its k experts, and f_e counts "
            "each of them (the shares sum to k)"):
        {"counts": "first"},
    Mistake("16.balance_f_first_k_times",
            "f_e counts each token's first choice (argmax) k times: a token is routed to its top k experts, and f_e "
            "counts each of them once (the shares sum to k)"):
        {"counts": "first k times"},
    Mistake("16.balance_f_per_slot",
            "f_e was divided by k (shares that sum to 1): transformers' and Mixtral's f_e count a token once for each "
            "of its k experts, so the shares sum to k"):
        {"counts": "per slot"},
    Mistake("16.balance_f_soft",
            "f_e is k P_e, the probabilities standing in for the counts: f_e is the share of the tokens routed to "
            "expert e by top-k, counted (it has no gradient; P_e carries it)"):
        {"counts": "soft"},
    Mistake("16.balance_f_one_share",
            "f_e is one number for every expert, all the routed slots over the tokens (k): count each expert's own "
            "share, f_e = (tokens routed to e) / tokens, a vector of E shares (counts.sum(0), not counts.sum()); "
            "with one share for all, the loss is E k sum_e P_e = E k whatever the router does"):
        {"counts": "one share"},
    Mistake("16.balance_no_e",
            "the factor E is missing: the loss is E * sum_e f_e P_e (1 at perfect balance with k = 1)"):
        {"times_e": False},
}
# with an attention_mask: why -> the switches of `_balance` that make that mistake
_PADDING_MISTAKES = {
    Mistake("16.balance_padding_counted",
            "the padding tokens were counted: f_e and P_e are means over the real tokens only, where "
            "attention_mask is 1"):
        {"masked": "none"},
    Mistake("16.balance_mask_f_only",
            "the mask was applied to f_e only, P_e averaged the padding too: both are means over the real tokens, "
            "where attention_mask is 1"):
        {"masked": "counts only"},
    Mistake("16.balance_mask_p_only",
            "the mask was applied to P_e only, f_e counted the padding too: both are means over the real tokens, "
            "where attention_mask is 1"):
        {"masked": "probs only"},
    Mistake("16.balance_divided_by_all_positions",
            "the padding was masked out of both sums, but they were divided by every position, pads included (B T): "
            "divide by the number of real tokens, attention_mask.sum()"):
        {"masked": "all positions"},
    Mistake("16.balance_mask_transposed",
            "the (B, T) mask was flattened column by column (attention_mask.T), so it no longer lines up with the "
            "tokens, which are B T row by row: attention_mask.reshape(-1)"):
        {"masked": "transposed"},
}


def _lb_rows(inputs: Inputs) -> Rows:
    """The known mistakes of a case, the padding's only where it has an attention_mask."""
    return _BALANCE_MISTAKES | (_PADDING_MISTAKES if inputs["mask"] is not None else {})


@sized
def _lb_hidden(r: random.Random, seed: int) -> Inputs:
    e = r.randint(2, 10)
    return _lb_inputs(r.randint(1, 4), r.randint(2, 9), e, r.randint(1, e), seed, padded=r.random() < 0.5,
                      skew=r.choice([0.0, 2.0]))


# ---- moe_parameter_counts(config) -> (total, active)

BASE = {"vocab_size": 500, "context_length": 64, "d_model": 32, "n_heads": 4, "n_layers": 4, "position": "rope",
        "norm": "rmsnorm", "mlp": "swiglu", "d_ff": 48, "attn_bias": False, "mlp_bias": False,
        "tie_weights": False}
SMALL_TIED = BASE | {"n_kv_heads": 2, "d_ff": None, "tie_weights": True}
MIXTRAL = {"vocab_size": 32000, "context_length": 32768, "d_model": 4096, "n_heads": 32, "n_layers": 32,
           "n_kv_heads": 8, "position": "rope", "norm": "rmsnorm", "mlp": "swiglu", "d_ff": 14336,
           "attn_bias": False, "mlp_bias": False, "tie_weights": False}


def _config(fields: dict[str, Any], moe: dict[str, Any]) -> GPTConfig:
    return GPTConfig(**fields, moe=MoESpec(**moe))


def _count_inputs(*configs: tuple[dict[str, Any], dict[str, Any]]) -> Inputs:
    return {"configs": [{"fields": dict(fields), "moe": dict(moe)} for fields, moe in configs]}


def _count_call(fn: Any, inputs: Inputs) -> Outputs:
    outputs: Outputs = {}
    for i, spec in enumerate(inputs["configs"]):
        config = _config(spec["fields"], spec["moe"])
        what = f"moe_parameter_counts(config with {config.moe})"
        with TensorsMade() as made:
            result = fn(config)
        if not isinstance(result, tuple) or len(result) != 2:
            raise fail(f"{what} returned {type(result).__name__}, expected a tuple (total, active)")
        for name, value in zip(("total", "active"), result, strict=True):
            number = as_number(value, f"{what}'s {name}", "a whole number (int)", kinds=(int,))
            outputs[f"{i}.{name}"] = torch.tensor(int(number), dtype=torch.int64)
        outputs[f"{i}.made"] = torch.tensor(max((math.prod(s) for s in made.shapes), default=0))
    return outputs


def _count_expected(inputs: Inputs) -> Outputs:
    """The total is gptcourse.GPT's tensors (on the meta device); a token skips n_experts - top_k experts of each
    sparse block."""
    outputs: Outputs = {}
    for i, spec in enumerate(inputs["configs"]):
        config = _config(spec["fields"], spec["moe"])
        with torch.device("meta"):
            model = GPT(config)
        total = sum(p.numel() for p in model.parameters())
        skipped = sum((len(b.mlp.experts) - b.mlp.top_k) * sum(p.numel() for p in b.mlp.experts[0].parameters())
                      for b in model.blocks if isinstance(b.mlp, MoE))
        outputs |= {f"{i}.total": torch.tensor(total), f"{i}.active": torch.tensor(total - skipped),
                    f"{i}.made": torch.tensor(0)}
    return outputs


def _counts(config: GPTConfig, *, shared_as_routed: bool = False, no_shared_active: bool = False,
            no_router: bool = False, all_sparse: bool = False, two_matrices: bool = False,
            no_embeddings_active: bool = False, all_active: bool = False, untied: bool = False,
            all_heads_kv: bool = False, width_4c: bool = False, router_bias: bool = False,
            kv_without_d_head: bool = False, router_active_k: bool = False, dense_expert_width: bool = False,
            one_norm: bool = False) -> tuple[int, int]:
    """(total, active) by hand, right or with one of the usual mistakes (each switch one)."""
    c, v, n, m = config.d_model, config.vocab_size, config.n_layers, config.moe
    kv = c if all_heads_kv else config.kv_heads * (1 if kv_without_d_head else config.d_head)
    attention = 2 * c * c + 2 * c * kv
    mats = 2 if two_matrices else 3
    width = (config.d_ff or 4 * c) if width_4c else config.hidden_width
    expert = mats * c * (m.d_ff or width)
    dense_mlp = expert if dense_expert_width else mats * c * width
    shared = mats * c * m.shared_d_ff
    if shared_as_routed and m.shared_d_ff:
        shared = expert  # the shared expert given the routed experts' width
    router = 0 if no_router else c * m.n_experts + (m.n_experts if router_bias else 0)
    dense = 0 if all_sparse else m.dense_layers
    embeddings = v * c + (0 if config.tie_weights and not untied else v * c)
    rest = n * (attention + (1 if one_norm else 2) * c) + c  # attention, the blocks' norms, the final norm

    def total(experts: int, with_shared: bool = True, with_embeddings: bool = True, routes: int = router) -> int:
        sparse = routes + experts * expert + (shared if with_shared else 0)
        return rest + dense * dense_mlp + (n - dense) * sparse + (embeddings if with_embeddings else 0)

    return total(m.n_experts), total(m.n_experts if all_active else m.top_k, not no_shared_active,
                                     not no_embeddings_active, c * m.top_k if router_active_k else router)


COUNT_MISTAKES = {
    Mistake("16.count_all_active",
            "the active count holds every expert: a token runs through only top_k of the n_experts, so the active "
    "count has top_k experts per sparse block (the total has all of them)"):
        {"all_active": True},
    Mistake("16.count_no_shared_active",
            "the shared expert was left out of the active count: every token goes through it, so it is active"):
        {"no_shared_active": True},
    Mistake("16.count_shared_as_routed",
           "the shared expert was counted as a routed expert, of the routed experts' width: it has a width of its own, "
           "moe.shared_d_ff, 3 C shared_d_ff parameters"):
        {"shared_as_routed": True},
    Mistake("16.count_no_router",
            "the router was left out: each sparse block has one, a C x E matrix (no bias), and every token uses it"):
        {"no_router": True},
    Mistake("16.count_all_sparse",
            "every block was counted as sparse: the first moe.dense_layers blocks keep a dense SwiGLU of d_ff"):
        {"all_sparse": True},
    Mistake("16.count_two_matrices",
        "the experts were counted with two matrices: a SwiGLU expert has three, gate and value C x F and output F x C"):
        {"two_matrices": True},
    Mistake("16.count_no_embeddings_active",
            "the embeddings and the output projection were left out of the active count: the published active counts "
            "(Mixtral's 12.9B) count them, as every token uses the table and the head"):
        {"no_embeddings_active": True},
    Mistake("16.count_untied",
            "the output projection was counted though tie_weights=True: a tied model's head is its token table, V x C "
            "counted once"):
        {"untied": True},
    Mistake("16.count_all_heads_kv",
            "the attention was counted with as many key and value heads as query heads (4 C^2): with grouped-query "
            "attention the key and value projections are C x n_kv_heads d_head each"):
        {"all_heads_kv": True},
    Mistake("16.count_width_4c",
            "the MLP width for d_ff=None was taken as 4 C: the width is config.hidden_width, d_ff or the MLP's default "
            "(2 C for SwiGLU), and an expert's is moe.d_ff or that same hidden_width"):
        {"width_4c": True},
    Mistake("16.count_router_bias",
            "the router was counted with a bias, C x E + E: the model has no biases, the router is a C x E matrix"):
        {"router_bias": True},
    Mistake("16.count_kv_without_d_head",
            "the key and value projections were counted as C x n_kv_heads each, without the head width: each is C x "
            "(n_kv_heads d_head)"):
        {"kv_without_d_head": True},
    Mistake("16.count_router_active_k",
            "the active count has only the router's k columns of the chosen experts (C k): the router scores all E "
            "experts for every token, so all of it, C x E, is active"):
        {"router_active_k": True},
    Mistake("16.count_dense_expert_width",
           "the dense blocks' SwiGLU was given the experts' width moe.d_ff: the first moe.dense_layers blocks keep the "
           "dense MLP of config.hidden_width"):
        {"dense_expert_width": True},
    Mistake("16.count_one_norm",
            "one RMSNorm was counted per block: a pre-norm block has two, before the attention and before the MLP, 2 C "
            "per block"):
        {"one_norm": True},
}


def _count_terms(config: GPTConfig) -> dict[str, int]:
    """The parts of the count a student may leave out, each by its size in the total (all of them are active)."""
    c, n, m = config.d_model, config.n_layers, config.moe
    sparse = n - m.dense_layers
    return {f"the final norm, C = {c:,} parameters after the last block": c,
            f"the blocks' norms, 2 C = {2 * c:,} per block": 2 * n * c,
            f"the router, a C x E = {c * m.n_experts:,} matrix in each of the {sparse} sparse blocks":
                sparse * c * m.n_experts,
            f"the shared expert, 3 C moe.shared_d_ff = {3 * c * m.shared_d_ff:,} in each of the {sparse} sparse "
            "blocks, beside the n_experts routed ones (it has a width of its own and every token uses it)":
                sparse * 3 * c * m.shared_d_ff}


def _missing_term(pair: tuple[int, int], want: tuple[int, int], config: GPTConfig) -> str | None:
    """What was left out, if the counts are short by exactly one term (two of the same size: both named): of both
    counts, or of the active one."""
    short = (want[0] - pair[0], want[1] - pair[1])
    both = [term for term, size in _count_terms(config).items() if size and short == (size, size)]
    active = [term for term, size in _count_terms(config).items() if size and short == (0, size)]
    if both:
        return "; or ".join(both) + f", was left out (short by {short[0]:,} in both)"
    if active:
        said = f", was left out of the active count (short by {short[1]:,}): every token uses it"
        return "; or ".join(active) + said
    return None


def _count_judge(got: Outputs, expected: Outputs, inputs: Inputs) -> None:
    for i, spec in enumerate(inputs["configs"]):
        config = _config(spec["fields"], spec["moe"])
        pair = (int(got[f"{i}.total"]), int(got[f"{i}.active"]))
        want = (int(expected[f"{i}.total"]), int(expected[f"{i}.active"]))
        what = f"moe_parameter_counts(config with {config.moe})"
        if pair != want:
            for why, switch in COUNT_MISTAKES.items():
                wrong = _counts(config, **switch)
                if pair == wrong and wrong != want:
                    raise fail(f"{what}: {pair[0]:,} total and {pair[1]:,} active, expected {want[0]:,} and "
                               f"{want[1]:,}: {why}", mistake_key(why))
            missing = _missing_term(pair, want, config)
            said = f": {missing}" if missing else ""
            raise fail(f"{what}: {pair[0]:,} total and {pair[1]:,} active, expected {want[0]:,} and {want[1]:,} "
                       f"(off by {pair[0] - want[0]:+,} and {pair[1] - want[1]:+,}){said}")
        if int(got[f"{i}.made"]) >= config.d_model:
            raise fail(f"{what} gave the right counts, but made a tensor of {int(got[f'{i}.made']):,} elements on "
                       "the way: it built layers (on the meta device or not) and counted their tensors; write the "
                       "formula from the config's fields", mistake="16.count_built_tensors")


@sized
def _count_hidden(r: random.Random, seed: int) -> Inputs:
    configs = []
    for i in range(3):  # the first with a shared expert and one kv head, the second tied with a dense block and experts
        h = r.choice([2, 4, 8])  # of a width of their own, the third with the default widths (d_ff=None) and top_k < E
        e = r.randint(2, 16)
        fields = BASE | {"vocab_size": r.randint(100, 5000), "d_model": h * r.choice([8, 16]), "n_heads": h,
                         "n_kv_heads": 1 if i == 0 else r.choice([None, 1, h]), "n_layers": r.randint(2, 6),
                         "d_ff": None if i == 2 else r.randint(8, 96), "tie_weights": i == 1 or r.random() < 0.5}
        top_k, width = r.randint(1, e - 1 if i == 2 else e), r.randint(4, 48)
        width_or_none = r.choice([None, width])  # the second's experts have a width of their own (not its dense one)
        moe = {"n_experts": e, "top_k": top_k, "d_ff": {1: width, 2: None}.get(i, width_or_none),
               "shared_d_ff": r.randint(4, 48) if i == 0 else r.choice([0, r.randint(4, 48)]),
               "dense_layers": r.randint(1 if i == 1 else 0, fields["n_layers"] - 1)}  # a sparse block at least
        configs.append((fields, moe))
    return _count_inputs(*configs)


PIECES = declare(
    Piece("16", "route", top_k_routing, _route_call, mistakes=_route_mistakes, label="the routing weights (N, E)",
          atol=1e-5, rtol=1e-4, forbidden=_ROUTE,
          visible=[("visible", "route 6 tokens among 4 experts, top_k=2", lambda seed: _route_inputs(6, 4, 2, seed))],
          hidden=[("hidden_top1", "route with top_k=1 (the weight is 1)", lambda seed: _route_inputs(7, 5, 1, seed)),
                  ("hidden_all", "route with top_k = n_experts (every expert, the plain softmax)",
                   lambda seed: _route_inputs(5, 4, 4, seed)),
                  ("hidden_ties", "route with tied logits (each token's two best equal)",
                   lambda seed: _route_inputs(6, 4, 2, seed, ties=True)),
                  ("hidden_sizes", "route with other sizes and top_k", _route_hidden)]),
    Piece("16", "dispatch_combine", None, _dispatch_call, expected=_dispatch_expected, judge=_dispatch_judge,
          forbidden=_DISPATCH,
          visible=[("visible", "dispatch_combine of 10 tokens (C=8) to 5 experts, 2 each, expert 2 chosen by none",
                    lambda seed: _dispatch_inputs(10, 8, 5, 2, seed, idle=2))],
          hidden=[("hidden_idle", "dispatch_combine where one expert gets no token",
                   lambda seed: _dispatch_inputs(9, 6, 5, 2, seed, idle=3)),
                  ("hidden_top1", "dispatch_combine with top_k=1", lambda seed: _dispatch_inputs(8, 4, 3, 1, seed)),
                  ("hidden_all", "dispatch_combine with top_k = n_experts",
                   lambda seed: _dispatch_inputs(6, 4, 3, 3, seed)),
                  ("hidden_sizes", "dispatch_combine with other sizes", _dispatch_hidden)]),
    Piece("16", "load_balancing_loss", None, _lb_call, expected=_lb_expected, mistakes=_lb_rows, by_hand=_balance,
          label="the load-balancing loss", rtol=1e-5, forbidden=_BALANCE,
          visible=[("visible", "load_balancing_loss of 2 x 6 tokens right-padded to 5 and 4 real ones, 4 experts, "
                               "top_k=2, a router that favours expert 0",
                    lambda seed: _lb_inputs(2, 6, 4, 2, seed, padded=True, skew=1.5))],
          hidden=[("hidden_padding", "load_balancing_loss with right padding (attention_mask)",
                   lambda seed: _lb_inputs(3, 5, 4, 2, seed, padded=True)),
                  ("hidden_top1", "load_balancing_loss with top_k=1", lambda seed: _lb_inputs(2, 5, 6, 1, seed)),
                  ("hidden_sizes", "load_balancing_loss with other sizes, top_k, padding", _lb_hidden)]),
    Piece("16", "moe_parameter_counts", None, _count_call, expected=_count_expected, judge=_count_judge,
          forbidden=_COUNTS,
          visible=[("visible", "moe_parameter_counts of a small config (8 experts, top_k=2, a shared expert of its own "
                               "width, the first block dense), then one tied, with grouped-query attention and the "
                               "default widths (d_ff=None)",
                    lambda seed: _count_inputs((BASE, {"n_experts": 8, "top_k": 2, "d_ff": 16, "shared_d_ff": 24,
                                                       "dense_layers": 1}), (SMALL_TIED, {"n_experts": 4, "top_k": 2,
                                                                                          "dense_layers": 1}))),
                   ("mixtral", "moe_parameter_counts of Mixtral-8x7B (46.7B total, 12.9B active)",
                    lambda seed: _count_inputs((MIXTRAL, {"n_experts": 8, "top_k": 2})))],
          hidden=[("hidden_sizes", "moe_parameter_counts of other configs (grouped-query attention, tied, shared "
                                   "experts, dense blocks, d_ff=None)", _count_hidden)]),
)
