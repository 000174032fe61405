"""The pre-norm decoder block: x + attn(norm(x)), then + mlp(norm(x))."""

from __future__ import annotations

import torch
from torch import nn

from .causal_attention import MultiHeadAttention
from .config import GPTConfig
from .kv_cache import LayerCache
from .mixture_of_experts import MoE
from .mlp import make_mlp
from .norms import make_norm
from .positions import Rope


class DecoderBlock(nn.Module):
    """Attention moves information between positions; the MLP transforms each position on its own.

    Both sit on a residual path, so each learns an update to x rather than a replacement, and each reads a
    normalised copy of x (pre-norm), which keeps deep stacks trainable.
    """

    def __init__(self, config: GPTConfig, sparse: bool = False) -> None:
        super().__init__()
        c = config
        self.norm1 = make_norm(c.norm, c.d_model, c.norm_eps, c.norm_bias)
        self.attn = MultiHeadAttention(c.d_model, c.n_heads, bias=c.attn_bias, n_kv_heads=c.kv_heads)
        self.norm2 = make_norm(c.norm, c.d_model, c.norm_eps, c.norm_bias)
        if sparse:  # a mixture of experts (c.moe) in place of the MLP; its router logits kept for the aux loss
            m = c.moe
            self.mlp = MoE(c.d_model, m.d_ff or c.hidden_width, m.n_experts, m.top_k, shared_d_ff=m.shared_d_ff,
                           capacity_factor=m.capacity_factor)
        else:
            self.mlp = make_mlp(c.mlp, c.d_model, c.hidden_width, c.mlp_bias)
        self.router_logits: torch.Tensor | None = None  # (B T, E) of the last forward, with a mixture of experts

    def forward(self, x: torch.Tensor, rope: Rope | None = None, cache: LayerCache | None = None,
                mask: torch.Tensor | None = None) -> torch.Tensor:
        x = x + self.attn(self.norm1(x), rope=rope, cache=cache, mask=mask)  # (B, T, C)
        if isinstance(self.mlp, MoE):
            update, self.router_logits = self.mlp(self.norm2(x))  # (B, T, C), (B T, E)
            return x + update
        return x + self.mlp(self.norm2(x))  # (B, T, C)
