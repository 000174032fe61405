"""Autoregressive sampling: greedy, temperature, top-k and top-p (nucleus), with or without a KV cache.

With the cache, each step feeds only the newest token and reuses the keys and values of earlier positions,
so a step costs O(T) instead of re-running the whole O(T^2) prefix. Both ways yield the same tokens.
"""

from __future__ import annotations

import torch

from .model import GPT


def filter_logits(logits: torch.Tensor, top_k: int | None = None, top_p: float | None = None) -> torch.Tensor:
    """Set to -inf every logit outside the top-k, and outside the smallest set whose probability >= top_p."""
    if top_k is not None:
        if top_k < 1:
            raise ValueError(f"top_k must be >= 1, got {top_k}")
        kth = torch.topk(logits, min(top_k, logits.size(-1)), dim=-1).values[..., -1:]  # (B, 1)
        logits = logits.masked_fill(logits < kth, float("-inf"))
    if top_p is not None:
        if not 0.0 < top_p <= 1.0:
            raise ValueError(f"top_p must be in (0, 1], got {top_p}")
        sorted_logits, order = logits.sort(dim=-1, descending=True)
        cumulative = sorted_logits.softmax(dim=-1).cumsum(dim=-1)
        outside = cumulative - sorted_logits.softmax(dim=-1) >= top_p  # mass before this token already >= p
        sorted_logits = sorted_logits.masked_fill(outside, float("-inf"))
        logits = torch.empty_like(logits).scatter_(-1, order, sorted_logits)
    return logits


def generate(
    model: GPT,
    idx: torch.Tensor,
    max_new_tokens: int,
    temperature: float = 1.0,
    top_k: int | None = None,
    top_p: float | None = None,
    use_cache: bool = True,
    generator: torch.Generator | None = None,
) -> torch.Tensor:
    """Extend idx (B, T) by max_new_tokens sampled tokens; temperature 0 means greedy (argmax)."""
    if temperature < 0:
        raise ValueError(f"temperature must be >= 0 (0 = greedy), got {temperature}")
    limit = model.config.context_length
    cache = model.new_cache() if use_cache else None
    was_training = model.training
    model.eval()
    try:
        with torch.inference_mode():  # like no_grad, and also skips autograd's version tracking: less work per op
            for _ in range(max_new_tokens):
                if cache is not None and idx.size(1) <= limit:
                    logits = model(idx[:, cache.length :], cache=cache)[:, -1]  # (B, V)
                else:  # no cache, or the window is full: recompute on the last `limit` tokens
                    logits = model(idx[:, -limit:])[:, -1]
                if temperature == 0:
                    next_id = logits.argmax(dim=-1, keepdim=True)  # (B, 1)
                else:
                    probs = filter_logits(logits / temperature, top_k, top_p).softmax(dim=-1)
                    next_id = torch.multinomial(probs, 1, generator=generator)  # (B, 1)
                idx = torch.cat([idx, next_id], dim=1)
    finally:
        model.train(was_training)
    return idx.clone()  # an ordinary tensor again: an inference-mode one could not feed a training step
