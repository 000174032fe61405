"""gptcourse: the reference GPT that the lessons import and the labs are graded against.

The package is grouped by stage, as the course is: `model` (the network), `text` (tokenizers, corpus),
`training`, `inference`, `evaluation`, and `grading` (nbgrader). `from gptcourse import X` is the one public
import; no module shares its name with anything exported here, so `gptcourse.generate` is always the function.

`WHERE` below is the table of contents: which module defines each public name. The names are imported on first
use (PEP 562), so `import gptcourse` and the `gptcourse` command start without importing torch. Imported before
torch, it makes torch's waiting threads spin only briefly before they sleep (`threads.py`): a lesson stays fast
alone and beside another busy process.
"""

from __future__ import annotations

import importlib
from typing import Any

from .threads import spin_briefly_then_sleep

spin_briefly_then_sleep()

__version__ = "0.1.0"

WHERE: dict[str, tuple[str, ...]] = {  # module (under gptcourse) -> the public names it defines
    "evaluation.arithmetic": ("addition_items", "addition_text"),
    "evaluation.contamination": ("ngram_overlap",),
    "evaluation.continuations": ("loglikelihood",),
    "evaluation.error_bars": ("PairedComparison", "bootstrap_interval", "paired_bootstrap", "standard_error"),
    "evaluation.multiple_choice": ("MultipleChoiceItem", "encode_pair", "few_shot_context", "multiple_choice_accuracy",
                                   "score_choices"),
    "evaluation.unbiased_pass": ("pass_at_k",),
    "evaluation.verified_generation": ("count_correct", "normalize_answer"),
    "finetuning.checked_sums": ("addition_problems", "addition_reward"),
    "finetuning.dpo": ("DPOLoss", "dpo_loss"),
    "finetuning.dpo_training": ("DPOConfig", "PreferencePair", "dpo_batch", "dpo_step", "train_dpo"),
    "finetuning.grpo_objective": ("GRPOStats", "grpo_loss"),
    "finetuning.grpo_training": ("GRPOBatch", "GRPOConfig", "SampledGroups", "grpo_step", "sample_groups",
                                 "token_logprobs", "train_grpo"),
    "finetuning.group_baseline": ("group_advantages",),
    "finetuning.kl_estimators": ("kl_k3",),
    "finetuning.log_likelihood": ("sequence_logprobs",),
    "finetuning.lora": ("LoRALinear", "adapters_disabled", "add_lora", "lora_parameter_count", "merge_lora"),
    "finetuning.losses": ("IGNORE_INDEX", "bradley_terry_loss", "masked_lm_loss", "response_labels"),
    "finetuning.padding": ("pad_batch",),
    "finetuning.policy_gradient": ("policy_gradient_loss",),
    "finetuning.reference": ("AdaptersOff", "frozen_copy", "without_adapters"),
    "finetuning.stopping": ("greedy_until_stop",),
    "finetuning.tasks": ("LINE_KINDS", "keywordless_line_kind_task", "line_kind_task", "preference_task",
                         "signature_task"),
    "inference.sampling": ("decode_layout", "filter_logits", "generate"),
    "model.block": ("DecoderBlock",),
    "model.causal_attention": ("AttentionHead", "MultiHeadAttention", "attention", "causal_mask", "fused_attention",
                               "padding_mask", "repeat_kv"),
    "model.config": ("GPTConfig", "LatentAttention", "MoESpec", "PRESETS", "preset"),
    "model.gpt": ("GPT",),
    "model.heads": ("RewardModel", "SequenceClassifier", "ValueHead", "last_real_token"),
    "model.kv_cache": ("KVCache", "LayerCache", "kv_cache_bytes"),
    "model.load_balancing": ("load_balancing_loss", "router_z_loss"),
    "model.mixture_of_experts": ("MoE", "top_k_routing"),
    "model.mlp": ("MLP", "SwiGLU"),
    "model.norms": ("LayerNorm", "RMSNorm"),
    "model.params": ("block_breakdown", "count_parameters", "parameter_breakdown"),
    "model.positions": ("LearnedPositions", "RotaryEmbedding", "apply_rope", "rotate_half"),
    "model.tiled_attention": ("FlashAttention", "computed_tiles", "flash_attention", "flash_backward",
                              "flash_forward", "online_softmax"),
    "text.bpe": ("BPETokenizer", "GPT2_PATTERN"),
    "text.char_tokenizer": ("CharTokenizer",),
    "text.corpus": ("get_batch", "load_text", "train_val_split"),
    "training.checkpoint": ("CheckpointError", "load_checkpoint", "save_checkpoint"),
    "training.clipping": ("clip_grad_norm",),
    "training.losses": ("cross_entropy",),
    "training.optim": ("AdamW",),
    "training.loop": ("TrainConfig", "default_recipe", "estimate_loss", "lr_at", "train"),
}
_MODULE_OF = {name: module for module, names in WHERE.items() for name in names}
__all__ = sorted(_MODULE_OF)


def __getattr__(name: str) -> Any:
    module = _MODULE_OF.get(name)
    if module is None:
        raise AttributeError(f"module 'gptcourse' has no attribute {name!r}")
    value = getattr(importlib.import_module(f".{module}", __name__), name)
    globals()[name] = value  # later lookups skip this function
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))
