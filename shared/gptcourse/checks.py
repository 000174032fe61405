"""Checks that explain what is wrong, not just that something is.

Every check raises `CheckFailed` (an AssertionError) whose message names the problem and, where it can, its
likely cause: the axis of a shape that is wrong and why ("(2, 5, 32), expected (2, 5, 100): 32 = C, the output
projection is missing"), the largest error of a value and where it is, a known mistake recognised ("softmax over
the wrong axis", "mask on the wrong triangle", "missing 1/sqrt(D)"), which positions see the future, which
component of a parameter count is off and by how much.

Shapes are described with symbols: `sizes` maps each symbol to its size in the test ({"B": 2, "T": 5, "C": 32}),
and `expected` spells the shape, e.g. "B T C". Tests use sizes that differ from one another, so a size found in
a wrong shape can be named ("32 = C").

Pure functions of tensors and numbers: the grader runs them outside the student's kernel too.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from itertools import combinations

import torch

from .model.config import GPTConfig
from .model.params import parameter_breakdown


class CheckFailed(AssertionError):
    """A failed check. In a notebook only its message is shown: no traceback, no test source. `mistake`: the
    stable key of the known mistake it names, if any (the grader records it; the message is for the student)."""

    mistake: str | None = None

    def _render_traceback_(self) -> list[str]:  # IPython's hook for custom error display
        return [f"\x1b[0;31m{type(self).__name__}\x1b[0m: {self}"]


def fail(message: str, mistake: str | None = None) -> CheckFailed:
    """`raise fail(...)`: a CheckFailed whose traceback is not chained to the exception being handled; `mistake`
    is the key of the known mistake the message names."""
    error = CheckFailed(message)
    error.mistake = mistake
    error.__suppress_context__ = True
    return error


class Mistake(str):
    """A known mistake's description (the student's message) carrying its stable key, e.g. "02.softmax_dim": the
    key of a `mistakes` table, `Mistake("02.softmax_dim", "softmax over the wrong axis: ...")`. The message may
    be reworded or hold numbers; the key stays, and the class report counts by it."""

    key: str

    def __new__(cls, key: str, description: str) -> Mistake:
        named = super().__new__(cls, description)
        named.key = key
        return named


def mistake_key(description: str) -> str | None:
    """The key of a `mistakes` table's description, None for a plain string."""
    return getattr(description, "key", None)


def fmt_shape(shape: Sequence[int]) -> str:
    return "(" + ", ".join(str(int(s)) for s in shape) + (",)" if len(shape) == 1 else ")")


def fmt_index(index: Sequence[int]) -> str:
    return fmt_shape(index)


# Likely causes of a wrong size: (symbol expected, symbol found) -> cause, each a keyed `Mistake`.
SHAPE_CAUSES: dict[tuple[str, str], str] = {
    ("V", "C"): Mistake("shape.no_output_projection", "the output projection (C -> V) is missing"),
    ("D", "C"): Mistake("shape.no_head_projection", "a projection to the head width is missing: nn.Linear(d_model, "
                                                    "d_head) maps C -> D"),
    ("C", "D"): Mistake("shape.heads_not_merged", "only one head's width: the heads are not merged back to C = H x D"),
    ("C", "3C"): Mistake("shape.qkv_not_split", "q, k and v are not split apart: the fused projection gives 3C "
                                                "features"),
    ("C", "F"): Mistake("shape.no_mlp_output_projection", "the MLP's output projection (F -> C) is missing"),
    ("T", "T_max"): Mistake("shape.whole_position_table", "the whole position table was used instead of its first T "
                                                          "rows"),
}


def _symbol_of(size: int, sizes: Mapping[str, int]) -> str | None:
    return next((sym for sym, value in sizes.items() if value == size), None)


def _describe(shape: Sequence[int], sizes: Mapping[str, int]) -> str:
    """(2, 4, 5, 8) -> "(B, H, T, D) = (2, 4, 5, 8)" when every size has a symbol."""
    symbols = [_symbol_of(s, sizes) for s in shape]
    if all(symbols) and shape:
        return f"({', '.join(symbols)}) = {fmt_shape(shape)}"  # type: ignore[arg-type]
    return fmt_shape(shape)


def _ndim_hint(got: Sequence[int], want: Sequence[int], got_syms: list[str | None]) -> str:
    if math.prod(got) == math.prod(want):
        if "H" in got_syms and "D" in got_syms:
            return "the heads are not merged: (B, H, T, D) -> transpose(1, 2) -> reshape to (B, T, C = H x D)"
        return "it holds the right number of numbers in the wrong layout: a reshape is missing or wrong"
    if len(got) == len(want) - 1 and tuple(got) == tuple(want[1:]):
        return "the batch axis is missing: keep the leading B axis"
    if len(got) == len(want) + 1 and 1 in got:
        return "an extra axis of size 1: squeeze it, or index instead of slicing"
    return f"it has {len(got)} axes, expected {len(want)}"


def check_shape(
    got: torch.Tensor,
    expected: str,
    sizes: Mapping[str, int],
    name: str,
    causes: Mapping[tuple[str, str], str] | None = None,
) -> None:
    """Raise if `got.shape` is not `expected` (symbols, e.g. "B T V"), naming the wrong axis and its likely cause."""
    symbols = expected.split()
    want = tuple(sizes[s] if not s.isdigit() else int(s) for s in symbols)
    have = tuple(got.shape)
    if have == want:
        return
    header = f"{name}: shape {_describe(have, sizes)}, expected ({', '.join(symbols)}) = {fmt_shape(want)}"
    got_syms = [_symbol_of(s, sizes) for s in have]
    if len(have) != len(want):
        raise fail(f"{header}: {_ndim_hint(have, want, got_syms)}.")
    if sorted(have) == sorted(want):
        wrong = [i for i in range(len(want)) if have[i] != want[i]]
        if len(wrong) == 2:
            i, j = wrong
            raise fail(f"{header}: axes {i} ({symbols[i]}) and {j} ({symbols[j]}) are swapped; a transpose is "
                       "missing or one too many.")
        raise fail(f"{header}: the axes are in the wrong order (permuted).")
    table = {**SHAPE_CAUSES, **(causes or {})}
    details, keys = [], []
    for axis, (g, w, sym) in enumerate(zip(have, want, symbols, strict=True)):
        if g == w:
            continue
        found = got_syms[axis]
        detail = f"axis {axis} ({sym}) has size {g}" + (f" = {found}" if found else "") + f", expected {w}"
        if (sym, found) in table:
            detail += f": {table[sym, found]}"
            keys.append(mistake_key(table[sym, found]))
        details.append(detail)
    raise fail(f"{header}: " + "; ".join(details) + ".", next(filter(None, keys), None))


def check_dtype(got: torch.Tensor, expected: torch.dtype, name: str, why: str = "") -> None:
    if got.dtype != expected:
        raise fail(f"{name}: dtype {got.dtype}, expected {expected}" + (f": {why}" if why else "") + ".")


def _largest_error(got: torch.Tensor, expected: torch.Tensor, atol: float, rtol: float) -> str:
    g, e = got.double(), expected.double()
    err = (g - e).abs()
    index = tuple(int(i) for i in torch.unravel_index(err.argmax(), err.shape)) if err.dim() else ()
    bad = int((err > atol + rtol * e.abs()).sum())
    return (f"largest error {err.max().item():.3g} at index {fmt_index(index)}: got {g[index].item():.5g}, "
            f"expected {e[index].item():.5g}; {bad} of {err.numel()} entries are off")


def _constant_ratio(got: torch.Tensor, expected: torch.Tensor) -> float | None:
    g, e = got.double().flatten(), expected.double().flatten()
    keep = e.abs() > 1e-6 * max(e.abs().max().item(), 1e-12)
    if int(keep.sum()) < 2 or not torch.allclose(g[~keep], torch.zeros_like(g[~keep]), atol=1e-6):
        return None
    ratio = g[keep] / e[keep]
    c = ratio.mean().item()
    if abs(c - 1) < 1e-3 or (ratio - c).abs().max().item() > 1e-3 * abs(c) or abs(c) < 1e-9:
        return None
    return c


def _close(a: torch.Tensor, b: torch.Tensor, atol: float, rtol: float) -> bool:
    return tuple(a.shape) == tuple(b.shape) and torch.allclose(a.double(), b.double(), atol=atol, rtol=rtol)


# description -> what that mistake produces, or a function computing it, called only for a wrong answer (lazily,
# in order, until one matches); or a function giving that mapping, called only for a wrong answer
Mistakes = Mapping[str, torch.Tensor | Callable[[], torch.Tensor]]


def check_known_mistakes(
    got: torch.Tensor,
    expected: torch.Tensor,
    mistakes: Mistakes | Callable[[], Mistakes],
    name: str,
    *,
    atol: float = 1e-5,
    rtol: float = 1e-4,
) -> None:
    """If `got` is wrong and equals what a known mistake produces (`mistakes`: description -> result), say which.

    A mistake that happens to give the right answer on these inputs (e.g. any softmax axis when T = 1) is skipped.
    """
    if _close(got, expected, atol, rtol):
        return
    for description, wrong in (mistakes() if callable(mistakes) else mistakes).items():
        wrong = wrong() if callable(wrong) else wrong
        if _close(got, wrong, atol, rtol) and not _close(wrong, expected, atol, rtol):
            raise fail(f"{name}: {description}.", mistake_key(description))


LOG_EPSILONS = (1e-6, 1e-8, 1e-9, 1e-10, 1e-12)  # what students add inside a log to keep it finite


def eps_in_log_mistakes(probability: torch.Tensor, written: str, each: str, advice: str) -> dict[str, torch.Tensor]:
    """The mean loss -log(probability + eps) for each eps of LOG_EPSILONS, named as a known mistake (one key,
    "loss.eps_in_log", whatever the eps): the eps keeps the loss finite and caps each `each`'s loss at -log(eps)
    (`written`: how the probability reads in the message, `advice`: how to compute its log without forming it)."""
    return {Mistake("loss.eps_in_log", f"log({written} + {eps:g}) caps each {each}'s loss at -log({eps:g}) = "
                                       f"{-math.log(eps):.1f}: {advice}"): -(probability + eps).log().mean()
            for eps in LOG_EPSILONS}


def check_close(
    got: torch.Tensor,
    expected: torch.Tensor,
    name: str,
    *,
    atol: float = 1e-5,
    rtol: float = 1e-4,
    mistakes: Mistakes | Callable[[], Mistakes] | None = None,
    scales: Mapping[str, float] | None = None,
) -> None:
    """Raise if `got` is not close to `expected`, reporting the largest error and recognising known mistakes.

    `mistakes` maps a description ("softmax over the wrong axis: ...") to what that mistake would produce (computed
    only when `got` is wrong: see `Mistakes`);
    `scales` names constants a wrong result may be off by ({"sqrt(D)": 2.83}): a constant ratio of one of
    them is reported as that missing or extra factor.
    """
    if tuple(got.shape) != tuple(expected.shape):
        raise fail(f"{name}: shape {fmt_shape(got.shape)}, expected {fmt_shape(expected.shape)}.")
    if not (got.is_floating_point() or got.dtype in (torch.int64, torch.int32, torch.bool)):
        raise fail(f"{name}: dtype {got.dtype}; expected numbers ({expected.dtype}).")
    if torch.allclose(got.double(), expected.double(), atol=atol, rtol=rtol, equal_nan=False):
        return
    finite = torch.isfinite(got.double())
    if not bool(finite.all()) and bool(torch.isfinite(expected.double()).all()):
        first = tuple(int(i) for i in (~finite).nonzero()[0])
        raise fail(f"{name}: NaN or inf in {int((~finite).sum())} of {got.numel()} entries, the first at "
                   f"{fmt_index(first)}. A softmax over a row where every score is -inf gives NaN: is a "
                   "position masked from seeing even itself?")
    check_known_mistakes(got, expected, mistakes or {}, name, atol=atol, rtol=rtol)
    largest = _largest_error(got, expected, atol, rtol)
    ratio = _constant_ratio(got, expected)
    if ratio is not None:
        message = f"{name}: the expected value times {ratio:.4g} everywhere"
        for symbol, value in (scales or {}).items():
            if math.isclose(ratio, value, rel_tol=1e-3):
                message += f" (= {symbol}): a division by {symbol} is missing"
            elif math.isclose(ratio, 1 / value, rel_tol=1e-3):
                message += f" (= 1/{symbol}): divided by {symbol} once too often"
        raise fail(f"{message}; {largest}.")
    raise fail(f"{name}: {largest}.")


def describe_leaks(leaks: Mapping[int, Sequence[int]], limit: int = 4) -> str:
    """{0: [1, 2], 3: [4]} -> "position 0 sees 1, 2; position 3 sees 4"."""
    parts = [f"position {i} sees {', '.join(map(str, js))}" for i, js in sorted(leaks.items())]
    more = f"; and {len(parts) - limit} more positions" if len(parts) > limit else ""
    return "; ".join(parts[:limit]) + more


def _by_row(pairs: torch.Tensor) -> dict[int, list[int]]:
    """(T_q, T_k) bool -> {i: [j, ...]} for the True entries."""
    rows: dict[int, list[int]] = {}
    for i, j in pairs.nonzero().tolist():
        rows.setdefault(i, []).append(j)
    return rows


def _future_leaks(depends: torch.Tensor) -> dict[int, list[int]]:
    """(T, T) bool, [i, j] True where position i depends on j -> {i: [j > i, ...]}."""
    return _by_row(depends.triu(diagonal=1))


def check_causal_mask(got: torch.Tensor, expected: torch.Tensor, name: str = "causal mask") -> None:
    """A (T_q, T_k) boolean mask, True = may attend; recognises the usual ways to get it wrong."""
    if got.dtype != torch.bool:
        raise fail(f"{name}: dtype {got.dtype}, expected torch.bool (True = may attend): build it with "
                   "torch.ones(T, T, dtype=torch.bool).tril(), or compare, e.g. j <= i.")
    if tuple(got.shape) != tuple(expected.shape):
        raise fail(f"{name}: shape {fmt_shape(got.shape)}, expected {fmt_shape(expected.shape)}.")
    if torch.equal(got, expected):
        return
    t_q, t_k = expected.shape
    known = {
        Mistake("mask.wrong_triangle", "it is on the wrong triangle: True must be on and below the diagonal (key "
                "j <= query i), use tril, not triu"): torch.ones_like(expected).triu(diagonal=t_k - t_q),
        Mistake("mask.diagonal_masked", "the diagonal is masked: every position must see itself (tril(), not "
                "tril(diagonal=-1))"): expected & ~torch.ones_like(expected).triu(diagonal=t_k - t_q),
        Mistake("mask.inverted", "True and False are swapped: True means 'may attend'"): ~expected,
    }
    for description, wrong in known.items():
        if torch.equal(got, wrong):
            raise fail(f"{name}: {description}.", mistake_key(description))
    leaks = _by_row(got & ~expected)
    hidden = (~got & expected).nonzero().tolist()
    problems = []
    if leaks:
        problems.append("it lets the future through: " + describe_leaks(leaks))
    if hidden:
        problems.append(f"it hides {len(hidden)} allowed (query, key) pairs, e.g. {tuple(hidden[0])}")
    raise fail(f"{name}: " + "; ".join(problems or ["it differs from the causal mask"]) + ".")


def check_rows_sum_to_one(weights: torch.Tensor, name: str = "attention weights") -> None:
    """(..., T_q, T_k) weights: each row (a query) is a softmax over the keys."""
    ones = torch.ones(weights.shape[:-1], dtype=torch.float64)
    row_sums = weights.double().sum(-1)
    if torch.allclose(row_sums, ones, atol=1e-4):
        return
    if weights.size(-1) == weights.size(-2) and torch.allclose(weights.double().sum(-2), ones, atol=1e-4):
        raise fail(f"{name}: each column sums to 1 instead of each row. The softmax is over the wrong axis: "
                   "each query i spreads its attention over the keys j, so use softmax(dim=-1).",
                   "softmax.over_queries")
    nan_rows = row_sums.isnan()
    if nan_rows.any():
        index = tuple(int(i) for i in nan_rows.nonzero()[0])
        raise fail(f"{name}: row {fmt_index(index)} is NaN. A softmax over scores that are all -inf (every key of "
                   "that query masked) divides 0 by 0: every query must keep at least one key, itself (the causal "
                   "mask's diagonal is True).", "softmax.empty_row")
    index = tuple(int(i) for i in torch.unravel_index((row_sums - 1).abs().argmax(), row_sums.shape))
    raise fail(f"{name}: row {fmt_index(index)} sums to {row_sums[index].item():.4g}, expected 1. Each query's "
               "weights are a softmax over the keys: is the softmax missing, or the mask applied after it?")


def check_no_future_weight(weights: torch.Tensor, name: str = "attention weights") -> None:
    """(..., T, T) weights put no weight on a key after its query; lists the positions that see the future."""
    t = weights.size(-1)
    future = weights.detach().abs().reshape(-1, t, t).amax(0) > 1e-6  # [i, j]: some batch puts weight on j
    leaks = _future_leaks(future)
    if not leaks:
        return
    above = torch.ones(t, t, dtype=torch.bool).triu(diagonal=1)
    if not bool(future[above.T].any()) and bool(future[above].all()):
        raise fail(f"{name}: weight on the future and none on the past: the mask is on the wrong triangle "
                   "(mask the keys j > i, keep j <= i: tril, not triu).", "mask.wrong_triangle")
    raise fail(f"{name}: weight on the future ({describe_leaks(leaks)}). Mask the scores above the "
               "diagonal with -inf before the softmax.")


def check_attention_weights(weights: torch.Tensor, name: str = "attention weights") -> None:
    """Rows sum to 1 and no weight on the future."""
    check_rows_sum_to_one(weights, name)
    check_no_future_weight(weights, name)


def perturbed_copies(x: torch.Tensor, dim: int = 1, vocab_size: int | None = None) -> torch.Tensor:
    """(T + 1, *x.shape): copy 0 is x, copy t + 1 has position t (along `dim`) changed.

    Feed each copy through a model and compare outputs with `check_causal`: a causal model's outputs before
    position t do not change when position t does. Token ids need `vocab_size` (a changed id stays in range).
    """
    t = x.size(dim)
    copies = [x]
    for pos in range(t):
        changed = x.clone()
        index = [slice(None)] * x.dim()
        index[dim] = pos
        if vocab_size is not None:
            changed[tuple(index)] = (changed[tuple(index)] + 1) % vocab_size
        else:
            changed[tuple(index)] = changed[tuple(index)] + 1.0 + changed[tuple(index)].abs()
        copies.append(changed)
    return torch.stack(copies)


def check_causal(outputs: torch.Tensor, name: str, dim: int = 1, atol: float = 1e-6) -> None:
    """`outputs` (T + 1, ...) of the `perturbed_copies` inputs: raise listing positions that see the future."""
    base, rest = outputs[0], outputs[1:]
    t = base.size(dim)
    depends = torch.zeros(t, t, dtype=torch.bool)  # [i, j]: output i changed when input j changed
    for j in range(t):
        diff = (rest[j] - base).abs().movedim(dim, 0).reshape(t, -1)
        depends[:, j] = diff.amax(-1) > atol
    leaks = _future_leaks(depends)
    if leaks:
        raise fail(f"{name}: not causal, changing a later input changes earlier outputs; "
                   f"{describe_leaks(leaks)}.")


def _count_causes(config: GPTConfig) -> list[tuple[str | None, int, str, Mistake]]:
    """(component, amount, formula, likely cause): what a parameter count is commonly off by, sign included, each
    cause a `Mistake` with its key. The component is the one the mistake changes (None: several, so only a total is
    off by that amount)."""
    c, v, n, f, t = config.d_model, config.vocab_size, config.n_layers, config.hidden_width, config.context_length
    kv = config.kv_heads * config.d_head  # the width of k and of v
    norm = 2 * c if config.norm == "layernorm" and config.norm_bias else c
    mlp_bias = 2 * f + c if config.mlp == "swiglu" else f + c
    causes = [
        ("output_projection", v * c, "V x d", Mistake("params.untied_head", "untied output projection? With "
                                                      "tie_weights=True the output projection is the token embedding "
                                                      "matrix, counted once")) if config.tie_weights else
        ("output_projection", -v * c, "V x d", Mistake("params.head_counted_tied", "output projection counted as "
                                                       "tied? With tie_weights=False it has its own V x d matrix")),
        ("attention", -n * c * c, "N x d^2", Mistake("params.no_attention_output", "the attention output projection "
                                                     "(d x d per block) is missing?")),
        ("final_norm", -norm, "one norm", Mistake("params.no_final_norm", "the final norm is missing?")),
        ("block_norms", -2 * n * norm, "2N norms", Mistake("params.no_block_norms", "the two norms of every block "
                                                           "are missing?")),
        ("block_norms", -n * norm, "N norms", Mistake("params.one_norm_per_block", "one norm per block counted? Each "
                                                      "block has two, one before attention and one before the MLP")),
        ("position_embedding", -t * c, "T_max x d", Mistake("params.no_position_table", "the learned position table "
                                                            "is missing?"))
        if config.position == "learned" else
        ("position_embedding", t * c, "T_max x d", Mistake("params.position_table_counted", f"a learned position "
                                                           f"table counted, but positions are {config.position!r} "
                                                           "(no parameters)")),
    ]
    for component, present, amount, formula, missing, counted in (
        ("attention", config.attn_bias, n * (2 * c + 2 * kv), "N x 4d",
         Mistake("params.attention_bias_missing", "the attention biases not counted?"),
         Mistake("params.attention_bias_counted", "the attention biases counted, but this config has none")),
        ("mlp", config.mlp_bias, mlp_bias * n, "the MLP biases",
         Mistake("params.mlp_bias_missing", "the MLP biases not counted?"),
         Mistake("params.mlp_bias_counted", "the MLP biases counted, but this config has none")),
        ("output_projection", config.lm_head_bias, v, "V",
         Mistake("params.head_bias_missing", "the output projection's bias (lm_head_bias) not counted?"),
         Mistake("params.head_bias_counted", "the output projection's bias (lm_head_bias) counted, but this config "
                                             "has none")),
    ):
        causes.append((component, -amount, formula, missing) if present else (component, amount, formula, counted))
    if config.attn_bias:
        causes.append(("attention", -n * (c + 2 * kv), "N x 3d", Mistake(
            "params.one_attention_bias", "one attention bias per block counted? Each of the four projections (q, k, v "
                                         "and the output) has its own bias, 4d per block")))
    if config.mlp == "swiglu":
        causes.append(("mlp", -n * c * f, "N x d x F", Mistake("params.swiglu_two_matrices", "SwiGLU has three "
                                                               "matrices (gate, value, output), not two")))
        causes.append(("mlp", n * c * f, "N x d x F", Mistake("params.swiglu_four_matrices", "SwiGLU has three d x F "
                                                              "matrices, not four")))
        if config.mlp_bias:
            causes.append(("mlp", -n * f, "N x F", Mistake(
                "params.swiglu_bias_as_gelu", "SwiGLU's biases counted as a GELU MLP's, F + d: its fused "
                                              "gate-and-value matrix d -> 2F has 2F biases, so 2F + d per block")))
        if config.d_ff is None:  # F = 4d, the ReLU/GELU default, where SwiGLU's is 2d
            wide = 4 * c - f
            causes.append(("mlp", n * (3 * c * wide + (2 * wide if config.mlp_bias else 0)), "F = 4d", Mistake(
                "params.swiglu_default_4d", "d_ff=None means F = 2d for SwiGLU, not 4d (the ReLU/GELU default): read "
                                            "F from config.hidden_width, which knows each MLP's default")))
    if config.norm == "layernorm" and config.norm_bias:
        causes.append((None, -(2 * n + 1) * c, "(2N + 1) x d", Mistake(
            "params.layernorm_no_beta", "LayerNorm's bias (beta) is not counted?")))
        causes.append(("block_norms", -2 * n * c, "2N x d", Mistake(
            "params.layernorm_no_beta", "the block norms' LayerNorm bias (beta) is not counted?")))
        causes.append(("final_norm", -c, "d", Mistake(
            "params.layernorm_no_beta", "the final LayerNorm's bias (beta) is not counted?")))
    if config.norm == "rmsnorm":
        rms = Mistake("params.rmsnorm_bias", "a bias counted in each RMSNorm? norm='rmsnorm' never has one, only its "
                                             "gain, d per norm (norm_bias is LayerNorm's beta)")
        causes += [(None, (2 * n + 1) * c, "(2N + 1) x d", rms), ("block_norms", 2 * n * c, "2N x d", rms),
                   ("final_norm", c, "d", rms)]
    total = sum(parameter_breakdown(config).values())
    estimate = Mistake("params.estimate_12nd2", "the usual estimate of the blocks (4d^2 attention + 8d^2 MLP, no norms "
                                                "or biases) is not the count: add up every component of this config "
                                                "exactly, as your parameter_breakdown does")
    for extra, formula in ((0, ""), (v * c, " + V d"), (v * c + t * c, " + V d + T_max d")):
        causes.append((None, 12 * n * c * c + extra - total, f"12 N d^2{formula}, not the count", estimate))
    return causes


def _explain_difference(diff: int, config: GPTConfig, component: str | None = None) -> tuple[str, list[str | None]]:
    """What the usual mistakes say of a count off by `diff` (of `component`, or (None) of the total), and the keys
    of the mistakes it names, in order (None for a cause without one; [] when none explains it)."""
    causes = [(a, f, w) for k, a, f, w in _count_causes(config) if component is None or k == component]
    single = [(formula, why) for amount, formula, why in causes if amount == diff]
    if single:  # two mistakes can be off by the same amount: name both
        return (f"{diff:+,} = " + "; or ".join(f"{formula}: {why}" for formula, why in single),
                [mistake_key(why) for _, why in single])
    for (a1, f1, w1), (a2, f2, w2) in combinations(causes, 2):
        if a1 + a2 == diff:
            return f"{diff:+,} = {a1:+,} ({f1}: {w1}) {a2:+,} ({f2}: {w2})", [mistake_key(w1), mistake_key(w2)]
    return f"{diff:+,}: no single common mistake explains it; compare component by component", []


def check_parameter_count(got: int | Mapping[str, int], config: GPTConfig, name: str = "parameter count") -> None:
    """Compare a total or a per-component count with `parameter_breakdown(config)`; explain a mismatch. Its key is
    the mistake named in the most wrong components (the first named where that is a tie): LayerNorm's beta left out
    makes the block norms look like one norm per block, and the final norm tells them apart."""
    expected = parameter_breakdown(config)
    total = sum(expected.values())
    if isinstance(got, Mapping):
        unknown = sorted(set(got) - set(expected))
        missing = sorted(set(expected) - set(got))
        if unknown or missing:
            raise fail(f"{name}: components {sorted(got)}; expected exactly {list(expected)}"
                       + (f" (missing: {missing})" if missing else "") + (f" (unknown: {unknown})" if unknown else ""))
        wrong = [(k, int(got[k]), v, *_explain_difference(int(got[k]) - v, config, k))
                 for k, v in expected.items() if int(got[k]) != v]
        if wrong:
            named = Counter(key for *_, keys in wrong for key in dict.fromkeys(keys) if key)
            raise fail(f"{name}: {len(wrong)} component(s) wrong: "
                       + "; ".join(f"{k} is {g:,}, expected {v:,} ({why})" for k, g, v, why, _ in wrong) + ".",
                       named.most_common(1)[0][0] if named else None)
        return
    got = int(got)
    if got != total:
        parts = ", ".join(f"{k} {v:,}" for k, v in expected.items())
        why, keys = _explain_difference(got - total, config)
        raise fail(f"{name}: {got:,}, expected {total:,}: {why}. Expected by component: {parts}.",
                   next(filter(None, keys), None))


GPT_COMPONENTS = {  # first matching prefix of a GPT parameter name -> parameter_breakdown key
    "tok_emb.": "token_embedding",
    "pos_emb.": "position_embedding",
    "final_norm.": "final_norm",
    "lm_head.": "output_projection",
}
BLOCK_COMPONENTS = {"attn.": "attention", "mlp.": "mlp", "norm1.": "block_norms", "norm2.": "block_norms"}


def gpt_module_breakdown(model: torch.nn.Module) -> dict[str, int]:
    """Parameters of a GPT-like module (gptcourse names) by `parameter_breakdown` component; tied counted once."""
    counts = dict.fromkeys(
        ("token_embedding", "position_embedding", "attention", "mlp", "block_norms", "final_norm",
         "output_projection"), 0)
    for full_name, p in model.named_parameters():  # named_parameters yields a tied tensor once
        if full_name.startswith("blocks."):
            rest = full_name.split(".", 2)[2]
            key = next((v for k, v in BLOCK_COMPONENTS.items() if rest.startswith(k)), None)
        else:
            key = next((v for k, v in GPT_COMPONENTS.items() if full_name.startswith(k)), None)
        if key is None:
            raise fail(f"parameter {full_name!r} does not belong to a known component; expected names starting "
                       f"with {list(GPT_COMPONENTS)} or blocks.i.{list(BLOCK_COMPONENTS)}")
        counts[key] += p.numel()
    return counts
