"""Lab 03 graded by real nbgrader: full marks for the solution, 0 for the untouched release, and each known
mistake loses exactly the points of the tests it should fail."""

from __future__ import annotations

from lab_roundtrip import RoundTrip, Validation

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
}

class TestLab03(RoundTrip):
    LAB = LAB
    WRONG = WRONG
    TOTAL = 20
    VALIDATE = Validation('rope-on-v', 1, (
        'check("03.MultiHeadAttention.rope", MultiHeadAttention)',
        "RoPE is applied to v as well",
    ))
