"""How sure an accuracy is: its standard error, a percentile bootstrap interval, and a paired bootstrap of the
difference between two models scored on the same items.

Items are the unit of sampling: an evaluation set is one draw of items from all the items that could have been
written, so each resample draws N of them with replacement. Pairing keeps an item's two scores together. When the
two models find the same items hard (their scores are positively correlated: they agree on more items than
independent models would, p_a p_b + (1 - p_a)(1 - p_b)), that shared difficulty cancels in the difference, and its
interval is narrower than two independent intervals suggest; for uncorrelated models it is about as wide.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch


def _values(values: torch.Tensor | list[float], what: str = "values") -> torch.Tensor:
    values = torch.as_tensor(values, dtype=torch.float64)
    if values.dim() != 1 or values.numel() < 2:
        raise ValueError(f"{what} must be one score per item, at least 2 of them, got shape {tuple(values.shape)}")
    return values


def standard_error(values: torch.Tensor | list[float]) -> float:
    """The standard error of the mean of per-item scores: their sample standard deviation (n - 1) / sqrt(n), as
    the harness reports it (`mean_stderr`)."""
    values = _values(values)
    return float(values.std(correction=1)) / math.sqrt(values.numel())


def _resampled_means(values: torch.Tensor, resamples: int, seed: int) -> torch.Tensor:
    """The mean of each of `resamples` draws of N items with replacement (resamples,); values may be (N,) or
    (N, M), whose columns share the draws."""
    rows = torch.randint(values.size(0), (resamples, values.size(0)), generator=torch.Generator().manual_seed(seed))
    return values[rows].mean(dim=1)  # (resamples,) or (resamples, M)


def _interval(draws: torch.Tensor, confidence: float) -> tuple[float, float]:
    if not 0 < confidence < 1:
        raise ValueError(f"confidence must be between 0 and 1, got {confidence}")
    tail = (1 - confidence) / 2
    low, high = torch.quantile(draws, torch.tensor([tail, 1 - tail], dtype=draws.dtype))
    return float(low), float(high)


def bootstrap_interval(values: torch.Tensor | list[float], confidence: float = 0.95, resamples: int = 1000,
                       seed: int = 0) -> tuple[float, float]:
    """A percentile bootstrap interval on the mean of per-item scores: the middle `confidence` of the means of
    `resamples` draws of N items with replacement (seeded, so a report reproduces)."""
    return _interval(_resampled_means(_values(values), resamples, seed), confidence)


@dataclass(frozen=True)
class PairedComparison:
    """mean(a) - mean(b) and a bootstrap interval on it; `significant` when the interval leaves out 0."""

    difference: float
    low: float
    high: float

    @property
    def significant(self) -> bool:
        return not self.low <= 0.0 <= self.high


def paired_bootstrap(a: torch.Tensor | list[float], b: torch.Tensor | list[float], confidence: float = 0.95,
                     resamples: int = 1000, seed: int = 0) -> PairedComparison:
    """Model a against model b on the same N items: each resample draws N item indices with replacement and
    takes both models' scores on those items, so the difference is of paired scores."""
    a, b = _values(a, "a"), _values(b, "b")
    if a.shape != b.shape:
        raise ValueError(f"a and b must score the same items, got {a.numel()} and {b.numel()} scores")
    draws = _resampled_means(a - b, resamples, seed)  # the mean of a - b over a draw is mean(a) - mean(b) on it
    return PairedComparison(float((a - b).mean()), *_interval(draws, confidence))
