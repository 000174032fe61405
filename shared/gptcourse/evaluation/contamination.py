"""Contamination: which evaluation items also occur in the training text. GPT-3's rule (Brown et al. 2020, its
appendix C) flags an item when any of its N-grams, runs of N words, occurs in the training data (N from 2 to 13 by
benchmark there, 8 to 13 on natural-language ones; 13 in later reports). Words are compared lowercased and split at
punctuation (GPT-3 deleted it instead, so "3+4=" was one word for it), so a reformatted copy is still found.

The training text's n-grams go into a Python set once; each item then costs a lookup per n-gram.
"""

from __future__ import annotations

import re
from collections.abc import Sequence

_WORD = re.compile(r"\w+")


def words(text: str) -> list[str]:
    """The words of `text` as the overlap compares them: lowercased runs of letters, digits and underscores."""
    return _WORD.findall(text.lower())


def _ngrams(tokens: list[str], n: int) -> list[tuple[str, ...]]:
    return [tuple(tokens[i : i + n]) for i in range(len(tokens) - n + 1)]


def ngram_overlap(train_text: str, eval_items: Sequence[str], n: int = 13) -> list[float]:
    """For each item, the fraction of its n-grams that occur in `train_text` (0.0 for a clean item, and for an
    item shorter than n words, which has none); an item is contaminated under GPT-3's rule when it is above 0."""
    if n < 1:
        raise ValueError(f"n must be at least 1, got {n}")
    seen = set(_ngrams(words(train_text), n))
    overlap = []
    for item in eval_items:
        grams = _ngrams(words(item), n)
        overlap.append(sum(g in seen for g in grams) / len(grams) if grams else 0.0)
    return overlap

