"""Greedy answers to a batch of prompts that stop at an end-of-text token, as an instruction-tuned model is used.

Prompts of the same length run together as one batch, without padding, and with a KV cache: the first step feeds
the prompts, each later step only the token each row has just chosen, so a step costs one position per row instead
of the whole prefix. A row stops when it emits `stop_id`, when its prompt and answer fill the context window, or
after `max_new_tokens`; a stopped row is cut from its group's batch (and from the cache) at once.
`decode_until_stop` is that loop with the choice of each next token left to its caller (GRPO's sampling uses it).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import torch
from torch import nn

from ..model.gpt import GPT


def greedy_until_stop(model: GPT, prompts: Sequence[Sequence[int]], stop_id: int,
                      max_new_tokens: int) -> list[list[int]]:
    """Each prompt's greedy continuation, up to and including its first `stop_id`; one that never emits it ends
    after `max_new_tokens` tokens or when prompt + answer fill the context window (so `answer[-1] == stop_id`
    says whether it stopped by itself)."""
    limit = model.config.context_length
    if not 0 <= stop_id < model.config.vocab_size:
        raise ValueError(f"stop_id must be a token id in [0, {model.config.vocab_size}), got {stop_id}")
    if max_new_tokens < 1:
        raise ValueError(f"max_new_tokens must be at least 1, got {max_new_tokens}")
    longest = max((len(p) for p in prompts), default=0)
    if longest >= limit:
        raise ValueError(f"a prompt of {longest} tokens leaves no room to answer in the context window "
                         f"of {limit} tokens")
    return decode_until_stop(model, prompts, stop_id, max_new_tokens,
                             lambda logits, running: logits.argmax(dim=-1))  # (B,): each row's next token


def decode_until_stop(model: nn.Module, prompts: Sequence[Sequence[int]], stop_id: int, max_new_tokens: int,
                      choose: Callable[[torch.Tensor, list[int]], torch.Tensor]) -> list[list[int]]:
    """Each prompt's answer, one token a step by `choose(logits, rows)`: the next token (B,) of the batch's rows
    (their indices in `prompts`) from their last logits (B, V). Prompts of one length run as one batch with a KV
    cache, in eval mode and without a graph; a row ends after its first `stop_id`, after `max_new_tokens` or when
    prompt and answer fill the context window. The caller checks its arguments."""
    limit = model.config.context_length
    answers: list[list[int]] = [[] for _ in prompts]
    groups: dict[int, list[int]] = {}  # prompt length -> the rows with a prompt that long
    for row, prompt in enumerate(prompts):
        groups.setdefault(len(prompt), []).append(row)
    was_training = model.training
    model.eval()
    try:
        with torch.inference_mode():
            for length, running in groups.items():
                cache = model.new_cache()
                feed = torch.tensor([list(prompts[row]) for row in running], dtype=torch.long)  # (B, length)
                for _ in range(min(max_new_tokens, limit - length)):
                    next_ids = choose(model(feed, cache=cache)[:, -1], running)  # (B,)
                    for row, token in zip(running, next_ids.tolist(), strict=True):
                        answers[row].append(token)
                    keep = [i for i, row in enumerate(running) if answers[row][-1] != stop_id]
                    if not keep:
                        break
                    if len(keep) < len(running):
                        kept = torch.tensor(keep)
                        cache.keep_rows(kept)
                        next_ids, running = next_ids[kept], [running[i] for i in keep]
                    feed = next_ids[:, None]  # (B, 1): only the new token; the cache holds the rest
    finally:
        model.train(was_training)
    return answers
