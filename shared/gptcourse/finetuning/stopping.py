"""Greedy answers to a batch of prompts that stop at an end-of-text token, as an instruction-tuned model is used.

The prompts are padded on the left, so that every row's last token sits in the last column and each step appends
one column; positions count real tokens only (`GPT.forward_hidden`), so a row computes what it computes alone.
A row that has emitted `stop_id` gets pads (mask 0) from then on, and decoding ends when every row has stopped or
after `max_new_tokens`. Each step recomputes the whole sequence (a KV cache does not take a padding mask here), which
must fit in the context window.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from ..model.gpt import GPT
from .padding import pad_batch


def greedy_until_stop(model: GPT, prompts: Sequence[Sequence[int]], stop_id: int, max_new_tokens: int,
                      pad_id: int = 0) -> list[list[int]]:
    """Each prompt's greedy continuation, up to and including its first `stop_id`, or `max_new_tokens` tokens
    when it never emits one (so `answer[-1] == stop_id` says whether it stopped)."""
    if not 0 <= stop_id < model.config.vocab_size:
        raise ValueError(f"stop_id must be a token id in [0, {model.config.vocab_size}), got {stop_id}")
    if max_new_tokens < 1:
        raise ValueError(f"max_new_tokens must be at least 1, got {max_new_tokens}")
    ids, mask = pad_batch(prompts, pad_id=pad_id, side="left")  # (B, T) each
    if ids.size(1) + max_new_tokens > model.config.context_length:
        raise ValueError(f"the longest prompt ({ids.size(1)} tokens) + max_new_tokens ({max_new_tokens}) exceeds the "
                         f"context window of {model.config.context_length} tokens")
    answers: list[list[int]] = [[] for _ in prompts]
    running = torch.ones(len(prompts), dtype=torch.bool)  # (B,): rows that have not emitted stop_id yet
    was_training = model.training
    model.eval()
    try:
        with torch.inference_mode():
            for _ in range(max_new_tokens):
                logits = model(ids, attention_mask=mask)[:, -1]  # (B, V) at the last column
                next_id = logits.argmax(dim=-1).masked_fill(~running, pad_id)  # (B,)
                for row in running.nonzero().flatten().tolist():
                    answers[row].append(int(next_id[row]))
                ids = torch.cat([ids, next_id[:, None]], dim=1)
                mask = torch.cat([mask, running.long()[:, None]], dim=1)
                running &= next_id != stop_id
                if not running.any():
                    break
    finally:
        model.train(was_training)
    return answers
