"""Closed-form parameter counts, from the config alone (no model is built).

Per block: attention 2C^2 + 2 C H_kv D (q and out are C x C, k and v C x H_kv D; 4C^2 when H_kv = H) plus as
many biases; MLP 2 C F (+F + C) or, for SwiGLU, 3 C F (+2F + C); two norms of C
(LayerNorm with bias: 2C each). Plus V C for the token table, T_max C for learned positions, the final norm,
and V C more for an untied output projection (+V for its bias). Tied weights are counted once.

A mixture of experts (lesson 16) replaces the MLP with a router (C x E) and E SwiGLU experts of 3 C F_e each (no
biases), plus a shared expert of 3 C F_s; a token runs through k of the E, so its *active* parameters count k
experts where the total counts E. Latent attention (DeepSeek) is counted from its low-rank projections.
"""

from __future__ import annotations

from .config import GPTConfig


def _norm(config: GPTConfig) -> int:
    c = config.d_model
    return 2 * c if config.norm == "layernorm" and config.norm_bias else c


def _attention(config: GPTConfig) -> int:
    c, h = config.d_model, config.n_heads
    mla = config.latent_attention
    if mla is not None:  # q: C -> q_rank (norm) -> H (nope + rope); kv: C -> kv_rank + rope (norm) -> H (nope + v)
        query = c * mla.q_rank + mla.q_rank + mla.q_rank * h * (mla.nope_dim + mla.rope_dim)
        key_value = c * (mla.kv_rank + mla.rope_dim) + mla.kv_rank + mla.kv_rank * h * (mla.nope_dim + mla.v_dim)
        return query + key_value + h * mla.v_dim * c  # + the output projection
    kv = config.kv_heads * config.d_head  # width of k (and of v): H_kv D, C when every query head has its own
    return 2 * c * c + 2 * c * kv + (2 * c + 2 * kv if config.attn_bias else 0)


def _mlp(config: GPTConfig, sparse: bool, active: bool) -> int:
    c, f, moe = config.d_model, config.hidden_width, config.moe
    if sparse and moe is not None:
        experts = moe.top_k if active else moe.n_experts  # a token runs through top_k of the n_experts
        return c * moe.n_experts + experts * 3 * c * (moe.d_ff or f) + 3 * c * moe.shared_d_ff  # + router, shared
    if config.mlp == "swiglu":
        return 3 * c * f + (2 * f + c if config.mlp_bias else 0)  # fused gate+value C x 2F, output F x C
    return 2 * c * f + (f + c if config.mlp_bias else 0)


def block_breakdown(config: GPTConfig, sparse: bool | None = None, active: bool = False) -> dict[str, int]:
    """Parameters of one decoder block, by sub-component: a mixture-of-experts block when `sparse` (default: when
    the config has one), counting only the experts a token uses when `active`."""
    sparse = config.moe is not None if sparse is None else sparse
    return {"attention": _attention(config), "mlp": _mlp(config, sparse, active), "norms": 2 * _norm(config)}


def parameter_breakdown(config: GPTConfig, active: bool = False) -> dict[str, int]:
    """Parameters of the whole model, by component; the values add up to `count_parameters`. With `active`, the
    parameters one token runs through: a mixture of experts' top_k experts of its n_experts."""
    c, v, n = config.d_model, config.vocab_size, config.n_layers
    dense = n if config.moe is None else config.moe.dense_layers  # the first blocks keep a dense MLP
    block = block_breakdown(config, sparse=False)
    return {
        "token_embedding": v * c,
        "position_embedding": config.context_length * c if config.position == "learned" else 0,
        "attention": n * block["attention"],
        "mlp": dense * block["mlp"] + (n - dense) * _mlp(config, True, active),
        "block_norms": n * block["norms"],
        "final_norm": _norm(config),
        "output_projection": (0 if config.tie_weights else v * c) + (v if config.lm_head_bias else 0),
    }


def count_parameters(config: GPTConfig, active: bool = False) -> int:
    """Total trainable parameters of `GPT(config)`, tied weights counted once; with `active`, those one token
    runs through (the same unless the config has a mixture of experts)."""
    return sum(parameter_breakdown(config, active).values())
