"""Lab 06 graded by real nbgrader: full marks for the solution, 0 for the untouched release, and each known
mistake loses exactly the points of the tests it should fail."""

from __future__ import annotations

from pathlib import Path

import pytest
from lab_roundtrip import BlindStudents, NamedMistakes, RoundTrip, Validation

LAB = "06_parameter_counting"
BREAKDOWN = '''
def parameter_breakdown(config):
    c, v, n, f = config.d_model, config.vocab_size, config.n_layers, config.hidden_width
    norm = {norm}
    attention = 4 * c * c + (4 * c if config.attn_bias else 0)
    if config.mlp == "swiglu":
        mlp = {swiglu} + (2 * f + c if config.mlp_bias else 0)
    else:
        mlp = 2 * c * f + (f + c if config.mlp_bias else 0)
    return {{
        "token_embedding": v * c,
        "position_embedding": {positions},
        "attention": n * attention,
        "mlp": n * mlp,
        "block_norms": n * 2 * norm,
        "final_norm": norm,
        "output_projection": {head} + (v if config.lm_head_bias else 0),
    }}
'''
RIGHT = {"norm": '2 * c if config.norm == "layernorm" and config.norm_bias else c', "swiglu": "3 * c * f",
         "positions": 'config.context_length * c if config.position == "learned" else 0',
         "head": "(0 if config.tie_weights else v * c)"}
# the count read off layers built on the meta device (no memory, the right numbers): no formula written
BUILT_ON_META = '''
import torch
from torch import nn


def parameter_breakdown(config):
    c, v, n, f = config.d_model, config.vocab_size, config.n_layers, config.hidden_width

    def count(*modules):
        return sum(p.numel() for m in modules for p in m.parameters())

    def norm():
        return nn.LayerNorm(c, bias=config.norm_bias) if config.norm == "layernorm" else nn.RMSNorm(c)

    with torch.device("meta"):
        attention = count(nn.Linear(c, 3 * c, bias=config.attn_bias), nn.Linear(c, c, bias=config.attn_bias))
        width = 2 * f if config.mlp == "swiglu" else f
        mlp = count(nn.Linear(c, width, bias=config.mlp_bias), nn.Linear(f, c, bias=config.mlp_bias))
        learned = config.position == "learned"
        return {
            "token_embedding": count(nn.Embedding(v, c)),
            "position_embedding": count(nn.Embedding(config.context_length, c)) if learned else 0,
            "attention": n * attention,
            "mlp": n * mlp,
            "block_norms": n * count(norm(), norm()),
            "final_norm": count(norm()),
            "output_projection": (0 if config.tie_weights else v * c) + (v if config.lm_head_bias else 0),
        }
'''
TOTALS = {"test_count_parameters", "test_count_parameters_published", "test_count_parameters_hidden"}  # the sum
# student -> ({solution cell grade_id: what they wrote}, test cells it must fail)
WRONG = {
    # seed-tiny and GPT-2 are tied, Llama-2 is not
    "always-untied": ({"parameter_breakdown": BREAKDOWN.format(**RIGHT | {"head": "v * c"})},
                      {"test_parameter_breakdown", "test_parameter_breakdown_gpt2", "test_parameter_breakdown_hidden"}
                      | TOTALS),
    # seed-tiny and Llama-2 use SwiGLU, GPT-2 does not
    "swiglu-two-matrices": ({"parameter_breakdown": BREAKDOWN.format(**RIGHT | {"swiglu": "2 * c * f"})},
                            {"test_parameter_breakdown", "test_parameter_breakdown_llama",
                             "test_parameter_breakdown_hidden"} | TOTALS),
    # only GPT-2 (and the seed's repo model) have LayerNorm with a bias
    "layernorm-without-bias": ({"parameter_breakdown": BREAKDOWN.format(**RIGHT | {"norm": "c"})},
                               {"test_parameter_breakdown_gpt2", "test_parameter_breakdown_hidden",
                                "test_count_parameters_published", "test_count_parameters_hidden"}),
    # RoPE (seed-tiny, Llama-2) and no positions have no table
    "positions-always-counted": (
        {"parameter_breakdown": BREAKDOWN.format(**RIGHT | {"positions": "config.context_length * c"})},
        {"test_parameter_breakdown", "test_parameter_breakdown_llama", "test_parameter_breakdown_hidden"} | TOTALS),
    "built-on-meta": ({"parameter_breakdown": BUILT_ON_META},
                      {"test_parameter_breakdown", "test_parameter_breakdown_gpt2", "test_parameter_breakdown_llama",
                       "test_parameter_breakdown_hidden"} | TOTALS),
    "total-counts-the-tied-head-twice": (
        {"count_parameters": "def count_parameters(config):\n    return sum(parameter_breakdown(config).values()) + "
                             "config.vocab_size * config.d_model"}, TOTALS),
    # a right breakdown whose cell checks it against the course's total (a stub in the graded kernel: the check
    # raises after the def): the scan sees gptcourse.count_parameters, the total's reference, which the breakdown
    # does not forbid (it is not built from the total), so only the total's cells are lost
    "breakdown-checked-against-the-course-total": (
        {"parameter_breakdown": BREAKDOWN.format(**RIGHT) + "\n\nfrom gptcourse import count_parameters as course_total"
                                "\n\nassert sum(parameter_breakdown(preset('gpt2-small')).values()) == "
                                "course_total(preset('gpt2-small'))\n"}, TOTALS),
    # the total as the sum of the course's breakdown: the breakdown's reference, which the total forbids too (the
    # sum of the reference breakdown is the reference total), so both pieces' cells are lost
    "total-sums-the-course-breakdown": (
        {"count_parameters": "import gptcourse\n\n\ndef count_parameters(config):\n"
                             "    return sum(gptcourse.parameter_breakdown(config).values())\n"},
        {"test_parameter_breakdown", "test_parameter_breakdown_gpt2", "test_parameter_breakdown_llama",
         "test_parameter_breakdown_hidden"} | TOTALS),
}


BREAKDOWNS = {"test_parameter_breakdown", "test_parameter_breakdown_gpt2", "test_parameter_breakdown_llama",
              "test_parameter_breakdown_hidden"}
HIDDEN = {"test_parameter_breakdown_hidden", "test_count_parameters_hidden"}
# Written blind to the tests (issue 42), as written, graded in-process (check_blind_student) and by nbgrader (the
# round trip): student -> the test cells
# it must fail. Before the fix swiglu-bias-F, d-ff-default-4C, ignores-lm-head-bias and
# total-hardcoded-published failed only hidden cases, with a message that named nothing (or, for the head's bias,
# not the config field), and no message named rmsnorm-with-bias (llama2-7b's blamed the attention biases),
# attn-one-bias or one-norm-per-block (gpt2-small's blamed LayerNorm's beta alone). builds-gpt-and-counts imports
# gptcourse.GPT, which the breakdown forbids and so does the total (it forbids every reference of the breakdown it
# sums), and imports-reference both pieces' references: the grader's scan zeroes both pieces.
BLIND_FILE = Path(__file__).with_name("lab06_blind.cells")
BLIND_FAILS = {
    "swiglu-as-two-matrices": BREAKDOWNS - {"test_parameter_breakdown_gpt2"} | TOTALS,
    "swiglu-bias-F": HIDDEN,
    "d-ff-default-4C": HIDDEN,
    "tied-counted-twice": BREAKDOWNS - {"test_parameter_breakdown_llama"} | TOTALS,
    "rmsnorm-with-bias": BREAKDOWNS - {"test_parameter_breakdown_gpt2"} | TOTALS,
    "rope-has-table": BREAKDOWNS - {"test_parameter_breakdown_gpt2"} | TOTALS,
    "attn-one-bias": BREAKDOWNS - {"test_parameter_breakdown_llama"} | TOTALS,  # Llama-2 has no attention biases
    "one-norm-per-block": BREAKDOWNS | TOTALS,
    "ignores-lm-head-bias": HIDDEN,
    "builds-gpt-and-counts": BREAKDOWNS | TOTALS,
    "imports-reference": BREAKDOWNS | TOTALS,
    "total-non-embedding": TOTALS - {"test_count_parameters"},  # seed-tiny has RoPE: no position table
    "total-hardcoded-published": {"test_count_parameters_hidden"},
    "total-ignores-breakdown-ties": TOTALS,
}


def test_every_config_the_lab_checks_has_a_key_and_value_head_per_query_head():
    """The lab's text gives attention four C x C matrices: no case's config is grouped-query (n_kv_heads)."""
    from gptcourse.grading import case_seed
    from gptcourse.grading.cases import registry

    configs = [config for case in registry().values() if case.id.startswith("06.")
               for config in case.inputs(case_seed(case))["configs"]]
    assert configs and all(config.kv_heads == config.n_heads for config in configs)


# case -> {student (of WRONG, or blind): what the case's message says to it}
SAYS = {
    "06.parameter_breakdown.visible": {
        "built-on-meta": "built layers (on the meta device or not) and counted their tensors",
    },
}

# the lab's points; nbgrader validate on a student: the cells it reports failed, the first failed case, its message
TOTAL, VALIDATE = 13, Validation("always-untied", 4, "06.parameter_breakdown.visible",
                                 "(+3,200 = V x d: untied output projection?")


class TestLab06(RoundTrip, NamedMistakes, BlindStudents):
    def test_the_visible_presets_have_their_published_totals(self):
        from gptcourse.grading import case_seed, get_case

        case = get_case("06.count_parameters.published")
        totals = case.expected(case.inputs(case_seed(case)))
        assert {k: totals[k] for k in ("0.total", "1.total")} == {"0.total": 124_439_808, "1.total": 6_738_415_616}
        case = get_case("06.count_parameters.visible")
        totals = case.expected(case.inputs(case_seed(case)))
        assert {k: totals[k] for k in ("0.total", "1.total")} == {"0.total": 24_096, "1.total": 27_296}

    @pytest.mark.slow
    def test_the_graders_records_name_each_count_mistake_by_its_key(self, course, scores):
        """The judge's verdict records in the autograded notebooks, as `gptcourse report` reads them, key each planted
        count mistake (`checks.check_parameter_count`'s causes): each student under its mistake's key."""
        from gptcourse.grading.classroom import class_report

        named = {m.key: set(m.students) for m in class_report.build(course.root, LAB).mistakes()}
        planted = {"params.untied_head": {"always-untied", "total-counts-the-tied-head-twice"},
                   "params.swiglu_two_matrices": {"swiglu-two-matrices"},
                   "params.layernorm_no_beta": {"layernorm-without-bias"},
                   "params.position_table_counted": {"positions-always-counted"},
                   "06.counted_built_tensors": {"built-on-meta"}}
        assert {key: students & named.get(key, set()) for key, students in planted.items()} == planted, named
