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


def _positive_int(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 1


@dataclass(frozen=True)
class MoESpec:
    """A mixture of experts in place of each block's MLP (lesson 16): `n_experts` SwiGLU experts of width `d_ff`
    (None: the config's `hidden_width`), `top_k` of them per token, plus a shared expert of width `shared_d_ff`
    that every token goes through (DeepSeek's; 0 for none). The first `dense_layers` blocks keep a dense MLP
    (DeepSeek-V3's first 3). `capacity_factor` caps each expert at ceil(factor N k / E) of a batch's N tokens
    (Switch Transformer); the rest of its tokens are dropped (None: no cap)."""

    n_experts: int
    top_k: int
    d_ff: int | None = None
    shared_d_ff: int = 0
    dense_layers: int = 0
    capacity_factor: float | None = None

    def __post_init__(self) -> None:
        if not _positive_int(self.n_experts) or not _positive_int(self.top_k) or self.top_k > self.n_experts:
            raise ValueError(f"MoESpec needs 1 <= top_k <= n_experts, got top_k={self.top_k!r}, "
                             f"n_experts={self.n_experts!r}")
        if self.d_ff is not None and not _positive_int(self.d_ff):
            raise ValueError(f"MoESpec.d_ff must be a positive int or None, got {self.d_ff!r}")
        for name in ("shared_d_ff", "dense_layers"):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value < 0:
                raise ValueError(f"MoESpec.{name} must be an int >= 0, got {value!r}")
        if self.capacity_factor is not None and not self.capacity_factor > 0:
            raise ValueError(f"MoESpec.capacity_factor must be > 0 or None, got {self.capacity_factor!r}")


@dataclass(frozen=True)
class LatentAttention:
    """DeepSeek's multi-head latent attention, for parameter counts only (`GPT` does not build it): queries through
    a rank-`q_rank` bottleneck, keys and values through a shared rank-`kv_rank` latent (cached instead of K and V,
    lesson 11), each head's query and key of `nope_dim` + `rope_dim` features, its value of `v_dim`."""

    q_rank: int
    kv_rank: int
    nope_dim: int
    rope_dim: int
    v_dim: int

    def __post_init__(self) -> None:
        for name in ("q_rank", "kv_rank", "nope_dim", "rope_dim", "v_dim"):
            if not _positive_int(getattr(self, name)):
                raise ValueError(f"LatentAttention.{name} must be a positive int, got {getattr(self, name)!r}")


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
    moe: MoESpec | None = None  # a mixture of experts in place of the MLP (SwiGLU experts)
    latent_attention: LatentAttention | None = None  # counted only: GPT does not build it

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
        if self.moe is not None:
            if not isinstance(self.moe, MoESpec):
                raise ValueError(f"GPTConfig.moe must be a MoESpec or None, got {type(self.moe).__name__}")
            if self.mlp != "swiglu":
                raise ValueError(f"a mixture of experts has SwiGLU experts: set mlp='swiglu' (got {self.mlp!r})")
            if self.moe.dense_layers > self.n_layers:
                raise ValueError(f"MoESpec.dense_layers={self.moe.dense_layers} is more than n_layers={self.n_layers}")
        if self.latent_attention is not None and not isinstance(self.latent_attention, LatentAttention):
            raise ValueError("GPTConfig.latent_attention must be a LatentAttention or None, got "
                             f"{type(self.latent_attention).__name__}")

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


# The assembly seed's runnable model: RoPE, RMSNorm, SwiGLU (4d fused projection), MHA with biases, tied.
_SEED_TINY = GPTConfig(
    vocab_size=100, context_length=1024, d_model=32, n_heads=4, n_layers=2,
    position="rope", norm="rmsnorm", norm_eps=1e-6, mlp="swiglu", d_ff=64,
    attn_bias=True, mlp_bias=False, tie_weights=True,
)

PRESETS: dict[str, GPTConfig] = {
    "seed-tiny": _SEED_TINY,
    "seed-tiny-untied": _SEED_TINY.replace(tie_weights=False),
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
    # Mixtral-8x7B: Mistral-7B's attention, each MLP 8 SwiGLU experts of 14336, 2 per token
    "mixtral-8x7b": GPTConfig(
        vocab_size=32000, context_length=32768, d_model=4096, n_heads=32, n_layers=32, n_kv_heads=8,
        position="rope", norm="rmsnorm", norm_eps=1e-5, mlp="swiglu", d_ff=14336,
        attn_bias=False, mlp_bias=False, tie_weights=False, rope_theta=1000000.0,
        moe=MoESpec(n_experts=8, top_k=2),
    ),
    # DeepSeek-V3 (without its multi-token-prediction module): latent attention, 61 blocks, the first 3 with a
    # dense SwiGLU of 18432, the others 256 routed experts of 2048 (8 per token) and one shared expert
    "deepseek-v3": GPTConfig(
        vocab_size=129280, context_length=163840, d_model=7168, n_heads=128, n_layers=61,
        position="rope", norm="rmsnorm", norm_eps=1e-6, mlp="swiglu", d_ff=18432,
        attn_bias=False, mlp_bias=False, tie_weights=False,
        moe=MoESpec(n_experts=256, top_k=8, d_ff=2048, shared_d_ff=2048, dense_layers=3),
        latent_attention=LatentAttention(q_rank=1536, kv_rank=512, nope_dim=128, rope_dim=64, v_dim=128),
    ),
}


def preset(name: str) -> GPTConfig:
    """A named configuration from `PRESETS`."""
    try:
        return PRESETS[name]
    except KeyError:
        raise ValueError(f"unknown preset {name!r}; expected one of {sorted(PRESETS)}") from None
