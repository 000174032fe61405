"""Where the course teaches each named mistake: a mistake's key -> (lesson, a phrase of the heading), for the class
report (`class_report.py`) to name, beside a ranked mistake, the lesson section to revisit.

A mistake is often taught somewhere else than its piece: `attention.unscaled` under lesson 02's "Why divide by
sqrt(D)" whichever lab's attention it was found in, `params.untied_head` where lesson 05 ties the output
projection. A row is `(lesson, phrase)`, the phrase a piece of exactly one heading (any level) of that lesson's
notebook, so rewording a heading keeps a row that still matches and a renamed one fails
tests/test_grading_mistake_keys.py. The table (`TEACHES`) lists each section once with the keys it teaches;
`TAUGHT_IN` is its inverse, key -> row. A key of a by-hand function's switches ("09.adamw_step:decay=gradient") is
found by its function ("09.adamw_step:"). A key without a row falls back to its piece's section
(`class_report.lesson_sections`).
"""

from __future__ import annotations

import json
import re
from collections import Counter
from collections.abc import Iterable, Mapping
from pathlib import Path

# lesson -> {a phrase of one of its headings: the keys of the mistakes that section teaches}, each section once; a
# key without a dot is the lesson's own lab's ("no_value_projection" under "02" is "02.no_value_projection")
TEACHES: dict[str, dict[str, str]] = {
    # lab 01's tokenizer, one-hot lookup and embeddings
    "01": {"Characters to ids": "vocab_per_character vocab_unsorted_set ids_first_seen_order ids_from_one "
                                "encode_not_per_character decode_separator unknown_char_no_error "
                                "unknown_char_not_value_error unknown_char_unnamed",
           "The same lookup as a matrix product": "one_hot_not_multiplied rows_by_position rows_looked_up "
                                                  "one_hot_no_num_classes one_hot_fixed_dtype",
           "Learned absolute positions": "shape.whole_position_table whole_position_table positions_out_of_table "
                                         "no_positions positions_by_batch positions_by_token_id positions_from_one"},
    # the attention catalogue (attention_mistakes.py), the shared checks' mask and softmax (checks.py) and lab 02's
    "02": {"Why divide by": "attention.unscaled attention.scaled_by_d attention.scaled_by_c",
           "The formula": "attention.softmax_dim attention.swapped softmax.over_queries output_from_scores",
           "The causal mask": "attention.not_causal mask.wrong_triangle mask.diagonal_masked mask.inverted",
           "why *before* the softmax": "attention.mask_after softmax.empty_row",
           "One head, end to end": "shape.no_head_projection no_value_projection"},
    # lab 03's heads, multi-head attention and RoPE
    "03": {"Split and merge heads": "shape.heads_not_merged shape.qkv_not_split split_view_bhtd split_strided "
                                    "merge_no_transpose merge_interleaved mha_merge_no_transpose mha_split_view_bhtd "
                                    "heads_not_merged_before_out mha_q_k_swapped mha_neox_qkv_layout mha_no_heads",
           "All heads in one call": "mha_no_out_projection",
           "Rotary position embeddings": "rope_interleaved rope_interleaved_pair_angle rope_wrong_direction "
                                         "rope_cos_sin_swapped rope_no_rotate_half rope_tables_ignored "
                                         "tables_interleaved tables_slow_frequencies tables_per_feature_frequency "
                                         "tables_positions_from_one tables_default_theta tables_one_angle_per_pair",
           "RoPE inside multi-head attention": "mha_rope_on_v mha_no_rope mha_rope_q_only"},
    # lab 04: the norms, SwiGLU (its gate's activation where the activations are drawn), the block and its counts
    "04": {"LayerNorm and RMSNorm": "rmsnorm_centred eps_outside_sqrt no_gain divides_by_rsqrt norm_wrong_axis l2_norm "
                                    "gain_plus_one params.layernorm_no_beta params.rmsnorm_bias",
           "Activations: ReLU, GELU, SiLU": "no_silu relu_gate sigmoid_gate gelu_gate",
           "Two MLPs: GELU and SwiGLU": "shape.no_mlp_output_projection gate_value_swapped silu_on_value "
                                        "silu_of_product gate_plus_value interleaved_split params.swiglu_default_4d "
                                        "16.count_width_4c 16.count_two_matrices",
           "The pre-norm residual block": "post_norm no_attention_residual no_mlp_residual residual_from_normed "
                                          "parallel_mlp norm1_twice no_norms rope_not_passed",
           "The seed's $2d^2$ row": "count_attention_bias_missing count_attention_bias_extra count_w_in_unfused "
                                    "count_swiglu_four_matrices count_swiglu_bias_extra count_mlp_bias_extra "
                                    "count_mlp_bias_missing count_norm_missing count_norm_bias "
                                    "params.swiglu_two_matrices"},
    # lab 05's assembled GPT (and a parameter count's tied head: checks.check_parameter_count, labs 05 and 06)
    "05": {"The forward pass, stage by stage": "shape.no_output_projection blocks_not_applied no_final_norm no_lm_head "
                                               "returns_probabilities no_positions positions_are_token_ids "
                                               "positions_whole_context rope_not_used",
           "Tied or untied output projection": "params.untied_head params.head_counted_tied head_copied not_tied "
                                               "tied_when_untied 16.count_untied",
           "The seed's RoPE flag": "nope_has_pos_emb",
           "`forward_hidden` and heads": "hidden_through_lm_head"},
    # lab 06's counts (and lab 16's of what every dense model has)
    "06": {"The closed form, one component at a time": "params.no_attention_output params.no_final_norm "
                                                       "params.no_block_norms params.one_norm_per_block "
                                                       "params.no_position_table params.position_table_counted "
                                                       "params.attention_bias_missing params.attention_bias_counted "
                                                       "params.one_attention_bias params.mlp_bias_missing "
                                                       "params.mlp_bias_counted params.head_bias_missing "
                                                       "params.head_bias_counted params.swiglu_four_matrices "
                                                       "params.swiglu_bias_as_gelu counted_built_tensors "
                                                       "16.count_built_tensors 16.count_one_norm",
           "rule of thumb": "params.estimate_12nd2"},
    # lab 07
    "07": {"The loss": "targets_not_shifted x_y_swapped softmax_before_loss loss_summed last_position_only "
                       "targets_flattened_transposed targets_shifted_twice",
           "Training, with a live loss curve": "train_step:",
           "Sampling: temperature and top-k": "temperature_after_softmax temperature_power_after_softmax "
                                              "no_temperature temperature_multiplied temperature_twice "
                                              "softmax_over_batch top_k_minus_1 top_k_plus_1 top_k_fill_zero "
                                              "top_k_zeroed_after_softmax top_k_batch_threshold first_position "
                                              "argmax_sampling sampling_unfiltered"},
    # lab 08's BPE: counting, merging, training (ties included), encoding and decoding are all section 3's
    "08": {"The pre-tokenizer": "train_not_pretokenized encode_not_pretokenized",
           "BPE training, by hand": "count_overlaps_once count_once_each count_stride_two count_last_pair_lost "
                                    "merge_reuses_right_half merge_reversed_pair merge_loses_last merge_as_text "
                                    "merge_first_only train_ties_least train_ties_first_counted train_ties_by_ids "
                                    "train_ties_joined train_overlap_merged_twice train_unweighted train_overlaps_once "
                                    "train_too_many_merges train_too_few_merges encode_newest_first encode_raw_bytes "
                                    "encode_overlap_merged_twice encode_code_points encode_greedy encode_longest "
                                    "encode_leftmost decode_per_token",
           "Text is bytes": "decode_latin1"},
    # lab 09 (and lab 10's log of a sigmoid: the same eps; lab 11's exp() past 88)
    "09": {"Cross-entropy, and why log-sum-exp": "loss.eps_in_log ce_summed ce_sign_flipped ce_logsumexp_over_rows "
                                                 "ce_probability_averaged ce_logsumexp_no_shift_back ce_exp_overflow "
                                                 "ce_log_of_softmax ce_exp_overflow_nan 11.one_token_overflow "
                                                 "11.top_p_overflow",
           "AdamW, line by line": "adamw_step:",
           "Warmup, then cosine": "lr_at:",
           "Clipping a gradient spike": "clip_not_in_place clip_per_tensor clip_scaled_up clip_norms_added "
                                        "clip_by_value clip_norm_after",
           "Gradient accumulation": "accumulation: accumulate_loss_summed accumulate_one_forward",
           "Checkpoints that resume exactly": "state_missing_entries step_not_restored restore_training_state: "
                                              "state_wrong_generator"},
    # lab 10
    "10": {"Padding, and the wrong answer first": "mask_not_causal mask_pad_queries mask_inverted "
                                                  "mask_pad_query_sees_nothing mask_no_head_axis",
           "A classifier": "pool_position_minus_one pool_mask_sum pool_first_real pool_row_index pool_averaged",
           "Instruction tuning": "labels_mask_response labels_padding_kept labels_fill_zero labels_last_prompt_kept "
                                 "labels_first_response_masked labels_prompt_from_zero labels_shifted",
           "A reward model": "bt_log_of_sigmoid bt_swapped bt_no_minus bt_no_log bt_summed bt_mean_before_log_sigmoid "
                             "bt_clamped_before_log",
           "LoRA": "lora_base_trainable lora_a_zero lora_b_not_zero lora_scaled_by_alpha lora_unscaled "
                   "lora_rank_over_alpha lora_rslora lora_no_base lora_full_matrix"},
    # lab 11's cache, one-token attention, positions, top-p, GQA and greedy generation
    "11": {"Prefill and decode": "cache_at_zero cache_only_new cache_keys_values_swapped cache_length_wrong "
                                 "cache_not_one_buffer cache_whole_buffer one_token_sees_itself generate_no_prompt "
                                 "generate_no_prefill generate_refeeds_sequence generate_token_fed_twice "
                                 "generate_last_prompt_token_refed generate_prefill_first_logits generate_not_argmax",
           "Positions with a cache": "attention.top_left positions_from_zero positions_past_plus_one "
                                     "prompt_counted_twice positions_all_past positions_whole_sequence",
           "Top-p against top-k": "top_p_ascending top_p_ascending_kept_le_p top_p_cumsum_of_logits top_p_unsorted "
                                  "top_p_not_scattered_back top_p_own_probability top_p_threshold_one_minus_p "
                                  "top_p_no_neg_inf top_p_logits_changed",
           "Grouped-query attention": "attention.tiled_kv_heads gqa_split_view gqa_cache_after_repeat "
                                      "16.count_all_heads_kv 16.count_kv_without_d_head"},
    # lab 12's merge, tiled forward, tiles and backward
    "12": {"Online softmax by hand": "rescale_o rescale_denom keep_denom divide_early rescale_inverted own_max "
                                     "merge_max_block_only merge_overflow",
           "The tiled forward": "tail_dropped no_rescale keys_through_q0 divided_each mask_only_k0_q0 lse_max_only "
                                "lse_no_max forward_square_mask forward_whole_scores forward_untiled_keys",
           "Which tiles are computed": "forward_masked_future_tiles forward_key_loop_one_late tiles_not_reported "
                                       "tiles_reported_twice tiles_above_diagonal tiles_needed_skipped",
           "The backward: recompute": "backward_no_delta backward_grads_unscaled backward_scores_unscaled "
                                      "backward_not_masked backward_wrong_groups backward_tiled_expand "
                                      "backward_keeps_scores backward_keeps_too_much function_no_apply "
                                      "function_detached"},
    # lab 13
    "13": {"The log-probability of a response": "logps_averaged logps_prompt_counted logps_unshifted "
                                                "logps_shifted_wrong_way logps_probabilities_summed "
                                                "logps_softmax_over_positions logps_ignored_counted",
           "From Bradley": "dpo_swapped dpo_no_reference dpo_beta_on_loss dpo_no_beta dpo_beta_divides "
                           "dpo_beta_on_chosen_only dpo_beta_on_rejected_only dpo_summed reward_no_beta "
                           "reward_no_reference",
           "The reference: a frozen copy": "adapters_still_on",
           "Training with DPO": "by_hand_step:"},
    # lab 14's log-likelihoods and choices, bootstrap, pass@k and contamination
    "14": {"Scoring a choice by its log-likelihood": "ll_context_counted ll_no_shift ll_shift_two ll_mean "
                                                     "ll_probabilities_summed ll_first_not_scored ll_raw_logits "
                                                     "ll_softmax_over_positions ll_log_of_softmax choice_in_place "
                                                     "choice_delimiter_counted choice_bytes_as_chars choice_words "
                                                     "choice_chars_as_bytes choice_two_bytes_at_most choice_softmax "
                                                     "choice_unicode_normalized choice_multiplied "
                                                     "choice_normalize_ignored",
           "Error bars": "boot_other_draws boot_transposed_draws boot_unpaired boot_randint_short "
                         "boot_item_differences boot_90_percent boot_0_to_95 boot_index_not_interpolated "
                         "boot_normal_interval boot_permutation",
           "pass@k and the temperature": "pass_monte_carlo pass_with_replacement pass_at_one pass_none_correct "
                                         "pass_product_off_by_one pass_union_bound pass_floor_division pass_rounded",
           "Contamination": "overlap_split_spaces_lowercased overlap_split_spaces overlap_not_lowercased "
                            "overlap_train_not_lowercased overlap_per_line overlap_ascii_words overlap_unigrams "
                            "overlap_per_word overlap_short_whole overlap_characters overlap_unique "
                            "overlap_last_missing overlap_substrings overlap_any_found"},
    # lab 15's advantages, KL, loss (its KL term in section 3) and step
    "15": {"The group baseline": "adv_sign_flipped adv_not_scaled adv_population_std adv_over_batch "
                                 "adv_groups_transposed adv_groups_interleaved adv_batch_std adv_no_eps_nan_to_zero",
           "the k3 estimate of the KL": "kl_ratio_reversed kl_k1 kl_k2 kl_abs_k1 kl_no_minus_one loss_kl_reversed "
                                        "loss_no_kl loss_kl_subtracted loss_kl_to_old",
           "The clipped ratio": "loss_old_not_detached loss_ratio_detached loss_clip_product loss_clip_upper_only "
                                "loss_no_clip loss_clip_advantage loss_advantage_outside_min loss_max_for_min "
                                "loss_log_ratio loss_ratio_inverted loss_tokens_averaged loss_padding_counted "
                                "loss_divided_by_t loss_tokens_summed loss_answers_summed",
           "GRPO, end to end": "by_hand_step:"},
    # lab 16's router, dispatch, load-balancing loss and counts (its dense parts' with lessons 04, 05, 06 and 11)
    "16": {"Why sparse": "count_all_active count_no_shared_active count_shared_as_routed count_no_router "
                         "count_all_sparse count_no_embeddings_active count_router_bias count_router_active_k "
                         "count_dense_expert_width",
           "The router by hand": "route_not_renormalised route_softmax_twice route_raw_logits route_logits_normalised "
                                 "route_sigmoid route_log_softmax route_softmax_over_tokens route_smallest "
                                 "route_by_position route_same_expert_twice",
           "Dispatch by index": "dispatch_unweighted dispatch_first_weight dispatch_first_only "
                                "dispatch_weight_by_expert_index dispatch_overwrite dispatch_called_per_token "
                                "dispatch_dense dispatch_by_unique_position dispatch_off_by_one "
                                "expert_called_with_wrong_rows",
           "the load-balancing loss": "balance_p_top_k balance_p_renormalised balance_p_logits balance_f_first "
                                      "balance_f_first_k_times balance_f_per_slot balance_f_soft balance_f_one_share "
                                      "balance_no_e balance_padding_counted balance_mask_f_only balance_mask_p_only "
                                      "balance_divided_by_all_positions balance_mask_transposed"},
}


def inverted(teaches: Mapping[str, Mapping[str, str]]) -> dict[str, tuple[str, str]]:
    """{key: (lesson, phrase)} from {lesson: {phrase: "key key ..."}}; a key listed twice is refused (a mistake is
    taught in one place)."""
    rows = [(key if "." in key else f"{lesson}.{key}", (lesson, phrase)) for lesson, sections in teaches.items()
            for phrase, keys in sections.items() for key in keys.split()]
    listed = Counter(key for key, _ in rows)
    if twice := sorted(key for key, count in listed.items() if count > 1):
        raise ValueError(f"keys listed under more than one section: {twice}; list each under the one that teaches it")
    return dict(rows)


TAUGHT_IN: dict[str, tuple[str, str]] = inverted(TEACHES)


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


# the LaTeX inside the lessons' headings' $...$, as text: the report's pages run no script, so nothing renders it
_MATH_AS_TEXT = ((re.compile(r"\\sqrt\{([^{}]*)\}"), r"√\1"), (re.compile(r"\\infty\b"), "∞"),
                 (re.compile(r"\\beta\b"), "β"), (re.compile(r"\^2\b"), "²"))


def plain_heading(heading: str) -> str:
    """`heading` as a page without MathJax shows it: "Why divide by $\\sqrt{D}$" is "Why divide by √D"; LaTeX
    outside this table is kept as written, without its dollars."""
    def as_text(math: re.Match) -> str:
        text = math.group(1)
        for pattern, replacement in _MATH_AS_TEXT:
            text = pattern.sub(replacement, text)
        return text

    return re.sub(r"\$([^$]+)\$", as_text, heading)


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
            sections[key] = f"lesson {lesson}, {plain_heading(heading)}"
    return sections
