"""The GPT model: token embedding (+ positions) -> N decoder blocks -> final norm -> output projection.

    idx (B, T) -> tok_emb (B, T, C) [+ pos_emb (T, C)] -> blocks (B, T, C) -> final_norm -> lm_head (B, T, V)

`forward_hidden` stops before the output projection, so reward and value heads (see `heads.py`) can reuse the
same backbone. With `tie_weights` the output projection is the embedding table itself (logits = h E^T).

A batch of sequences of different lengths is padded to one length T and passed with `attention_mask` (B, T), 1 for
real tokens and 0 for pads, on either side: no real token attends to a pad, and positions count real tokens only,
so each real token's output is the one it has when its sequence runs alone.
"""

from __future__ import annotations

import math

import torch
from torch import nn

from .block import DecoderBlock
from .causal_attention import padding_mask
from .config import GPTConfig
from .kv_cache import KVCache
from .norms import make_norm
from .positions import LearnedPositions, RotaryEmbedding


class GPT(nn.Module):
    def __init__(self, config: GPTConfig) -> None:
        super().__init__()
        if not isinstance(config, GPTConfig):
            raise TypeError(f"GPT expects a GPTConfig, got {type(config).__name__}")
        c = self.config = config
        if c.latent_attention is not None:
            raise ValueError("GPT does not build latent attention (GPTConfig.latent_attention): such a config is "
                             "for count_parameters only")
        self.tok_emb = nn.Embedding(c.vocab_size, c.d_model)
        self.pos_emb = LearnedPositions(c.context_length, c.d_model) if c.position == "learned" else None
        self.rope = (
            RotaryEmbedding(c.d_head, c.context_length, c.rope_theta) if c.position == "rope" else None
        )
        dense = c.n_layers if c.moe is None else c.moe.dense_layers  # the first blocks keep a dense MLP
        self.blocks = nn.ModuleList(DecoderBlock(c, sparse=i >= dense) for i in range(c.n_layers))
        self.final_norm = make_norm(c.norm, c.d_model, c.norm_eps, c.norm_bias)
        self.lm_head = nn.Linear(c.d_model, c.vocab_size, bias=c.lm_head_bias)
        if c.tie_weights:
            self.lm_head.weight = self.tok_emb.weight  # one (V, C) matrix, counted once
        self.reset_parameters()

    def reset_parameters(self) -> None:
        """GPT-2's initialisation: N(0, 0.02), and residual output projections scaled by 1/sqrt(2N)."""
        residual_std = 0.02 / math.sqrt(2 * self.config.n_layers)
        for name, p in self.named_parameters():
            if name.endswith("bias"):
                nn.init.zeros_(p)
            elif p.dim() == 1:  # norm gains
                nn.init.ones_(p)
            elif name.endswith(("attn.out.weight", "mlp.fc_out.weight", "w_out.weight")):  # experts' too
                nn.init.normal_(p, std=residual_std)
            else:
                nn.init.normal_(p, std=0.02)

    def _check_idx(self, idx: torch.Tensor, past: int) -> None:
        c = self.config
        if not isinstance(idx, torch.Tensor):
            raise TypeError(f"token ids must be a torch.Tensor of shape (B, T), got {type(idx).__name__}")
        if idx.is_floating_point() or idx.is_complex() or idx.dtype == torch.bool:
            raise TypeError(f"token ids must be an integer tensor (torch.long), got dtype {idx.dtype}")
        if idx.dim() != 2:
            raise ValueError(f"token ids must have shape (B, T), got {tuple(idx.shape)}")
        if past + idx.size(1) > c.context_length:
            raise ValueError(
                f"sequence length {past + idx.size(1)} exceeds context_length={c.context_length}"
                + (f" ({past} cached + {idx.size(1)} new)" if past else "")
            )
        # Reading the ids' values stops torch.compile's graph (a break at every step), so a compiled model leaves
        # the range check to the embedding's own error.
        if idx.numel() and idx.device.type != "meta" and not torch.compiler.is_compiling():
            lo, hi = (int(v) for v in torch.aminmax(idx))  # one pass over the ids, not two
            if lo < 0 or hi >= c.vocab_size:
                bad = lo if lo < 0 else hi
                raise ValueError(f"token id {bad} is out of range: expected 0 <= id < vocab_size={c.vocab_size}")

    @staticmethod
    def _check_attention_mask(attention_mask: torch.Tensor, idx: torch.Tensor, cache: KVCache | None) -> None:
        if cache is not None:
            raise ValueError("attention_mask and a KV cache together are not supported: pad and mask a batch for "
                             "training or scoring, generate each sequence with the cache")
        if not isinstance(attention_mask, torch.Tensor) or attention_mask.shape != idx.shape:
            shape = tuple(attention_mask.shape) if isinstance(attention_mask, torch.Tensor) else attention_mask
            raise ValueError(f"attention_mask must have the shape of the token ids {tuple(idx.shape)} (1 for real "
                             f"tokens, 0 for pads), got {shape}")
        if attention_mask.numel() and not bool(((attention_mask == 0) | (attention_mask == 1)).all()):
            raise ValueError("attention_mask must hold only 1 (real token) and 0 (pad)")

    def forward_hidden(
        self, idx: torch.Tensor, cache: KVCache | None = None, attention_mask: torch.Tensor | None = None
    ) -> torch.Tensor:
        """Token ids (B, T) -> final hidden states (B, T, C), after the final norm. Pads (0 in
        `attention_mask`) are never attended to; their own hidden states are meaningless."""
        past = cache.length if cache is not None else 0
        self._check_idx(idx, past)
        mask = None
        if attention_mask is None:
            positions = torch.arange(past, past + idx.size(1), device=idx.device)  # (T,)
        else:
            self._check_attention_mask(attention_mask, idx, cache)
            positions = (attention_mask.long().cumsum(-1) - 1).clamp(min=0)  # (B, T): real tokens count from 0
            mask = padding_mask(attention_mask)  # (B, 1, T, T)
        x = self.tok_emb(idx)  # (B, T, C)
        if self.pos_emb is not None:
            x = x + self.pos_emb(positions)  # (B, T, C) + (T, C) or (B, T, C)
        rope = None
        if self.rope is not None:
            cos, sin = self.rope(positions)  # each (T, D) or (B, T, D)
            rope = (cos, sin) if positions.dim() == 1 else (cos[:, None], sin[:, None])  # (B, 1, T, D) over heads
        for i, block in enumerate(self.blocks):
            x = block(x, rope=rope, cache=cache.layers[i] if cache is not None else None, mask=mask)
        return self.final_norm(x)  # (B, T, C)

    def forward(
        self, idx: torch.Tensor, cache: KVCache | None = None, attention_mask: torch.Tensor | None = None
    ) -> torch.Tensor:
        """Token ids (B, T) -> next-token logits (B, T, V); `attention_mask` (B, T) for padded batches."""
        return self.lm_head(self.forward_hidden(idx, cache, attention_mask))

    def router_logits(self) -> list[torch.Tensor]:
        """Each mixture-of-experts block's router logits (B T, E) from the last forward, for
        `load_balancing_loss`."""
        return [block.router_logits for block in self.blocks if block.router_logits is not None]

    def new_cache(self) -> KVCache:
        return KVCache.empty(self.config.n_layers, self.config.context_length)

    @classmethod
    def from_hf(cls, hf_model: nn.Module) -> GPT:
        """Build a GPT from a Hugging Face GPT2LMHeadModel, LlamaForCausalLM or MistralForCausalLM (see
        `gptcourse.model.hf`)."""
        from .hf import from_hf  # here, not at the top: hf.py imports this module (and transformers, slow to load)

        return from_hf(hf_model)

    def to_hf(self, family: str | None = None) -> nn.Module:
        """The equivalent Hugging Face model with the same weights; `family="mistral"` for a MistralForCausalLM
        (see `gptcourse.model.hf`)."""
        from .hf import to_hf  # lazy, as in from_hf

        return to_hf(self, family)
