"""Multiple choice scored as lm-evaluation-harness scores it: each choice is a continuation of the question, ranked
by its log-likelihood, summed (`acc`) or divided by the choice's length (`acc_norm`: characters; `acc_bytes`:
UTF-8 bytes), or by its token count.

A sum favours short choices: every token adds a log-probability below zero, so a choice of 3 tokens starts 2
terms behind one of 1. A few-shot prompt puts k solved items before the question, each as "question answer",
joined by a fixed separator.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import torch

from .continuations import loglikelihood

NORMALIZATIONS = (None, "tokens", "chars", "bytes")


@dataclass(frozen=True)
class MultipleChoiceItem:
    """A question, its choices and the index of the right one."""

    question: str
    choices: tuple[str, ...]
    answer: int

    def __post_init__(self) -> None:
        if not 0 <= self.answer < len(self.choices):
            raise ValueError(f"answer {self.answer} is not the index of one of the {len(self.choices)} choices")


def encode_pair(tokenizer: Any, context: str, continuation: str) -> tuple[list[int], list[int]]:
    """The harness's split of a request into tokens: spaces that end the context move to the continuation, the
    whole text is encoded once, and the continuation is what follows the context's tokens (with a BPE tokenizer,
    " Paris" is one token; encoded apart, " " and "Paris" would be two)."""
    spaces = len(context) - len(context.rstrip())
    if spaces:
        context, continuation = context[:-spaces], context[-spaces:] + continuation
    context_ids = tokenizer.encode(context)
    return context_ids, tokenizer.encode(context + continuation)[len(context_ids):]


def _normalized(logprobs: torch.Tensor, continuations: Sequence[Sequence[int]], choices: Sequence[str],
                normalize: str | None) -> torch.Tensor:
    """Each choice's log-likelihood divided by its length as `normalize` counts it (None: unchanged)."""
    if normalize is None:
        return logprobs
    lengths = {"tokens": [len(x) for x in continuations], "chars": [len(c) for c in choices],
               "bytes": [len(c.encode("utf-8")) for c in choices]}[normalize]
    return logprobs / torch.tensor(lengths, dtype=logprobs.dtype)


def _check_normalize(normalize: str | None) -> None:
    if normalize not in NORMALIZATIONS:
        raise ValueError(f"normalize must be one of {NORMALIZATIONS}, got {normalize!r}")


def score_choices(model: Callable[..., torch.Tensor], tokenizer: Any, context: str, choices: Sequence[str],
                  normalize: str | None = None, delimiter: str = " ") -> torch.Tensor:
    """The score of each choice (C,): log p(delimiter + choice | context), divided by the choice's length when
    `normalize` is "tokens", "chars" (the harness's acc_norm) or "bytes" (its acc_bytes). The length is the
    choice's own, without the delimiter, as the harness counts it."""
    _check_normalize(normalize)
    pairs = [encode_pair(tokenizer, context, delimiter + choice) for choice in choices]
    logprobs, _ = loglikelihood(model, [c for c, _ in pairs], [x for _, x in pairs])  # (C,)
    return _normalized(logprobs, [x for _, x in pairs], choices, normalize)


def few_shot_context(item: MultipleChoiceItem, shots: Sequence[MultipleChoiceItem] = (), separator: str = "\n\n",
                     delimiter: str = " ") -> str:
    """The prompt for `item`: each solved shot as "question{delimiter}answer", then the question, joined by
    `separator` (the harness's fewshot_delimiter and target_delimiter)."""
    solved = [shot.question + delimiter + shot.choices[shot.answer] for shot in shots]
    return separator.join([*solved, item.question])


def multiple_choice_accuracy(model: Callable[..., torch.Tensor], tokenizer: Any,
                             items: Sequence[MultipleChoiceItem], normalize: str | None = None,
                             shots: Sequence[MultipleChoiceItem] = (), separator: str = "\n\n",
                             delimiter: str = " ") -> torch.Tensor:
    """1.0 where the best-scored choice is the answer, else 0.0, per item (N,): its mean is the accuracy, and the
    per-item values are what error bars and paired comparisons need. Ties go to the first choice (argmax). Every
    item's choices are scored in one batched `loglikelihood` call, as `score_choices` scores one item's."""
    _check_normalize(normalize)
    pairs = [encode_pair(tokenizer, few_shot_context(item, shots, separator, delimiter), delimiter + choice)
             for item in items for choice in item.choices]
    logprobs, _ = loglikelihood(model, [c for c, _ in pairs], [x for _, x in pairs], batch_size=512)  # (sum of C,)
    correct, start = [], 0
    for item in items:
        end = start + len(item.choices)
        scores = _normalized(logprobs[start:end], [x for _, x in pairs[start:end]], item.choices, normalize)
        correct.append(float(int(scores.argmax()) == item.answer))
        start = end
    return torch.tensor(correct, dtype=torch.float64)
