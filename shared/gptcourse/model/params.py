"""Closed-form parameter counts, from the config alone (no model is built).

Per block: attention 2C^2 + 2 C H_kv D (q and out are C x C, k and v C x H_kv D; 4C^2 when H_kv = H) plus as
many biases; MLP 2 C F (+F + C) or, for SwiGLU, 3 C F (+2F + C); two norms of C
(LayerNorm with bias: 2C each). Plus V C for the token table, T_max C for learned positions, the final norm,
and V C more for an untied output projection (+V for its bias). Tied weights are counted once.
"""

from __future__ import annotations

from .config import GPTConfig


def _norm(config: GPTConfig) -> int:
    c = config.d_model
    return 2 * c if config.norm == "layernorm" and config.norm_bias else c


def block_breakdown(config: GPTConfig) -> dict[str, int]:
    """Parameters of one decoder block, by sub-component."""
    c, f = config.d_model, config.hidden_width
    kv = config.kv_heads * config.d_head  # width of k (and of v): H_kv D, C when every query head has its own
    attention = 2 * c * c + 2 * c * kv + (2 * c + 2 * kv if config.attn_bias else 0)
    if config.mlp == "swiglu":
        mlp = 3 * c * f + (2 * f + c if config.mlp_bias else 0)  # fused gate+value C x 2F, output F x C
    else:
        mlp = 2 * c * f + (f + c if config.mlp_bias else 0)
    return {"attention": attention, "mlp": mlp, "norms": 2 * _norm(config)}


def parameter_breakdown(config: GPTConfig) -> dict[str, int]:
    """Parameters of the whole model, by component; the values add up to `count_parameters`."""
    c, v, n = config.d_model, config.vocab_size, config.n_layers
    block = block_breakdown(config)
    return {
        "token_embedding": v * c,
        "position_embedding": config.context_length * c if config.position == "learned" else 0,
        "attention": n * block["attention"],
        "mlp": n * block["mlp"],
        "block_norms": n * block["norms"],
        "final_norm": _norm(config),
        "output_projection": (0 if config.tie_weights else v * c) + (v if config.lm_head_bias else 0),
    }


def count_parameters(config: GPTConfig) -> int:
    """Total trainable parameters of `GPT(config)`, tied weights counted once."""
    return sum(parameter_breakdown(config).values())
