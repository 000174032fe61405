"""Greedy answers to a batch of prompts that stop at an end-of-text token, as an instruction-tuned model is used.

Each step runs the rows still running as one batch, padded on the left, so that every row's last token sits in the
last column; positions count real tokens only (`GPT.forward_hidden`), so a row computes what it computes alone.
A row stops when it emits `stop_id`, when its prompt and answer fill the context window, or after
`max_new_tokens`; a stopped row leaves the batch, so one answer that runs on costs one row, not the whole batch.
Each step recomputes every running row (a KV cache does not take a padding mask here).
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from ..model.gpt import GPT
from .padding import pad_batch


def greedy_until_stop(model: GPT, prompts: Sequence[Sequence[int]], stop_id: int, max_new_tokens: int,
                      pad_id: int = 0) -> list[list[int]]:
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
    sequences = [list(p) for p in prompts]  # each row's prompt and answer so far
    answers: list[list[int]] = [[] for _ in prompts]
    running = list(range(len(prompts)))  # rows that have not stopped yet
    was_training = model.training
    model.eval()
    try:
        with torch.inference_mode():
            for _ in range(max_new_tokens):
                if not running:
                    break
                ids, mask = pad_batch([sequences[row] for row in running], pad_id=pad_id, side="left")  # (B, T)
                next_ids = model(ids, attention_mask=mask)[:, -1].argmax(dim=-1)  # (B,): each row's next token
                for row, token in zip(running, next_ids.tolist(), strict=True):
                    sequences[row].append(token)
                    answers[row].append(token)
                running = [row for row in running if answers[row][-1] != stop_id and len(sequences[row]) < limit]
    finally:
        model.train(was_training)
    return answers
