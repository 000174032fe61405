"""Generative evaluation with a verifier: sample answers with lesson 11's `generate`, cut each at the stop text,
and count those that match the reference after normalisation (exact match: the verifier of a task whose answer
is a string, as the sums' are; code would be run against its tests instead).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch

from ..inference.sampling import generate


def normalize_answer(text: str) -> str:
    """An answer as exact match compares it: lowercased, whitespace collapsed, a final period dropped."""
    return " ".join(text.lower().split()).removesuffix(".")


def count_correct(model: torch.nn.Module, tokenizer: Any, prompts: Sequence[str], answers: Sequence[str], n: int,
                  temperature: float, max_new_tokens: int, stop: str = "\n", seed: int = 0) -> list[int]:
    """For each prompt, how many of n samples (temperature 0: greedy, so all n alike) are right: c of pass@k."""
    if len(prompts) != len(answers):
        raise ValueError(f"{len(prompts)} prompts for {len(answers)} answers: expected one each")
    generator = torch.Generator().manual_seed(seed)
    correct = []
    for prompt, answer in zip(prompts, answers, strict=True):
        ids = torch.tensor([tokenizer.encode(prompt)] * n)  # (n, P): the n samples of one prompt, one batch
        out = generate(model, ids, max_new_tokens, temperature=temperature, generator=generator)  # (n, P + new)
        texts = [tokenizer.decode(row[ids.size(1):].tolist()).split(stop)[0] for row in out]
        correct.append(sum(normalize_answer(t) == normalize_answer(answer) for t in texts))
    return correct
