"""Autoregressive sampling: greedy, temperature, top-k and top-p (nucleus), with or without a KV cache.

With the cache, each step feeds only the newest token and reuses the keys and values of earlier positions,
so a step costs O(T) instead of re-running the whole O(T^2) prefix. Both ways yield the same tokens.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager, nullcontext

import torch
from torch import nn

from ..model.gpt import GPT


def filter_logits(logits: torch.Tensor, top_k: int | None = None, top_p: float | None = None) -> torch.Tensor:
    """Set to -inf every logit outside the top-k, then outside the nucleus: the smallest set of the most likely
    tokens whose probability reaches top_p. Both as Hugging Face's TopKLogitsWarper and TopPLogitsWarper, in
    their order (temperature is applied by the caller before)."""
    if top_k is not None:
        if top_k < 1:
            raise ValueError(f"top_k must be >= 1, got {top_k}")
        kth = torch.topk(logits, min(top_k, logits.size(-1)), dim=-1).values[..., -1:]  # (B, 1)
        logits = logits.masked_fill(logits < kth, float("-inf"))
    if top_p is not None:
        if not 0.0 < top_p <= 1.0:
            raise ValueError(f"top_p must be in (0, 1], got {top_p}")
        ascending, order = logits.sort(dim=-1)  # (B, V): least likely first
        mass_up_to = ascending.softmax(dim=-1).cumsum(dim=-1)  # mass of this token and all less likely ones
        drop = mass_up_to <= 1 - top_p  # the tail that the nucleus (mass >= top_p) can do without
        drop[..., -1] = False  # the most likely token always stays
        logits = logits.masked_fill(drop.scatter(-1, order, drop), float("-inf"))
    return logits


@contextmanager
def decode_layout(model: nn.Module) -> Iterator[None]:
    """Store each widening linear layer's weight column-major for the duration, then restore it.

    A cached step feeds one token, so every linear layer is a matrix-vector product that streams its whole
    weight once. How fast that goes depends on the memory order: on the course's CPU, MKL's fp32 kernel reads an
    (out, in) row-major weight with 384-float rows at ~9 GB/s and the same matrix stored column-major (rows of
    `out` floats) at ~16 GB/s; for the narrowing MLP output (1536 -> 384) the row-major order is already the
    faster one. Only strides change: shapes, values and the state_dict stay the same, and outputs agree to float
    rounding. On the benchmark's model the relayout costs ~10 ms, about what eight cached tokens save.
    """
    saved: dict[int, tuple[nn.Parameter, torch.Tensor]] = {}
    for m in model.modules():
        if isinstance(m, nn.Linear) and m.out_features >= m.in_features and m.weight.device.type == "cpu":
            saved.setdefault(id(m.weight), (m.weight, m.weight.data))  # a tied weight is relaid once
    with torch.no_grad():
        for w, data in saved.values():
            w.data = data.t().contiguous().t()  # same (out, in) shape, strides (1, out)
    try:
        yield
    finally:
        for w, data in saved.values():
            w.data = data


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
        # inference_mode is no_grad that also skips autograd's version tracking: less work per op
        with decode_layout(model) if use_cache else nullcontext(), torch.inference_mode():
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
