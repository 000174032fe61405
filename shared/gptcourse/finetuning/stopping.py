"""Greedy answers to a batch of prompts that stop at an end-of-text token, as an instruction-tuned model is used.

The prompts are padded on the left, so that every row's last token sits in the last column and each step appends
one column; positions count real tokens only (`GPT.forward_hidden`), so a row computes what it computes alone.
A row stops when it emits `stop_id`, when its prompt and answer fill the context window, or after
`max_new_tokens`; a stopped row gets pads (mask 0) from then on, and decoding ends when every row has stopped.
Each step recomputes the last context-window of columns (a KV cache does not take a padding mask here): a running
row's real tokens are always among them, since they are right-aligned and fit in the window.
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
    lengths = torch.tensor([len(p) for p in prompts])  # (B,): each row's real tokens
    if lengths.numel() and int(lengths.max()) >= limit:
        raise ValueError(f"a prompt of {int(lengths.max())} tokens leaves no room to answer in the context window "
                         f"of {limit} tokens")
    ids, mask = pad_batch(prompts, pad_id=pad_id, side="left")  # (B, T) each
    answers: list[list[int]] = [[] for _ in prompts]
    running = torch.ones(len(prompts), dtype=torch.bool)  # (B,): rows that have not stopped yet
    was_training = model.training
    model.eval()
    try:
        with torch.inference_mode():
            for _ in range(max_new_tokens):
                logits = model(ids[:, -limit:], attention_mask=mask[:, -limit:])[:, -1]  # (B, V): each row's last
                next_id = logits.argmax(dim=-1).masked_fill(~running, pad_id)  # (B,)
                for row in running.nonzero().flatten().tolist():
                    answers[row].append(int(next_id[row]))
                ids = torch.cat([ids, next_id[:, None]], dim=1)
                mask = torch.cat([mask, running.long()[:, None]], dim=1)
                lengths += running.long()
                running &= (next_id != stop_id) & (lengths < limit)
                if not running.any():
                    break
    finally:
        model.train(was_training)
    return answers
