"""Lab 03 graded by real nbgrader: full marks for the solution, 0 for the untouched release, and each known
mistake loses exactly the points of the tests it should fail."""

from __future__ import annotations

from pathlib import Path

from lab_roundtrip import BlindStudents, RoundTrip, Validation

LAB = "03_multi_head_attention_and_rope"
MHA = '''
class MultiHeadAttention(nn.Module):
    def __init__(self, d_model, n_heads):
        super().__init__()
        self.n_heads = n_heads
        self.qkv = nn.Linear(d_model, 3 * d_model)
        self.out = nn.Linear(d_model, d_model)

    def forward(self, x, rope=None):
        q, k, v = (split_heads(z, self.n_heads) for z in self.qkv(x).chunk(3, dim=-1))
        if rope is not None:
            q, k, v = apply_rope(q, *rope), apply_rope(k, *rope), apply_rope(v, *rope)
        return self.out(merge_heads(attention(q, k, v)[0]))
'''
ROPE_TESTS = {"test_apply_rope", "test_apply_rope_hidden"}
MHA_VALUES = {"test_MultiHeadAttention", "test_MultiHeadAttention_rope", "test_MultiHeadAttention_hidden"}
# student -> ({solution cell grade_id: what they wrote}, test cells it must fail)
WRONG = {
    # RoPE on v still gives a causal layer, and leaves the no-RoPE test untouched
    "rope-on-v": ({"MultiHeadAttention": MHA}, {"test_MultiHeadAttention_rope", "test_MultiHeadAttention_hidden"}),
    # without the transpose, merging mixes positions: the causal probe sees it too
    "merge-without-transpose": ({"merge_heads": '''
def merge_heads(y):
    b, h, t, d = y.shape
    return y.reshape(b, t, h * d)
'''}, {"test_merge_heads", "test_merge_heads_hidden", "test_MultiHeadAttention_causal"} | MHA_VALUES),
    "split-with-one-view": ({"split_heads": '''
def split_heads(x, n_heads):
    b, t, c = x.shape
    return x.view(b, n_heads, t, c // n_heads)
'''}, {"test_split_heads", "test_split_heads_hidden", "test_MultiHeadAttention_causal"} | MHA_VALUES),
    "interleaved-rope": ({"apply_rope": '''
def apply_rope(x, cos, sin):
    rotated = torch.stack([-x[..., 1::2], x[..., 0::2]], dim=-1).flatten(-2)  # pairs (2i, 2i + 1)
    return x * cos + rotated * sin
'''}, ROPE_TESTS | {"test_MultiHeadAttention_rope", "test_MultiHeadAttention_hidden"}),
    "interleaved-tables": ({"rope_tables": '''
def rope_tables(d_head, T, theta=10000.0):
    angles = torch.outer(torch.arange(T), theta ** (-torch.arange(0, d_head, 2) / d_head))
    angles = angles.repeat_interleave(2, dim=-1)
    return angles.cos(), angles.sin()
'''}, {"test_rope_tables", "test_rope_tables_hidden"}),
    # transformers' own RoPE: no forbidden name lists its copies in dozens of model modules, the import allowlist
    # zeroes the piece whose cell imports it (`forbidden.ALLOWED_PACKAGES`); the attention runs that working RoPE
    "rope-from-transformers": ({"apply_rope": '''
from transformers.models.llama.modeling_llama import apply_rotary_pos_emb

def apply_rope(x, cos, sin):
    return apply_rotary_pos_emb(x, x, cos, sin, unsqueeze_dim=0)[0]
'''}, ROPE_TESTS),
}

# Written blind to the tests (issue 42), as written: student -> the test cells it fails, each case of each cell run
# in-process (`check_blind_student`) and each cell by nbgrader (the round trip). A wrong split, merge or RoPE fails the
# MultiHeadAttention that uses it too. Before issue 42 rope-own-tables passed every visible case (the visible tables
# were of positions 0..T-1), tables-theta-hardcoded got a message that named nothing, and so did
# mha-qkv-per-head-layout, mha-one-wide-head and, but for the causal case, mha-sdpa-not-causal.
# rope-calls-gptcourse and mha-wraps-gptcourse-functions call the references the lab forbids: the grader's scan of
# the cells zeroes every piece that forbids them (`forbidden.find_forbidden`), apply_rope and MultiHeadAttention.
BLIND_FILE = Path(__file__).with_name("lab03_blind.cells")
MHA_TESTS = MHA_VALUES | {"test_MultiHeadAttention_causal"}
TABLE_TESTS = {"test_rope_tables", "test_rope_tables_hidden"}
MHA_ROPE = {"test_MultiHeadAttention_rope", "test_MultiHeadAttention_hidden"}
BLIND_FAILS = {
    "split-view-straight-to-heads": {"test_split_heads", "test_split_heads_hidden"} | MHA_TESTS,
    "split-strided-heads": {"test_split_heads", "test_split_heads_hidden"} | MHA_VALUES,
    **dict.fromkeys(("merge-view-after-transpose", "merge-no-transpose"),
                    {"test_merge_heads", "test_merge_heads_hidden"} | MHA_TESTS),
    **dict.fromkeys(("tables-interleaved-layout", "tables-exponent-i-over-D", "tables-positions-from-one",
                     "tables-half-width"), TABLE_TESTS),
    "tables-theta-hardcoded": {"test_rope_tables_hidden"},  # only the hidden tables have another theta
    **dict.fromkeys(("rope-rotate-half-sign", "rope-adjacent-pairs"), ROPE_TESTS | MHA_ROPE),
    "rope-own-tables": ROPE_TESTS,
    **dict.fromkeys(("mha-rope-on-values", "mha-rope-only-q"), MHA_ROPE),
    **dict.fromkeys(("mha-qkv-per-head-layout", "mha-no-output-projection", "mha-one-wide-head"), MHA_VALUES),
    "mha-sdpa-not-causal": MHA_TESTS,
    **dict.fromkeys(("rope-calls-gptcourse", "mha-wraps-gptcourse-functions"), ROPE_TESTS | MHA_TESTS),
}


# the lab's points; nbgrader validate on a student: the cells it reports failed, the first failed case, its message
TOTAL, VALIDATE = 20, Validation("rope-on-v", 1, "03.MultiHeadAttention.rope", "RoPE is applied to v as well")


class TestLab03(RoundTrip, BlindStudents):
    """Lab 03's round trip and in-process checks, from the tables above."""
