"""Lab 14, evaluating a language model: `loglikelihood(model, context, continuation)`, `choice_scores(logprobs,
choices, normalize)`, `pass_at_k(n, c, k)`, `paired_bootstrap(a, b, resamples, seed)` and `ngram_overlap(train_text,
items, n)`.

`loglikelihood` scores one request and is given a stand-in model, a bigram table (the logits at a position are the
table's row of the token there), so a continuation read one position off gives other numbers. The bootstrap's
draws are fixed by the lab, `torch.randint(N, (resamples, N), generator=torch.Generator().manual_seed(seed))`, and
its interval is the 2.5% and 97.5% quantiles of the resampled differences, so it is compared exactly. The
references are gptcourse's (`loglikelihood`, `pass_at_k`, `paired_bootstrap`, `ngram_overlap`), each wrapped where
the lab's interface differs (said at its `expected`); the choice scores' is written here (gptcourse's scores a
model's choices end to end).
"""

from __future__ import annotations

import math
import random
import re
import unicodedata
from functools import cache, partial
from typing import Any

import torch
from torch.nn import functional as F

from ...checks import Mistake, check_close, check_known_mistakes, fail, fmt_shape
from ...evaluation.contamination import ngram_overlap, words
from ...evaluation.continuations import loglikelihood
from ...evaluation.error_bars import paired_bootstrap
from ...evaluation.unbiased_pass import pass_at_k
from ..cases import Inputs, Outputs, sized, tensor_rng
from ..fixtures import LOG_SOFTMAX_FUNCTIONS
from ..piece import Piece, Rows, declare
from ..student import as_number, as_tensor, describe_error

# a right answer computed in float32 (torch's default) is off by about 1e-7 of its value (choice scores of -12 at
# most, bootstrap differences of at most 1); every mistake is further away than this
FLOAT32_ROUNDING = 1e-6
# Each piece forbids its own references (none calls another): a student who imports one loses that piece alone.
_LOGLIKELIHOOD = ("gptcourse.evaluation.continuations", *LOG_SOFTMAX_FUNCTIONS)  # lesson 15's token_logprobs too
_CHOICES = ("gptcourse.score_choices", "gptcourse.multiple_choice_accuracy", "gptcourse.evaluation.multiple_choice")
_PASS = ("gptcourse.pass_at_k", "gptcourse.evaluation.unbiased_pass")
_BOOTSTRAP = ("gptcourse.paired_bootstrap", "gptcourse.bootstrap_interval", "gptcourse.evaluation.error_bars")
_OVERLAP = ("gptcourse.ngram_overlap", "gptcourse.evaluation.contamination")


# ---- loglikelihood(model, context, continuation) -> (log p(continuation | context), greedy)


class _Bigram:
    """A stand-in language model: the logits at each position are row `ids[t]` of a table (V, V), whatever came
    before. Like a GPT it takes integer token ids (B, T) and nothing else; `config.context_length` is there for code
    that reads it."""

    def __init__(self, table: torch.Tensor) -> None:
        self.table = table
        self.config = type("Config", (), {"context_length": 64, "vocab_size": table.size(0)})()

    def __call__(self, ids: torch.Tensor, attention_mask: torch.Tensor | None = None) -> torch.Tensor:
        if not isinstance(ids, torch.Tensor) or ids.dim() != 2 or ids.dtype not in (torch.int64, torch.int32):
            given = (f"ids of shape {fmt_shape(ids.shape)}, {ids.dtype}" if isinstance(ids, torch.Tensor)
                     else f"a {type(ids).__name__}")
            raise fail(f"the model was called with {given}: like a GPT (B, T = ids.shape in its forward) it takes "
                       "integer token ids with a batch dimension, (1, T) for one request, torch.tensor([context + "
                       "continuation[:-1]]), and gives logits (1, T, V)", mistake="14.model_called_without_batch")
        return self.table[ids]  # (B, T, V)


def _ll_inputs(v: int, context: int, continuation: int | str, seed: int) -> Inputs:
    """A bigram table (V, V) and a request: a continuation of `continuation` random tokens, or one token per mark,
    the table's rows changed to make it so: "+" the token argmax decoding writes, "*" that token with two others 0.1
    below it (its probability under one half), "-" another token, "~" another 5e-4 below the argmax (a near tie),
    "!" another 200 below the argmax (its probability underflows to 0 in float32)."""
    gen = tensor_rng(seed)
    table = torch.randn(v, v, generator=gen) * 2
    ctx = torch.randint(0, v, (context,), generator=gen).tolist()
    marks = continuation if isinstance(continuation, str) else "?" * continuation  # "?": left as drawn
    cont = torch.randint(0, v, (len(marks),), generator=gen).tolist()
    for i, mark in enumerate(marks):
        row = table[(ctx + cont[:i])[-1]]  # (V,), a view: the logits that predict cont[i]
        best = int(row.argmax())
        if mark in "+*":
            cont[i] = best
        elif mark != "?" and cont[i] == best:
            cont[i] = (best + 1) % v  # not the argmax
        if mark == "*":
            row[[(best + 1) % v, (best + 2) % v]] = row[best] - 0.1
        elif mark in "~!":
            row[cont[i]] = row[best] - (5e-4 if mark == "~" else 200)
    return {"table": table, "context": ctx, "continuation": cont}


def _ll_call(fn: Any, inputs: Inputs) -> Outputs:
    context, continuation = list(inputs["context"]), list(inputs["continuation"])
    what = f"loglikelihood(model, context of {len(context)} tokens, continuation of {len(continuation)})"
    result = fn(_Bigram(inputs["table"].clone()), context, continuation)
    if not isinstance(result, tuple) or len(result) != 2:
        raise fail(f"{what} returned {type(result).__name__}, expected a tuple (log-probability, greedy)")
    logprob, greedy = result
    if isinstance(greedy, torch.Tensor) and greedy.numel() == 1:
        greedy = bool(greedy.item())
    if not isinstance(greedy, bool):
        raise fail(f"{what}: the greedy flag is {type(greedy).__name__} {greedy!r:.40}, expected a bool")
    return {"logprob": torch.tensor(float(as_number(logprob, what, "a number (the summed log-probability)")),
                                    dtype=torch.float64), "greedy": torch.tensor(greedy)}


def _ll_expected(inputs: Inputs) -> Outputs:
    """gptcourse's loglikelihood takes a batch of requests; the lab's scores one."""
    logprobs, greedy = loglikelihood(_Bigram(inputs["table"]), [inputs["context"]], [inputs["continuation"]])
    return {"logprob": logprobs[0].double(), "greedy": greedy[0]}


# how the logits (T, V) become the scores summed (`_scored`): right, then the usual mistakes
NORMALISED = {
    "log_softmax": lambda logits: F.log_softmax(logits, dim=-1),
    "probabilities": lambda logits: F.softmax(logits, dim=-1),
    "logits": lambda logits: logits,
    "log of softmax": lambda logits: F.softmax(logits, dim=-1).log(),
    "over positions": lambda logits: F.log_softmax(logits, dim=0),
}


def _scored(table: torch.Tensor, context: list[int], continuation: list[int], *, shift: int = 1,
            with_context: bool = False, drop_first: bool = False, mean: bool = False,
            normalised: str = "log_softmax") -> float:
    """The log-probability of the continuation, right or with one of the usual mistakes: each token read from the
    logits `shift` positions before it (1; 0 is the whole sequence fed), only the continuation's tokens scored
    (`with_context`: the context's too), all of them (`drop_first`), summed, the logits NORMALISED[`normalised`].
    NaN where the rows a shift asks for do not exist."""
    tokens = context + continuation
    fed = tokens if shift == 0 else tokens[:-1]  # what the model reads
    scores = NORMALISED[normalised](table[torch.tensor(fed)])  # (T, V): the logits at t come from the token at t
    start = 1 if with_context else len(context) + drop_first
    target = torch.tensor(tokens[start:])
    if start < shift:
        return math.nan
    picked = scores[start - shift : start - shift + len(target)].gather(-1, target[:, None])  # (m, 1)
    return float(picked.mean() if mean else picked.sum())


def _greedy(table: torch.Tensor, context: list[int], continuation: list[int], *, which: str = "all",
            slack: float = 0.0, majority: bool = False) -> bool:
    """Whether argmax decoding from the context writes the continuation, right or with one of the usual mistakes:
    only some of its tokens checked (`which`: "first", "last", "any"), a token within `slack` of its row's largest
    logit taken for the argmax, a probability above one half asked of each token (`majority`)."""
    rows = table[torch.tensor(context + continuation[:-1])][len(context) - 1 :]  # (m, V): the rows that predict it
    target = torch.tensor(continuation)  # (m,)
    picked = rows.gather(-1, target[:, None])[:, 0]  # (m,)
    if majority:
        hits = F.softmax(rows, dim=-1).gather(-1, target[:, None])[:, 0] > 0.5
    else:
        hits = picked >= rows.max(dim=-1).values - slack if slack else rows.argmax(dim=-1) == target
    return bool({"all": hits.all(), "any": hits.any(), "first": hits[0], "last": hits[-1]}[which])


LL_MISTAKES = {
    Mistake("14.ll_context_counted",
            "the context's tokens are counted too: only the continuation's tokens are scored, log p(continuation | "
            "context)"): {"with_context": True},
    Mistake("14.ll_no_shift",
            "each token was scored with the logits at its own position: the logits at position t predict the token at "
    "t + 1, so feed context + continuation[:-1] and read the continuation's tokens from the positions just before "
    "them"): {"shift": 0},
    Mistake("14.ll_shift_two",
          "each token was scored with the logits two positions before it, one position early (logits[-m - 1:-1]): with "
          "context + continuation[:-1] fed, the rows that predict the continuation are its last len(continuation), "
          "logits[-len(continuation):]"): {"shift": 2},
    Mistake("14.ll_mean",
        "the log-probabilities are averaged: a continuation's log-probability is the sum of its tokens' (the mean is a "
        "normalisation, done later, per choice)"): {"mean": True},
    Mistake("14.ll_probabilities_summed",
            "the probabilities are summed, not their logs: use log_softmax"): {"normalised": "probabilities"},
    Mistake("14.ll_first_not_scored",
          "the continuation's first token is not scored: it is predicted by the logits at the context's last position, "
          "len(context) - 1, and every token of the continuation counts"): {"drop_first": True},
    Mistake("14.ll_raw_logits",
          "the raw logits were summed, not log-probabilities: normalise them with log_softmax first (a log-probability "
          "is at most 0)"): {"normalised": "logits"},
    Mistake("14.ll_softmax_over_positions",
         "log_softmax ran over the positions (dim=1 of the logits (1, T, V)), not over the vocabulary: each position's "
         "logits are normalised on their own, F.log_softmax(logits, dim=-1)"): {"normalised": "over positions"},
    Mistake("14.ll_log_of_softmax",
            "log(softmax(logits)) is -inf where a token's probability underflows to 0 in float32 (exp(-200) does): "
            "F.log_softmax computes logits - logsumexp(logits), which stays finite"): {"normalised": "log of softmax"},
}


def _ll_mistakes(table: torch.Tensor, context: list[int], continuation: list[int]) -> dict[str, torch.Tensor]:
    """{why: the log-probability that mistake gives} (`LL_MISTAKES`' switches of `_scored`)."""
    return {why: torch.tensor(_scored(table, context, continuation, **flags), dtype=torch.float64)
            for why, flags in LL_MISTAKES.items()}


def _ll_judge(got: Outputs, expected: Outputs, inputs: Inputs) -> None:
    table, context, continuation = inputs["table"], inputs["context"], inputs["continuation"]
    label, logprob, want = "the log-probability of the continuation", got["logprob"], expected["logprob"]
    variants = cache(partial(_ll_mistakes, table, context, continuation))  # computed if it is wrong
    check_known_mistakes(logprob, want, variants, label, atol=1e-4, rtol=1e-4)
    error = abs(float(logprob - want))
    if 1e-4 * (1 + abs(float(want))) < error < 1e-2 * max(1.0, abs(float(want))):
        raise fail(f"{label}: off by {error:.2g} (got {float(logprob):.5g}, expected {float(want):.5g}), as small as "
                   "the rounding of a 16-bit float: were the logits cast to float16 or bfloat16 (about 3 and 2 "
                   "significant digits; float32 keeps 7)? Compute log_softmax in float32, the model's dtype",
                   mistake="14.ll_half_precision")
    check_close(logprob, want, label, atol=1e-4, rtol=1e-4, mistakes=variants)
    if bool(got["greedy"]) != bool(expected["greedy"]):
        raise fail(_greedy_mistake(table, context, continuation, bool(got["greedy"])))


def _greedy_mistake(table: torch.Tensor, context: list[int], continuation: list[int], flag: bool) -> str:
    """What is wrong with a greedy flag `flag` that is not the right one: the usual mistakes that give it."""
    rows = table[torch.tensor(context + continuation[:-1])][len(context) - 1 :]  # (m, V)
    target = torch.tensor(continuation)
    gaps = (rows.max(dim=-1).values - rows.gather(-1, target[:, None])[:, 0]).tolist()  # 0 where it is the argmax
    missed = [i for i, gap in enumerate(gaps) if rows[i].argmax() != target[i]]
    rule = ("greedy means argmax decoding writes every token of the continuation, (logits.argmax(-1) == "
            "continuation).all()")
    if not flag:
        probabilities = F.softmax(rows, dim=-1).gather(-1, target[:, None])[:, 0]
        if not _greedy(table, context, continuation, majority=True):
            return (f"the greedy flag is False, expected True: each token of the continuation is the argmax, but at "
                    f"position(s) {(probabilities <= 0.5).nonzero().flatten().tolist()} with a probability of only "
                    f"{float(probabilities.min()):.2f}, and a flag that asks for more than one half says False "
                    f"(the most likely token need not hold most of the mass): {rule}")
        return f"the greedy flag is False, expected True: {rule}"
    some = [label for which, label in (("first", "only the first token"), ("last", "only the last token"),
                                       ("any", "any() of them")) if _greedy(table, context, continuation, which=which)]
    causes = [f"the flag checks {', '.join(some[:-1])} or {some[-1]}" if len(some) > 1
              else f"the flag checks {some[0]}"] if some else []
    if _greedy(table, context, continuation, slack=0.01):
        causes.append(f"a near tie was taken for the argmax: those tokens are {max(gaps[i] for i in missed):.2g} "
                      "below the largest logit, and a tolerance (max - logit < 1e-3, isclose) calls that the "
                      "argmax; argmax decoding takes the largest exactly")
    return (f"the greedy flag is True, but the argmax is not the continuation's token at position(s) {missed}: "
            + "; ".join(causes or ["it is True only when each of them is"]) + f"; {rule}")


@sized
def _ll_hidden(r: random.Random, seed: int) -> Inputs:
    """Other sizes; the continuation the argmax path, or the argmax but for its first token, or random tokens none
    of which is the argmax (so the flag says the same for checking only the first token)."""
    m = r.randint(2, 6)
    return _ll_inputs(r.randint(5, 30), r.randint(2, 8), r.choice(["+" * m, "-" + "+" * (m - 1), "-" * m]), seed)


# ---- choice_scores(logprobs (C,), choices, normalize) -> scores (C,)

NORMALIZE = (None, "chars", "bytes")
# the Unicode normal forms that change the lab's choices, and how (a mistake: the characters are counted as given)
UNICODE_FORMS = {
    "NFD": "decomposes an accented letter into the letter and a combining accent",
    "NFKD": "decomposes an accented letter into the letter and a combining accent, and '½' into '1⁄2'",
    "NFKC": "turns '½' into '1⁄2'",
}


def _length(choice: str, normalize: str | None, delimiter: str = "", unit: str | None = None,
            form: str | None = None) -> int:
    """The length `normalize` divides by (1 for None), or, with one of the usual mistakes, of the choice after a
    `delimiter`, in another `unit`, or of its Unicode normal `form`."""
    text = delimiter + (unicodedata.normalize(form, choice) if form else choice)
    counts = {"chars": len(text), "bytes": len(text.encode("utf-8")), "words": len(text.split()),
              "two bytes at most": sum(1 if ord(ch) < 128 else 2 for ch in text)}
    return 1 if normalize is None else counts[unit or normalize]


def _scores_by_hand(logprobs: torch.Tensor, choices: list[str], normalize: str | None, *, softmax: bool = False,
                    multiplied: bool = False, ignored: bool = False, **length: Any) -> torch.Tensor:
    """Each choice's log-likelihood over its length, whose switches give each known mistake: the scores through a
    softmax over the choices, the log-likelihoods multiplied by the lengths, or returned as they were (`ignored`);
    `length`: the switches of `_length` (the delimiter counted, another unit, a Unicode normal form)."""
    if ignored:
        return logprobs
    lengths = torch.tensor([_length(c, normalize, **length) for c in choices], dtype=logprobs.dtype)  # (C,)
    scores = logprobs * lengths if multiplied else logprobs / lengths
    return torch.softmax(scores, dim=0) if softmax else scores


def _choice_inputs(choices: list[str], normalize: str | None, seed: int, tie: bool = False) -> Inputs:
    logprobs = -torch.rand(len(choices), generator=tensor_rng(seed), dtype=torch.float64) * 12 - 0.5
    if tie:
        logprobs[1] = logprobs[0]
    return {"logprobs": logprobs, "choices": choices, "normalize": normalize, "sizes": {"C": len(choices)}}


def _choice_call(fn: Any, inputs: Inputs) -> Outputs:
    what = f"choice_scores(logprobs, {inputs['choices']!r:.60}, normalize={inputs['normalize']!r})"
    logprobs = inputs["logprobs"].clone()
    got = as_tensor(fn(logprobs, list(inputs["choices"]), inputs["normalize"]), what)
    if not torch.equal(logprobs, inputs["logprobs"]):
        was, now = ([round(x, 3) for x in t.tolist()] for t in (inputs["logprobs"], logprobs))
        raise fail(f"{what} changed the caller's logprobs in place, from {was} to {now}: the caller's "
                   "log-likelihoods are lost (a second normalisation would divide them twice); divide into a new "
                   "tensor, logprobs / lengths, not logprobs /= lengths", mistake="14.choice_in_place")
    return {"scores": got.double()}


def _choice_expected(inputs: Inputs) -> Outputs:
    """The harness's acc_norm (characters) and acc_bytes (UTF-8 bytes) divide a choice's log-likelihood by its own
    length, without the delimiter before it; gptcourse.score_choices runs a model, so the division is here."""
    return {"scores": _scores_by_hand(inputs["logprobs"], inputs["choices"], inputs["normalize"])}


# why -> the switches of `_scores_by_hand` that make that mistake
_CHOICE_MISTAKES = {
    Mistake("14.choice_delimiter_counted",
            "the delimiter is counted in the length: divide by the choice's own length, len(choice), as the harness "
            "does (the space before it is part of the continuation, not of the answer)"):
        {"delimiter": " "},
    Mistake("14.choice_bytes_as_chars",
            "the bytes were counted as characters: len(choice) counts characters; a choice's UTF-8 bytes are "
            "len(choice.encode('utf-8')), more than its characters when it holds non-ASCII letters"):
        {"unit": "chars"},
    Mistake("14.choice_words",
            "the lengths are the number of words, len(choice.split()): acc_norm divides by the characters, "
            "len(choice), and acc_bytes by the UTF-8 bytes"):
        {"unit": "words"},
    Mistake("14.choice_chars_as_bytes",
            "the characters were counted as bytes: acc_norm divides by len(choice), the characters; "
            "len(choice.encode('utf-8')) is more than that when a choice holds non-ASCII letters"):
        {"unit": "bytes"},
    Mistake("14.choice_two_bytes_at_most",
            "the bytes were counted as 1 per ASCII character and 2 per other one: UTF-8 takes 2 bytes up to U+07FF "
            "(accents, Greek), 3 beyond it ('東' is 3) and 4 past U+FFFF (emoji); count them, "
            "len(choice.encode('utf-8'))"):
        {"unit": "two bytes at most"},
    Mistake("14.choice_softmax",
            "the scores went through a softmax over the choices (they are probabilities, summing to 1): a choice's "
            "score is its log-likelihood divided by its length, and the harness takes the argmax of those"):
        {"softmax": True},
} | {Mistake("14.choice_unicode_normalized",
             f"the characters were counted after unicodedata.normalize({form!r}), which {change}: count the "
             "choice's characters as they are given, len(choice)"): {"form": form}
     for form, change in UNICODE_FORMS.items()}


def _choice_rows(inputs: Inputs) -> Rows:
    """The known mistakes of a case; those of the division only where there is one (normalize is not None)."""
    normalize = inputs["normalize"]
    return _CHOICE_MISTAKES if normalize is None else _CHOICE_MISTAKES | {
        Mistake("14.choice_multiplied",
                "the scores were multiplied by the lengths: divide the log-likelihood by the length"):
            {"multiplied": True},
        Mistake("14.choice_normalize_ignored",
                f"normalize={normalize!r} was ignored: the log-likelihoods came back as they were"):
            {"ignored": True},
    }


@sized
def _choice_hidden(r: random.Random, seed: int) -> Inputs:
    """Choices by characters (hidden_unicode divides by bytes), "São Paulo" among them: non-ASCII, two words."""
    pool = ["Paris", "Lyon", "Zürich", "Genève", "東京", "a", "ab", "abc", "naïve", "Ελλάδα", "42"]
    choices = r.sample(pool, r.randint(1, 5))
    choices.insert(r.randint(0, len(choices)), "São Paulo")
    return _choice_inputs(choices, "chars", seed, tie=r.random() < 0.3)


# ---- pass_at_k(n, c, k) for a table of (n, c, k)


PASS_TOLERANCE = 1e-9  # pass@k is a ratio of exact integers: a float64 answer is off by about 1e-16


def _pass_call(fn: Any, inputs: Inputs) -> Outputs:
    values = []
    for n, c, k in inputs["table"]:
        what = f"pass_at_k(n={n}, c={c}, k={k})"
        try:
            value = fn(n, c, k)
        except NotImplementedError:
            raise
        except Exception as err:  # say which (n, c, k), and what is special about it
            raise fail(f"{what}: {describe_error(err)}{_pass_hint(n, c, k, err)}") from None
        values.append(float(as_number(value, what, "a float in [0, 1]")))
    return {"pass": torch.tensor(values, dtype=torch.float64)}


def _pass_hint(n: int, c: int, k: int, err: Exception) -> str:
    """Why pass_at_k may fail at (n, c, k): a binomial past a float's range, or no draw without a correct sample."""
    if isinstance(err, OverflowError):
        return (f": C({n}, {k}) has {len(str(math.comb(n, k)))} digits, past a float's range (about 1.8e308): divide "
                "the exact integers, math.comb(n - c, k) / math.comb(n, k), or use the product form")
    if n - c < k:
        return (f": here n - c < k ({n - c} < {k}), so every k of the samples hold a correct one: C(n - c, k) is 0 "
                "and pass@k is 1.0, which the code must return before any log, division or product over no terms")
    return ""


def _pass_mistakes(inputs: Inputs) -> dict[str, torch.Tensor]:
    table = inputs["table"]

    def each(f: Any) -> torch.Tensor:
        return torch.tensor([f(n, c, k) for n, c, k in table], dtype=torch.float64)

    return {
        Mistake("14.pass_with_replacement",
               "this is 1 - (1 - c/n)^k, k draws *with* replacement: it is biased low; pass@k draws k of the n samples "
               "without replacement, 1 - C(n - c, k) / C(n, k)"): each(lambda n, c, k: 1 - (1 - c / n) ** k),
        Mistake("14.pass_at_one",
                "this is c / n, pass@1, whatever k: with k tries a problem is solved if any of them is right"):
            each(lambda n, c, k: c / n),
        Mistake("14.pass_none_correct",
                "this is C(n - c, k) / C(n, k), the chance that *no* sample of k is correct: pass@k is 1 minus it"):
            each(lambda n, c, k: math.comb(n - c, k) / math.comb(n, k)),
        Mistake("14.pass_product_off_by_one",
               "the product runs from i = n - c, one factor too many: 1 - C(n - c, k) / C(n, k) is 1 - prod(1 - k / i) "
               "for i in range(n - c + 1, n + 1)"):
            each(lambda n, c, k: 1.0 if n - c < k else 1 - math.prod(1 - k / i for i in range(n - c, n + 1))),
        Mistake("14.pass_union_bound",
             "this is min(1, k * c / n), the k tries' chances added up (a union bound, too high once k > 1): pass@k is "
             "1 - C(n - c, k) / C(n, k)"): each(lambda n, c, k: min(1.0, k * c / n)),
        Mistake("14.pass_floor_division",
              "the binomials were divided with //, floor division: C(n - c, k) // C(n, k) is 0 unless c = 0, so pass@k "
              "came out 1; divide with /, which gives their exact ratio as a float"):
            each(lambda n, c, k: 1 - math.comb(n - c, k) // math.comb(n, k)),
    } | {Mistake("14.pass_rounded",
                f"pass@k was rounded to {digits} decimals: return it as computed (a table rounds for print; the grader "
         f"compares to {PASS_TOLERANCE:g})"): each(lambda n, c, k, d=digits: round(pass_at_k(n, c, k), d))
         for digits in (2, 3, 4)}


def _pass_judge(got: Outputs, expected: Outputs, inputs: Inputs) -> None:
    """The default comparison, and an answer off by a little (not a rounding): an estimate, not the formula."""
    values, want = got["pass"], expected["pass"]
    mistakes = cache(partial(_pass_mistakes, inputs))  # computed if it is wrong
    check_known_mistakes(values, want, mistakes, "pass@k", atol=PASS_TOLERANCE, rtol=PASS_TOLERANCE)
    error = (values - want).abs()  # (entries,)
    if 1e-6 < float(error.max()) < 0.05:
        n, c, k = inputs["table"][int(error.argmax())]
        raise fail(f"pass@k: off by up to {float(error.max()):.2g} (at n={n}, c={c}, k={k}), unevenly, as an estimate "
                   "is: the fraction of random draws of k samples that hold a correct one (a Monte Carlo estimate) "
                   "is noisy; pass@k is exact, 1 - C(n - c, k) / C(n, k): compute it", mistake="14.pass_monte_carlo")
    check_close(values, want, "pass@k", atol=PASS_TOLERANCE, rtol=PASS_TOLERANCE, mistakes=mistakes)


def _pass_table(seed: int, largest: int) -> Inputs:
    r = random.Random(seed)
    table = []
    for _ in range(12):
        n = r.randint(2, largest)
        table.append((n, r.randint(0, n), r.randint(1, n)))
    return {"table": table}


# ---- paired_bootstrap(a, b, resamples, seed) -> (difference, low, high)


def _boot_inputs(n: int, p_a: float, p_b: float, resamples: int, seed: int) -> Inputs:
    easy = torch.rand(n, generator=tensor_rng(seed), dtype=torch.float64)  # each item's difficulty, shared
    return {"a": (easy < p_a).double(), "b": (easy < p_b).double(), "resamples": resamples, "seed": seed + 7}


def _boot_call(fn: Any, inputs: Inputs) -> Outputs:
    what = f"paired_bootstrap(a, b of {inputs['a'].numel()} items, resamples={inputs['resamples']})"
    state = torch.random.get_rng_state()
    result = fn(inputs["a"].clone(), inputs["b"].clone(), inputs["resamples"], inputs["seed"])
    if not torch.equal(torch.random.get_rng_state(), state):
        torch.random.set_rng_state(state)  # the notebook's draws go on as they would have
        raise fail(f"{what} changed torch's global random state (torch.manual_seed(seed), or a draw without "
                   "generator=): every later torch.rand in the notebook, and the caller's, then draws other numbers. "
                   "Draw from a generator of its own, generator=torch.Generator().manual_seed(seed), which leaves "
                   "the global one alone")
    if not isinstance(result, tuple) or len(result) != 3:
        raise fail(f"{what} returned {type(result).__name__}, expected a tuple (difference, low, high)")
    return {"bounds": torch.tensor([float(as_number(x, what, "three numbers")) for x in result], dtype=torch.float64)}


def _boot_expected(inputs: Inputs) -> Outputs:
    """gptcourse's returns a PairedComparison; the lab's a tuple."""
    result = paired_bootstrap(inputs["a"], inputs["b"], resamples=inputs["resamples"], seed=inputs["seed"])
    return {"bounds": torch.tensor([result.difference, result.low, result.high], dtype=torch.float64)}


def _draws(inputs: Inputs, *, short: bool = False, transposed: bool = False) -> tuple[torch.Tensor, torch.Tensor]:
    """The item indices (resamples, N) the lab draws from its seed, and a second draw after them (for b, in the
    unpaired mistake); or with one of the usual mistakes: indices below N - 1 (`short`: randint's bound taken for
    inclusive), drawn (N, resamples) and `transposed`."""
    n, resamples, gen = inputs["a"].numel(), inputs["resamples"], torch.Generator().manual_seed(inputs["seed"])
    shape, below = (n, resamples) if transposed else (resamples, n), n - 1 if short else n
    draws = tuple(torch.randint(below, shape, generator=gen) for _ in range(2))
    return tuple(rows.T for rows in draws) if transposed else draws


def _between_distinct(differences: torch.Tensor, quantiles: tuple[float, ...] = (0.975,)) -> bool:
    """Whether one of these quantiles of the differences (resamples,) lies between two distinct sorted ones: where
    they tie (0/1 scores of few items often do), indexing the sorted differences gives torch.quantile's answer, and
    other draws of a bootstrap often give the same interval."""
    ranked, last = differences.sort().values, differences.numel() - 1
    return any(bool(ranked[math.floor(q * last)] != ranked[math.ceil(q * last)]) for q in quantiles)


def _boot_mistakes(inputs: Inputs) -> dict[str, torch.Tensor]:
    a, b, resamples = inputs["a"], inputs["b"], inputs["resamples"]
    n, (rows, other) = a.numel(), _draws(inputs)
    paired, unpaired = (a[rows] - b[rows]).mean(1), a[rows].mean(1) - b[other].mean(1)
    gap = float((a - b).mean())

    def bounds(draws: torch.Tensor, low: float = 0.025, high: float = 0.975) -> torch.Tensor:
        quantiles = torch.quantile(draws, torch.tensor([low, high], dtype=draws.dtype)).tolist()
        return torch.tensor([gap, *quantiles], dtype=torch.float64)

    ranked = paired.sort().values
    (transposed, _), (short, _) = _draws(inputs, transposed=True), _draws(inputs, short=True)
    swapped = (a[transposed] - b[transposed]).mean(1)  # (resamples,): a bootstrap, with other draws
    se = float((a - b).std(correction=1)) / math.sqrt(n)
    # named only where its interval is not a tie's, which other draws (scipy's) often give as well
    transposed_draws = {
        Mistake("14.boot_transposed_draws",
             "the indices were drawn (N, resamples) and averaged over dim 0: a bootstrap too, but not the lab's draws; "
             "draw rows = torch.randint(N, (resamples, N), generator=...), a resample a row, and average over dim=1"):
            bounds(swapped)} if _between_distinct(swapped, (0.025, 0.975)) else {}
    return transposed_draws | {
        Mistake("14.boot_unpaired",
                "a and b were resampled apart (two draws of items): the bootstrap is paired, one draw of item indices "
                "rows for both, a[rows] - b[rows]"): bounds(unpaired),
        Mistake("14.boot_randint_short",
               "torch.randint(N - 1, ...) never draws the last item: randint's upper bound is exclusive (it draws 0 to "
               "high - 1), so torch.randint(N, (resamples, N)) draws every item's index"):
            bounds((a[short] - b[short]).mean(1)),
        Mistake("14.boot_item_differences",
               "the quantiles are of the items' own differences a - b (each -1, 0 or 1), not of the resampled means: a "
               "resample's difference is the mean over its items, (a[rows] - b[rows]).mean(dim=1), and the interval is "
               "on those means"): bounds(a - b),
        Mistake("14.boot_90_percent",
                "the interval is the 5% and 95% quantiles, a 90% interval: a 95% one leaves 2.5% out at each end"):
            bounds(paired, 0.05, 0.95),
        Mistake("14.boot_0_to_95",
                "the interval is the 0% and 95% quantiles: leave 2.5% out at each end, torch.quantile(differences, "
                "[0.025, 0.975])"): bounds(paired, 0.0, 0.95),
        Mistake("14.boot_index_not_interpolated",
                "the quantiles are the sorted differences at index int(0.025 * resamples) and int(0.975 * resamples): "
        "torch.quantile interpolates linearly between the two sorted values around position q * (resamples - 1)"):
            torch.tensor([gap, float(ranked[int(0.025 * resamples)]),
                          float(ranked[min(int(0.975 * resamples), resamples - 1)])], dtype=torch.float64),
        Mistake("14.boot_normal_interval",
                "this is the normal interval, difference +- 1.96 standard errors: the lab asks for the bootstrap's "
                "quantiles"): torch.tensor([gap, gap - 1.96 * se, gap + 1.96 * se], dtype=torch.float64),
        Mistake("14.boot_permutation",
                "every resample holds each item once (a permutation, sampling without replacement), so every "
        "difference is the same: draw indices with replacement, torch.randint(N, (resamples, N))"):
            torch.tensor([gap, gap, gap], dtype=torch.float64),
    }


def _boot_judge(got: Outputs, expected: Outputs, inputs: Inputs) -> None:
    got_b, want = got["bounds"], expected["bounds"]
    if abs(float(got_b[0] - want[0])) > FLOAT32_ROUNDING:
        raise fail(f"the difference is {float(got_b[0]):.4f}, expected mean(a) - mean(b) = {float(want[0]):.4f}")
    mistakes, label = cache(partial(_boot_mistakes, inputs)), "(difference, low, high)"  # if it is wrong
    check_known_mistakes(got_b, want, mistakes, label, atol=FLOAT32_ROUNDING, rtol=0)
    (low, high), width = got_b[1:].tolist(), float(want[2] - want[1])
    if low <= float(want[0]) <= high and FLOAT32_ROUNDING < float((got_b[1:] - want[1:]).abs().max()) < width / 2:
        raise fail(f"{label}: the interval [{low:.5g}, {high:.5g}] is a bootstrap's, but not the one the lab's draws "
                   f"give, [{float(want[1]):.5g}, {float(want[2]):.5g}]: the tests compare with exactly these draws, "
                   "rows = torch.randint(N, (resamples, N), generator=torch.Generator().manual_seed(seed)); other "
                   "draws (another shape, generator or library, scipy.stats.bootstrap) give another interval",
                   mistake="14.boot_other_draws")
    check_close(got_b, want, label, atol=FLOAT32_ROUNDING, rtol=0, mistakes=mistakes)


@sized
def _boot_hidden(r: random.Random, seed: int) -> Inputs:
    """Other sizes, drawn again until the 97.5% quantile lies between two distinct sorted differences (see
    `_between_distinct`)."""
    for _ in range(100):
        inputs = _boot_inputs(r.randint(10, 150), r.uniform(0.3, 0.9), r.uniform(0.3, 0.9), r.choice([200, 500]),
                              seed)
        rows, _ = _draws(inputs)
        if _between_distinct((inputs["a"][rows] - inputs["b"][rows]).mean(1)):
            return inputs
    raise RuntimeError(f"seed {seed}: no draw of 100 puts the 97.5% quantile between distinct differences")


# ---- ngram_overlap(train_text, items, n) -> the fraction of each item's n-grams found in train_text

# two lines, capitals in both
TRAIN = ("It was the best of times, it was the worst of times, it was the age of wisdom, it was the age of "
         "foolishness.\nThe model read this text in training, and every evaluation item drawn from it is seen.")


def _overlap_inputs(items: list[str], n: int, train: str = TRAIN) -> Inputs:
    return {"train": train, "items": items, "n": n}


def _overlap_call(fn: Any, inputs: Inputs) -> Outputs:
    what = f"ngram_overlap(train_text, {len(inputs['items'])} items, n={inputs['n']})"
    got = fn(inputs["train"], list(inputs["items"]), inputs["n"])
    if not isinstance(got, (list, tuple)) or len(got) != len(inputs["items"]):
        raise fail(f"{what} returned {type(got).__name__} {got!r:.60}, expected a list of one fraction per item")
    return {"overlap": torch.tensor([float(as_number(x, what, "fractions")) for x in got], dtype=torch.float64)}


def _grams(tokens: list[str], n: int, unique: bool = False, drop_last: bool = False) -> list[tuple[str, ...]]:
    grams = [tuple(tokens[i : i + n]) for i in range(len(tokens) - n + (0 if drop_last else 1))]
    return list(dict.fromkeys(grams)) if unique else grams


def _overlap(train: str, items: list[str], n: int, split: Any = words, *, split_train: Any = None,
             per_line: bool = False, substring: bool = False, short_whole: bool = False, per_word: bool = False,
             **flags: Any) -> torch.Tensor:
    """The fraction of each item's n-grams in `train`, right or with one of the usual mistakes: words found by
    `split` (the training text's by `split_train` where it differs), the training text's n-grams taken line by
    line (`per_line`), an n-gram looked for as a string in the joined training words (`substring`), an item
    shorter than n looked up whole (`short_whole`), the n-grams found divided by the item's words (`per_word`),
    the item's n-grams as `_grams`' flags say."""
    lines = train.splitlines() if per_line else [train]
    train_words = [(split_train or split)(line) for line in lines]  # a list of words a line

    def seen(m: int) -> set[tuple[str, ...]]:
        return {gram for line in train_words for gram in _grams(line, m)}

    joined = " ".join(word for line in train_words for word in line)
    out = []
    for item in items:
        mine = split(item)
        m = min(n, len(mine)) if short_whole else n
        grams, found_in = _grams(mine, m, **flags), seen(m)
        found = [" ".join(g) in joined if substring else g in found_in for g in grams]
        out.append(sum(found) / (len(mine) if per_word else len(grams)) if grams and m else 0.0)
    return torch.tensor(out, dtype=torch.float64)


def _overlap_mistakes(inputs: Inputs) -> dict[str, torch.Tensor]:
    train, items, n = inputs["train"], inputs["items"], inputs["n"]
    return {
        Mistake("14.overlap_split_spaces_lowercased",
                "the text was split on spaces only, so 'times,' is another word than 'times': compare words "
        "lowercased, without punctuation, re.findall(r'\\w+', text.lower())"):
            _overlap(train, items, n, lambda text: text.lower().split()),
        Mistake("14.overlap_split_spaces",
             "the text was split on spaces, its capitals and punctuation kept ('Times,' is another word than 'times'): "
        "compare words lowercased, without punctuation, re.findall(r'\\w+', text.lower())"):
            _overlap(train, items, n, str.split),
        Mistake("14.overlap_not_lowercased",
               "the words were not lowercased: GPT-3's rule compares them lowercased, so a copy with other capitals is "
               "still found"): _overlap(train, items, n, _cased_words),
        Mistake("14.overlap_train_not_lowercased",
                "the training text's words were not lowercased (the items' were), so 'The' in it is another word than "
        "'the' in an item: lowercase both, re.findall(r'\\w+', text.lower())"):
            _overlap(train, items, n, split_train=_cased_words),
        Mistake("14.overlap_per_line",
                "the training text's n-grams were taken line by line, so a run of words across a line break is missed: "
        "the words of the whole text are one list, re.findall(r'\\w+', train_text.lower()), and its n-grams run "
        "across its line breaks"): _overlap(train, items, n, per_line=True),
        Mistake("14.overlap_ascii_words",
             "the words are runs of the letters a-z only ([a-z]+), so digits and accented letters are dropped or split "
        "('mañana' becomes 'ma', 'ana'): \\w+ keeps them, re.findall(r'\\w+', text.lower())"):
            _overlap(train, items, n, lambda text: re.findall(r"[a-z]+", text.lower())),
        Mistake("14.overlap_unigrams",
             "the items' words were looked up one at a time (unigrams), whatever n: an n-gram is a run of n words in a "
             "row, found only where the training text holds them in that order"): _overlap(train, items, 1),
        Mistake("14.overlap_per_word",
              "the n-grams found were divided by the item's number of words: an item of L words has L - n + 1 n-grams, "
              "and its overlap is the fraction of those found"): _overlap(train, items, n, per_word=True),
        Mistake("14.overlap_short_whole",
                "an item shorter than n words was looked up whole (its words in a row in the training text): it has no "
        "n-grams, so its overlap is 0.0 (GPT-3 searched its short arithmetic problems whole, a rule of its own)"):
            _overlap(train, items, n, short_whole=True),
        Mistake("14.overlap_characters",
                "the n-grams are of characters: they are runs of n *words*, re.findall(r'\\w+', text.lower())"):
            _overlap(train, items, n, lambda text: list(text.lower())),
        Mistake("14.overlap_unique",
                "each item's n-grams were counted once each (a set): count every n-gram of the item, repeats included, "
                "so the fraction is of its n-grams"): _overlap(train, items, n, unique=True),
        Mistake("14.overlap_last_missing",
               "the item's last n-gram is missing: a list of L words has L - n + 1 n-grams, range(len(words) - n + 1)"):
            _overlap(train, items, n, drop_last=True),
        Mistake("14.overlap_substrings",
                "the n-grams were looked for as substrings of the joined training text, so 'he age of wisdom' is found "
                "inside 'the age of wisdom': compare tuples of whole words, a set of the training text's n-grams"):
            _overlap(train, items, n, substring=True),
        Mistake("14.overlap_any_found",
                "each item got 1 or 0, whether any n-gram is found: the fraction of its n-grams found is asked"):
            (_overlap(train, items, n) > 0).double(),
    }


def _cased_words(text: str) -> list[str]:
    """Words as `words` finds them, their capitals kept (a mistake)."""
    return re.findall(r"\w+", text)


@sized
def _overlap_hidden(r: random.Random, seed: int) -> Inputs:
    """A training text of random words; items that copy a run of it (changed in case and punctuation) and go on
    with words it never holds, one of them its run twice (repeated n-grams), one its run less the first letter (an
    n-gram found only inside the text's words, as 'he age' inside 'the age')."""
    vocab, fresh = ["it", "was", "the", "of", "times", "age", "best", "worst", "wisdom", "çà", "ünïcode"], \
        ["zeta", "quux", "mañana", "blorp"]
    train = [r.choice(vocab) for _ in range(60)]

    def copied(length: int, cut: int = 0) -> list[str]:  # its first word in capitals less `cut` letters, a comma
        start = r.randint(0, len(train) - length)         # after its second
        words = train[start : start + length]
        return [words[0][cut:].upper(), words[1] + ",", *words[2:]]

    n = r.randint(2, 4)
    items = [copied(r.randint(n + 1, 8)) + [r.choice(fresh) for _ in range(r.randint(1, 4))] for _ in range(3)]
    run = copied(n + 2)
    items.append(run + run + [r.choice(fresh) for _ in range(3)])
    items.append(copied(r.randint(n + 1, 8), cut=1))
    return _overlap_inputs([" ".join(item) for item in items], n, " ".join(train) + ". " + TRAIN)


PIECES = declare(
    Piece("14", "loglikelihood", None, _ll_call, expected=_ll_expected, judge=_ll_judge, forbidden=_LOGLIKELIHOOD,
          visible=[("visible", "loglikelihood of a 3-token continuation after 4 context tokens (a bigram model, V=11): "
                               "only the continuation's tokens, each read from the position before it; its first and "
                               "last tokens are the argmax, its middle one 200 logits below it (the greedy flag False)",
                    lambda seed: _ll_inputs(11, 4, "+!+", seed)),
                   ("greedy", "loglikelihood of the continuation that argmax decoding writes: the greedy flag True",
                    lambda seed: _ll_inputs(11, 3, "++++", seed))],
          hidden=[("hidden_one_token", "loglikelihood of a one-token continuation after one context token, the argmax "
                                       "with a probability under one half (the greedy flag True)",
                   lambda seed: _ll_inputs(9, 1, "*", seed)),
                  ("hidden_near_greedy", "loglikelihood of a continuation that is the argmax from its third token "
                   "on, its first two tokens near ties, 5e-4 below the argmax (the greedy flag False)",
                   lambda seed: _ll_inputs(13, 2, "~~+++", seed)),
                  ("hidden_sizes", "loglikelihood with other sizes, greedy or not", _ll_hidden)]),
    Piece("14", "choice_scores", None, _choice_call, expected=_choice_expected, mistakes=_choice_rows,
          by_hand=_scores_by_hand,
          label="the choice scores", shape="C", atol=FLOAT32_ROUNDING, rtol=FLOAT32_ROUNDING, forbidden=_CHOICES,
          visible=[("visible", "choice_scores normalised by characters (acc_norm), one choice a prefix of another, one "
                               "of two words with '½' (one character, two bytes)",
                    lambda seed: _choice_inputs(["7", "17", "170", "71", "7½ m"], "chars", seed)),
                   ("bytes", "choice_scores normalised by UTF-8 bytes (acc_bytes), choices with accents",
                    lambda seed: _choice_inputs(["café", "cafe", "naïve", "über"], "bytes", seed))],
          hidden=[("hidden_none", "choice_scores with normalize=None (acc: the sums unchanged)",
                   lambda seed: _choice_inputs(["a", "bb", "ccc"], None, seed)),
                  ("hidden_unicode", "choice_scores by UTF-8 bytes of Greek, Japanese and accented choices, a tie",
                   lambda seed: _choice_inputs(["Ελλάδα", "東京", "Zürich", "Lyon"], "bytes", seed, tie=True)),
                  ("hidden_sizes", "choice_scores by characters with other choices (Unicode, ties)",
                   _choice_hidden)]),
    Piece("14", "pass_at_k", pass_at_k, _pass_call, judge=_pass_judge, forbidden=_PASS,
          visible=[("visible", "pass_at_k for n=10 samples, c from 1 to 9, k from 1 to 5 (unbiased, not 1 - (1 - "
                               "c/n)^k), and for n=2000, k=250 (C(2000, 250) has 326 digits, past a float's range)",
                    lambda seed: {"table": [(10, 3, 1), (10, 3, 2), (10, 3, 5), (10, 1, 4), (10, 9, 2),
                                            (2000, 5, 250)]})],
          hidden=[("hidden_edges", "pass_at_k at the edges: c = 0, c = n, n = k, one sample",
                   lambda seed: {"table": [(5, 0, 3), (5, 5, 2), (7, 2, 7), (1, 1, 1), (1, 0, 1), (6, 1, 6)]}),
                  ("hidden_large", "pass_at_k for n up to 200 (binomials of up to 59 digits)",
                   lambda seed: {"table": [(200, 13, 100), (200, 1, 1), (200, 50, 10), (180, 3, 90)]}),
                  ("hidden_sizes", "pass_at_k for other n, c, k", lambda seed: _pass_table(seed, 40))]),
    Piece("14", "paired_bootstrap", None, _boot_call, expected=_boot_expected, judge=_boot_judge,
          forbidden=_BOOTSTRAP,
          visible=[("visible", "paired_bootstrap of two models on 60 shared items, 1000 resamples (the 97.5% quantile "
                               "between two distinct sorted differences)",
                    lambda seed: _boot_inputs(60, 0.7, 0.6, 1000, seed))],
          hidden=[("hidden_same", "paired_bootstrap of a model against itself (the interval is [0, 0])",
                   lambda seed: (lambda i: i | {"b": i["a"].clone()})(_boot_inputs(40, 0.6, 0.6, 300, seed))),
                  ("hidden_sizes", "paired_bootstrap with other sizes (the 97.5% quantile between two distinct sorted "
                                   "differences)", _boot_hidden)]),
    Piece("14", "ngram_overlap", ngram_overlap, _overlap_call, label="the overlap of each item",
          mistakes=_overlap_mistakes, atol=1e-9, rtol=0, forbidden=_OVERLAP,
          visible=[("visible", "ngram_overlap with n=4, a training text of two lines: an item copied with other "
                    "capitals and punctuation, one half copied, one clean, one whose first words are found only "
                    "inside others ('he' in 'the'), one copied across the line break ('foolishness.\\nThe model')",
                    lambda seed: _overlap_inputs(["IT WAS THE AGE OF WISDOM; it was the age of foolishness!",
                                                  "it was the worst of times, it was the worst of times, said "
                                                  "nobody at all",
                                                  "a sentence written for this lab alone",
                                                  "he age of wisdom was hers",
                                                  "Of foolishness, THE MODEL read this text"], 4))],
          hidden=[("hidden_short", "ngram_overlap with items shorter than n (no n-grams: 0.0)",
                   lambda seed: _overlap_inputs(["it was the", "best", "times times times times"], 4)),
                  ("hidden_sizes", "ngram_overlap with other texts, items and n (repeated words, Unicode, a word less "
                                   "its first letter)",
                   _overlap_hidden)]),
)
