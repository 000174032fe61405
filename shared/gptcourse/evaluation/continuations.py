"""How likely a model finds a continuation of a context: lm-evaluation-harness's `loglikelihood` request.

For a context c and a continuation x (token ids), the model reads c + x without its last token; the logits at the
last len(x) positions predict x, so log p(x | c) = sum_t log p(x_t | c, x_<t). The greedy flag says whether
argmax decoding from c would produce x exactly (the harness's `is_greedy`). Rows of different lengths are padded
on the right (lesson 10's `pad_batch`) and the model is given the attention mask.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import torch
from torch.nn import functional as F

from ..finetuning.padding import pad_batch


def loglikelihood(model: Callable[..., torch.Tensor], context_ids: Sequence[Sequence[int]],
                  continuation_ids: Sequence[Sequence[int]], context_length: int | None = None,
                  batch_size: int = 32) -> tuple[torch.Tensor, torch.Tensor]:
    """(log p(continuation | context) of each request (N,) float, greedy (N,) bool).

    A request longer than `context_length + 1` tokens (default: the model's config) loses its oldest context
    tokens, as the harness truncates; the continuation itself must fit."""
    if len(context_ids) != len(continuation_ids):
        raise ValueError(f"{len(context_ids)} contexts for {len(continuation_ids)} continuations: expected one each")
    limit = context_length or model.config.context_length
    inputs = []  # (the tokens the model reads, how many of the last ones predict the continuation)
    for i, (context, continuation) in enumerate(zip(context_ids, continuation_ids, strict=True)):
        if not context or not continuation:
            raise ValueError(f"request {i}: the context and the continuation each need at least one token (the "
                             "harness starts an empty context with an end-of-text token)")
        if len(continuation) > limit:
            raise ValueError(f"request {i}: a continuation of {len(continuation)} tokens does not fit the model's "
                             f"context of {limit}")
        whole = [*context, *continuation][-(limit + 1):]  # keep the newest limit + 1 tokens
        inputs.append((whole[:-1], continuation))
    logprobs, greedy = [], []
    for start in range(0, len(inputs), batch_size):
        chunk = inputs[start : start + batch_size]
        ids, mask = pad_batch([seq for seq, _ in chunk])  # (B, T) each
        with torch.no_grad():
            logits = model(ids, attention_mask=mask)  # (B, T, V)
        for row, (seq, continuation) in enumerate(chunk):
            n, m = len(seq), len(continuation)
            picked = F.log_softmax(logits[row, n - m : n].float(), dim=-1)  # (m, V): the rows that predict x
            target = torch.as_tensor(list(continuation), dtype=torch.long)  # (m,)
            logprobs.append(picked.gather(-1, target[:, None]).sum())
            greedy.append(bool(torch.equal(picked.argmax(dim=-1), target)))
    return torch.stack(logprobs), torch.tensor(greedy)
