"""gptcourse: the reference GPT that the lessons import and the labs are graded against."""

from .attention import (
    AttentionHead,
    KVCache,
    LayerCache,
    MultiHeadAttention,
    attention,
    causal_mask,
    fused_attention,
)
from .block import DecoderBlock
from .config import PRESETS, GPTConfig, preset
from .data import get_batch, load_text, train_val_split
from .generate import filter_logits, generate
from .heads import RewardModel, ValueHead
from .mlp import MLP, SwiGLU
from .model import GPT
from .norms import LayerNorm, RMSNorm
from .params import block_breakdown, count_parameters, parameter_breakdown
from .positions import LearnedPositions, RotaryEmbedding, apply_rope, rotate_half
from .tokenizer import CharTokenizer
from .train import TrainConfig, default_recipe, estimate_loss, lr_at, train

__version__ = "0.1.0"

__all__ = [
    "GPT",
    "MLP",
    "PRESETS",
    "AttentionHead",
    "CharTokenizer",
    "DecoderBlock",
    "GPTConfig",
    "KVCache",
    "LayerCache",
    "LayerNorm",
    "LearnedPositions",
    "MultiHeadAttention",
    "RMSNorm",
    "RewardModel",
    "RotaryEmbedding",
    "SwiGLU",
    "TrainConfig",
    "ValueHead",
    "__version__",
    "apply_rope",
    "attention",
    "block_breakdown",
    "causal_mask",
    "count_parameters",
    "default_recipe",
    "estimate_loss",
    "filter_logits",
    "fused_attention",
    "generate",
    "get_batch",
    "load_text",
    "lr_at",
    "parameter_breakdown",
    "preset",
    "rotate_half",
    "train",
    "train_val_split",
]
