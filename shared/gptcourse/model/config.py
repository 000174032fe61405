"""`GPTConfig`: one frozen dataclass that describes every model variant in the course.

The symbols follow the seed documents: V (vocab_size), T (context_length, the longest sequence),
C or d (d_model), H (n_heads), D (d_head = C / H), N (n_layers); H_kv (kv_heads) for grouped-query attention.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Literal

Position = Literal["learned", "rope", "none"]
Norm = Literal["layernorm", "rmsnorm"]
MLPKind = Literal["relu", "gelu", "gelu_tanh", "swiglu"]

_CHOICES = {
    "position": ("learned", "rope", "none"),
    "norm": ("layernorm", "rmsnorm"),
    "mlp": ("relu", "gelu", "gelu_tanh", "swiglu"),
}


@dataclass(frozen=True)
class GPTConfig:
    """Hyper-parameters of a decoder-only Transformer.

    `d_ff` is the width at which the MLP's nonlinearity acts. Left as None it is 4C for ReLU/GELU and
    2C for SwiGLU (the seed's `hidden_mult=4` projection split into a gate half and a value half).
    """

    vocab_size: int = 100  # V
    context_length: int = 64  # T_max
    d_model: int = 32  # C
    n_heads: int = 4  # H
    n_layers: int = 2  # N
    position: Position = "learned"
    norm: Norm = "layernorm"
    norm_eps: float = 1e-5
    norm_bias: bool = True  # LayerNorm's beta; RMSNorm never has one
    mlp: MLPKind = "gelu"
    d_ff: int | None = None
    attn_bias: bool = True
    mlp_bias: bool = True
    tie_weights: bool = True
    lm_head_bias: bool = False
    rope_theta: float = 10000.0
    n_kv_heads: int | None = None  # H_kv, key/value heads: None = n_heads (MHA), 1 = multi-query, else grouped

    def __post_init__(self) -> None:
        for name in ("vocab_size", "context_length", "d_model", "n_heads", "n_layers"):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise ValueError(f"GPTConfig.{name} must be a positive int, got {value!r}")
        for name, allowed in _CHOICES.items():
            if getattr(self, name) not in allowed:
                raise ValueError(f"GPTConfig.{name} must be one of {allowed}, got {getattr(self, name)!r}")
        if self.d_model % self.n_heads:
            raise ValueError(
                f"d_model={self.d_model} is not divisible by n_heads={self.n_heads}: "
                f"each head needs an equal slice D = d_model / n_heads"
            )
        if self.n_kv_heads is not None and (
            not isinstance(self.n_kv_heads, int) or isinstance(self.n_kv_heads, bool) or self.n_kv_heads < 1
            or self.n_heads % self.n_kv_heads
        ):
            raise ValueError(
                f"GPTConfig.n_kv_heads must be None (= n_heads) or a positive int that divides "
                f"n_heads={self.n_heads}, got {self.n_kv_heads!r}: each key/value head serves an equal group "
                f"of query heads"
            )
        if self.position == "rope" and self.d_head % 2:
            raise ValueError(f"RoPE rotates pairs of features, so d_head must be even, got {self.d_head}")
        if self.d_ff is not None and (not isinstance(self.d_ff, int) or self.d_ff < 1):
            raise ValueError(f"GPTConfig.d_ff must be a positive int or None, got {self.d_ff!r}")
        if self.norm_eps <= 0:
            raise ValueError(f"GPTConfig.norm_eps must be > 0, got {self.norm_eps}")

    @property
    def d_head(self) -> int:
        """D, the width of one attention head."""
        return self.d_model // self.n_heads

    @property
    def kv_heads(self) -> int:
        """H_kv, the number of key/value heads: `n_kv_heads`, or `n_heads` when that is None."""
        return self.n_heads if self.n_kv_heads is None else self.n_kv_heads

    @property
    def hidden_width(self) -> int:
        """The MLP's hidden width: `d_ff`, or its default for this MLP kind."""
        if self.d_ff is not None:
            return self.d_ff
        return 2 * self.d_model if self.mlp == "swiglu" else 4 * self.d_model

    def replace(self, **changes: object) -> GPTConfig:
        """A copy with some fields changed (the dataclass is frozen)."""
        return replace(self, **changes)


PRESETS: dict[str, GPTConfig] = {
    # The assembly seed's runnable model: RoPE, RMSNorm, SwiGLU (4d fused projection), MHA with biases, tied.
    "seed-tiny": GPTConfig(
        vocab_size=100, context_length=1024, d_model=32, n_heads=4, n_layers=2,
        position="rope", norm="rmsnorm", norm_eps=1e-6, mlp="swiglu", d_ff=64,
        attn_bias=True, mlp_bias=False, tie_weights=True,
    ),
    "seed-tiny-untied": GPTConfig(
        vocab_size=100, context_length=1024, d_model=32, n_heads=4, n_layers=2,
        position="rope", norm="rmsnorm", norm_eps=1e-6, mlp="swiglu", d_ff=64,
        attn_bias=True, mlp_bias=False, tie_weights=False,
    ),
    # The architecture seed's repo: learned positions, LayerNorm, ReLU 4C MLP, untied nn.Linear head (with bias).
    # Its sizes are not given there; these are a character-level model's (65 symbols, like tiny Shakespeare).
    "seed-repo": GPTConfig(
        vocab_size=65, context_length=64, d_model=128, n_heads=4, n_layers=4,
        position="learned", norm="layernorm", mlp="relu",
        attn_bias=False, mlp_bias=True, tie_weights=False, lm_head_bias=True,
    ),
    "gpt2-small": GPTConfig(
        vocab_size=50257, context_length=1024, d_model=768, n_heads=12, n_layers=12,
        position="learned", norm="layernorm", norm_eps=1e-5, mlp="gelu_tanh",
        attn_bias=True, mlp_bias=True, tie_weights=True,
    ),
    "llama2-7b": GPTConfig(
        vocab_size=32000, context_length=4096, d_model=4096, n_heads=32, n_layers=32,
        position="rope", norm="rmsnorm", norm_eps=1e-5, mlp="swiglu", d_ff=11008,
        attn_bias=False, mlp_bias=False, tie_weights=False,
    ),
    # Meta-Llama-3-8B: grouped-query attention, 8 key/value heads for 32 query heads; 128K vocabulary, untied.
    "llama3-8b": GPTConfig(
        vocab_size=128256, context_length=8192, d_model=4096, n_heads=32, n_layers=32, n_kv_heads=8,
        position="rope", norm="rmsnorm", norm_eps=1e-5, mlp="swiglu", d_ff=14336,
        attn_bias=False, mlp_bias=False, tie_weights=False, rope_theta=500000.0,
    ),
    # Mistral-7B-v0.2 (v0.1 counts the same; its 4096-token sliding window is not modelled here): GQA 32/8.
    "mistral-7b": GPTConfig(
        vocab_size=32000, context_length=32768, d_model=4096, n_heads=32, n_layers=32, n_kv_heads=8,
        position="rope", norm="rmsnorm", norm_eps=1e-5, mlp="swiglu", d_ff=14336,
        attn_bias=False, mlp_bias=False, tie_weights=False, rope_theta=1000000.0,
    ),
}


def preset(name: str) -> GPTConfig:
    """A named configuration from `PRESETS`."""
    try:
        return PRESETS[name]
    except KeyError:
        raise ValueError(f"unknown preset {name!r}; expected one of {sorted(PRESETS)}") from None
