"""Where the course teaches each named mistake: a mistake's key -> (lesson, a phrase of the heading), for the class
report (`class_report.py`) to name, beside a ranked mistake, the lesson section to revisit.

A mistake is often taught somewhere else than its piece: `attention.unscaled` under lesson 02's "Why divide by
sqrt(D)" whichever lab's attention it was found in, `params.untied_head` where lesson 05 ties the output
projection. A row is `(lesson, phrase)`, the phrase a piece of exactly one heading (any level) of that lesson's
notebook, so rewording a heading keeps a row that still matches and a renamed one fails
tests/test_grading_class_report.py. A key of a by-hand function's switches ("09.adamw_step:decay=gradient") is found
by its function ("09.adamw_step:"). A key without a row falls back to its piece's section
(`class_report.lesson_sections`).
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from pathlib import Path

_DIVIDE = ("02", "Why divide by")
_FORMULA = ("02", "The formula")
_MASK = ("02", "The causal mask")
_BEFORE_SOFTMAX = ("02", "why *before* the softmax")
_NORMS = ("04", "LayerNorm and RMSNorm")
_ACTIVATIONS = ("04", "Activations: ReLU, GELU, SiLU")
_MLPS = ("04", "Two MLPs: GELU and SwiGLU")
_BLOCK = ("04", "The pre-norm residual block")
_CLOSED_FORM = ("06", "The closed form, one component at a time")
_CROSS_ENTROPY = ("09", "Cross-entropy, and why log-sum-exp")

TAUGHT_IN: dict[str, tuple[str, str]] = {
    # the attention catalogue (attention_mistakes.py) and the shared checks' mask and softmax (checks.py)
    "attention.unscaled": _DIVIDE,
    "attention.scaled_by_d": _DIVIDE,
    "attention.scaled_by_c": _DIVIDE,
    "attention.softmax_dim": _FORMULA,
    "attention.swapped": _FORMULA,
    "attention.mask_after": _BEFORE_SOFTMAX,
    "attention.not_causal": _MASK,
    "attention.tiled_kv_heads": ("11", "Grouped-query attention"),
    "attention.top_left": ("11", "Positions with a cache"),
    "mask.wrong_triangle": _MASK,
    "mask.diagonal_masked": _MASK,
    "mask.inverted": _MASK,
    "softmax.over_queries": _FORMULA,
    "softmax.empty_row": _BEFORE_SOFTMAX,
    # the shared shape causes (checks.SHAPE_CAUSES)
    "shape.whole_position_table": ("01", "Learned absolute positions"),
    "shape.no_head_projection": ("02", "One head, end to end"),
    "shape.heads_not_merged": ("03", "Split and merge heads"),
    "shape.qkv_not_split": ("03", "Split and merge heads"),
    "shape.no_mlp_output_projection": _MLPS,
    "shape.no_output_projection": ("05", "The forward pass, stage by stage"),
    # lab 02
    "02.output_from_scores": _FORMULA,
    "02.no_value_projection": ("02", "One head, end to end"),
    # lab 04: the norms, SwiGLU (its gate's activation where the activations are drawn) and the block
    "04.rmsnorm_centred": _NORMS,
    "04.eps_outside_sqrt": _NORMS,
    "04.no_gain": _NORMS,
    "04.divides_by_rsqrt": _NORMS,
    "04.norm_wrong_axis": _NORMS,
    "04.l2_norm": _NORMS,
    "04.gain_plus_one": _NORMS,
    "04.gate_value_swapped": _MLPS,
    "04.silu_on_value": _MLPS,
    "04.silu_of_product": _MLPS,
    "04.gate_plus_value": _MLPS,
    "04.interleaved_split": _MLPS,
    "04.no_silu": _ACTIVATIONS,
    "04.relu_gate": _ACTIVATIONS,
    "04.sigmoid_gate": _ACTIVATIONS,
    "04.gelu_gate": _ACTIVATIONS,
    "04.post_norm": _BLOCK,
    "04.no_attention_residual": _BLOCK,
    "04.no_mlp_residual": _BLOCK,
    "04.residual_from_normed": _BLOCK,
    "04.parallel_mlp": _BLOCK,
    "04.norm1_twice": _BLOCK,
    "04.no_norms": _BLOCK,
    "04.rope_not_passed": _BLOCK,
    **dict.fromkeys(("04.count_attention_bias_missing", "04.count_attention_bias_extra", "04.count_w_in_unfused",
                     "04.count_swiglu_four_matrices", "04.count_swiglu_bias_extra", "04.count_mlp_bias_extra",
                     "04.count_mlp_bias_missing", "04.count_norm_missing", "04.count_norm_bias"),
                    ("04", "The seed's $2d^2$ row")),
    # a parameter count's (checks.check_parameter_count: labs 05 and 06)
    "params.untied_head": ("05", "Tied or untied output projection"),
    "params.head_counted_tied": ("05", "Tied or untied output projection"),
    "params.no_attention_output": _CLOSED_FORM,
    "params.no_final_norm": _CLOSED_FORM,
    "params.no_block_norms": _CLOSED_FORM,
    "params.one_norm_per_block": _CLOSED_FORM,
    "params.no_position_table": _CLOSED_FORM,
    "params.position_table_counted": _CLOSED_FORM,
    "params.attention_bias_missing": _CLOSED_FORM,
    "params.attention_bias_counted": _CLOSED_FORM,
    "params.one_attention_bias": _CLOSED_FORM,
    "params.mlp_bias_missing": _CLOSED_FORM,
    "params.mlp_bias_counted": _CLOSED_FORM,
    "params.head_bias_missing": _CLOSED_FORM,
    "params.head_bias_counted": _CLOSED_FORM,
    "params.swiglu_four_matrices": _CLOSED_FORM,
    "params.swiglu_bias_as_gelu": _CLOSED_FORM,
    "params.swiglu_two_matrices": ("04", "The seed's $2d^2$ row"),
    "params.swiglu_default_4d": _MLPS,
    "params.layernorm_no_beta": _NORMS,
    "params.rmsnorm_bias": _NORMS,
    "params.estimate_12nd2": ("06", "rule of thumb"),
    "06.counted_built_tensors": _CLOSED_FORM,
    # lab 09 (and lab 10's log of a sigmoid: the same eps)
    "loss.eps_in_log": _CROSS_ENTROPY,
    "09.ce_summed": _CROSS_ENTROPY,
    "09.ce_sign_flipped": _CROSS_ENTROPY,
    "09.ce_logsumexp_over_rows": _CROSS_ENTROPY,
    "09.ce_probability_averaged": _CROSS_ENTROPY,
    "09.ce_logsumexp_no_shift_back": _CROSS_ENTROPY,
    "09.ce_exp_overflow": _CROSS_ENTROPY,
    "09.ce_log_of_softmax": _CROSS_ENTROPY,
    "09.ce_exp_overflow_nan": _CROSS_ENTROPY,
    "09.adamw_step:": ("09", "AdamW, line by line"),
    "09.lr_at:": ("09", "Warmup, then cosine"),
    "09.clip_not_in_place": ("09", "Clipping a gradient spike"),
    "09.clip_per_tensor": ("09", "Clipping a gradient spike"),
    "09.clip_scaled_up": ("09", "Clipping a gradient spike"),
    "09.clip_norms_added": ("09", "Clipping a gradient spike"),
    "09.clip_by_value": ("09", "Clipping a gradient spike"),
    "09.clip_norm_after": ("09", "Clipping a gradient spike"),
    "09.accumulation:": ("09", "Gradient accumulation"),
    "09.accumulate_loss_summed": ("09", "Gradient accumulation"),
    "09.accumulate_one_forward": ("09", "Gradient accumulation"),
    "09.state_missing_entries": ("09", "Checkpoints that resume exactly"),
    "09.step_not_restored": ("09", "Checkpoints that resume exactly"),
    "09.restore_training_state:": ("09", "Checkpoints that resume exactly"),
    "09.state_wrong_generator": ("09", "Checkpoints that resume exactly"),
    # lab 07
    **dict.fromkeys(("07.targets_not_shifted", "07.x_y_swapped", "07.softmax_before_loss", "07.loss_summed",
                     "07.last_position_only", "07.targets_flattened_transposed", "07.targets_shifted_twice"),
                    ("07", "The loss")),
    "07.train_step:": ("07", "Training, with a live loss curve"),
    **dict.fromkeys(("07.temperature_after_softmax", "07.temperature_power_after_softmax", "07.no_temperature",
                     "07.temperature_multiplied", "07.temperature_twice", "07.softmax_over_batch", "07.top_k_minus_1",
                     "07.top_k_plus_1", "07.top_k_fill_zero", "07.top_k_zeroed_after_softmax",
                     "07.top_k_batch_threshold", "07.first_position", "07.argmax_sampling",
                     "07.sampling_unfiltered"), ("07", "Sampling: temperature and top-k")),
    # lab 10
    **dict.fromkeys(("10.mask_not_causal", "10.mask_pad_queries", "10.mask_inverted", "10.mask_pad_query_sees_nothing",
                     "10.mask_no_head_axis"), ("10", "Padding, and the wrong answer first")),
    **dict.fromkeys(("10.pool_position_minus_one", "10.pool_mask_sum", "10.pool_first_real", "10.pool_row_index",
                     "10.pool_averaged"), ("10", "A classifier")),
    **dict.fromkeys(("10.labels_mask_response", "10.labels_padding_kept", "10.labels_fill_zero",
                     "10.labels_last_prompt_kept", "10.labels_first_response_masked", "10.labels_prompt_from_zero",
                     "10.labels_shifted"), ("10", "Instruction tuning")),
    **dict.fromkeys(("10.bt_log_of_sigmoid", "10.bt_swapped", "10.bt_no_minus", "10.bt_no_log", "10.bt_summed",
                     "10.bt_mean_before_log_sigmoid", "10.bt_clamped_before_log"), ("10", "A reward model")),
    **dict.fromkeys(("10.lora_base_trainable", "10.lora_a_zero", "10.lora_b_not_zero", "10.lora_scaled_by_alpha",
                     "10.lora_unscaled", "10.lora_rank_over_alpha", "10.lora_rslora", "10.lora_no_base",
                     "10.lora_full_matrix"), ("10", "LoRA")),
    # lab 13
    **dict.fromkeys(("13.logps_averaged", "13.logps_prompt_counted", "13.logps_unshifted", "13.logps_shifted_wrong_way",
                     "13.logps_probabilities_summed", "13.logps_softmax_over_positions", "13.logps_ignored_counted"),
                    ("13", "The log-probability of a response")),
    **dict.fromkeys(("13.dpo_swapped", "13.dpo_no_reference", "13.dpo_beta_on_loss", "13.dpo_no_beta",
                     "13.dpo_beta_divides", "13.dpo_beta_on_chosen_only", "13.dpo_beta_on_rejected_only",
                     "13.dpo_summed", "13.reward_no_beta", "13.reward_no_reference"), ("13", "From Bradley")),
    "13.adapters_still_on": ("13", "The reference: a frozen copy"),
}


def row_of(key: str) -> tuple[str, str] | None:
    """The key's row, or its by-hand function's ("NN.function:" for "NN.function:switch=value"); None without."""
    return TAUGHT_IN.get(key) or (TAUGHT_IN.get(key.partition(":")[0] + ":") if ":" in key else None)


def lesson_headings(root: Path, lesson: str) -> list[str]:
    """The markdown headings (every level, without their #s) of lesson `lesson` ("02") of the course at `root`, in
    order; [] when it has no readable notebook."""
    found = sorted((root / "lessons").glob(f"{lesson}_*.ipynb"))
    try:
        cells = json.loads(found[0].read_text(encoding="utf-8")).get("cells", []) if found else []
    except (OSError, ValueError):
        return []
    return [line.lstrip("#").strip() for cell in cells if cell.get("cell_type") == "markdown"
            for line in "".join(cell.get("source", [])).splitlines() if line.startswith("#")]


def heading_of(headings: list[str], phrase: str) -> str | None:
    """The one heading that holds `phrase`; None when none or several do."""
    matches = [heading for heading in headings if phrase in heading]
    return matches[0] if len(matches) == 1 else None


def mistake_sections(root: Path, keys: Iterable[str]) -> dict[str, str]:
    """{key: "lesson NN, <heading>"} for each of `keys` with a row that resolves in the course at `root` (the
    others are left out: the report shows their piece's section)."""
    headings: dict[str, list[str]] = {}
    sections = {}
    for key in keys:
        row = row_of(key)
        if row is None:
            continue
        lesson, phrase = row
        heading = heading_of(headings.setdefault(lesson, lesson_headings(root, lesson)), phrase)
        if heading is not None:
            sections[key] = f"lesson {lesson}, {heading}"
    return sections
