"""Lab 04 graded by real nbgrader: full marks for the solution, 0 for the untouched release, and each known
mistake loses exactly the points of the tests it should fail."""

from __future__ import annotations

from pathlib import Path

import pytest
from lab_roundtrip import BlindStudents, NamedMistakes, RoundTrip, Validation

LAB = "04_decoder_block"
RMSNORM = '''
class RMSNorm(nn.Module):
    def __init__(self, d, eps=1e-6):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(d))

    def forward(self, x):
        return {body}
'''
SWIGLU = '''
class SwiGLU(nn.Module):
    def __init__(self, d_model, d_ff):
        super().__init__()
        self.w_in = nn.Linear(d_model, 2 * d_ff, bias={bias})
        self.w_out = nn.Linear(d_ff, d_model, bias={bias})

    def forward(self, x):
        gate, value = self.w_in(x).chunk(2, dim=-1)
        return self.w_out({hidden})
'''
RIGHT_SWIGLU = {"bias": False, "hidden": "nn.functional.silu(gate) * value"}
BLOCK_VALUES = {"test_DecoderBlock", "test_DecoderBlock_rope", "test_DecoderBlock_hidden"}
# a DecoderBlock with the right parts and another forward
BLOCK = '''
class DecoderBlock(nn.Module):
    def __init__(self, d_model, n_heads, d_ff):
        super().__init__()
        self.norm1 = RMSNorm(d_model)
        self.attn = MultiHeadAttention(d_model, n_heads)
        self.norm2 = RMSNorm(d_model)
        self.mlp = SwiGLU(d_model, d_ff)

    def forward(self, x, rope=None):
        {forward}
'''
# student -> ({solution cell grade_id: what they wrote}, test cells it must fail)
WRONG = {
    # the block uses the student's norm and MLP, so their mistakes show there too; none of them breaks causality
    "rmsnorm-subtracts-mean": ({"RMSNorm": RMSNORM.format(
        body="(x - x.mean(-1, keepdim=True)) / (x - x.mean(-1, keepdim=True)).pow(2).mean(-1, keepdim=True)"
             ".add(self.eps).sqrt() * self.weight")}, {"test_RMSNorm", "test_RMSNorm_hidden"} | BLOCK_VALUES),
    # rsqrt is 1 / sqrt already (mosaicml/llm-foundry#371): the scale is inverted, and the block goes wrong too
    "divides-by-rsqrt": ({"RMSNorm": RMSNORM.format(
        body="x / torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps) * self.weight")},
        {"test_RMSNorm", "test_RMSNorm_hidden"} | BLOCK_VALUES),
    # the visible case's tiny last token and the hidden tiny-input test see where eps went
    "eps-outside-sqrt": ({"RMSNorm": RMSNORM.format(
        body="x / (x.pow(2).mean(-1, keepdim=True).sqrt() + self.eps) * self.weight")},
        {"test_RMSNorm", "test_RMSNorm_hidden"}),
    "gate-value-swapped": ({"SwiGLU": SWIGLU.format(**RIGHT_SWIGLU | {"hidden": "nn.functional.silu(value) * gate"})},
                           {"test_SwiGLU", "test_SwiGLU_hidden"} | BLOCK_VALUES),
    # the SiLU around the product (Nijikadesu/breakdown-minimind#3)
    "silu-of-product": ({"SwiGLU": SWIGLU.format(**RIGHT_SWIGLU | {"hidden": "nn.functional.silu(gate * value)"})},
                        {"test_SwiGLU", "test_SwiGLU_hidden"} | BLOCK_VALUES),
    # biases change the parameter names and count: every test that builds a SwiGLU fails, the count says why
    "swiglu-with-biases": ({"SwiGLU": SWIGLU.format(**RIGHT_SWIGLU | {"bias": True})},
                           {"test_SwiGLU", "test_SwiGLU_hidden", "test_DecoderBlock_causal", "test_DecoderBlock_params"}
                           | BLOCK_VALUES),
    # x = norm(x); x = x + sublayer(x) (Howuhh/faster-trajectory-transformer#3, tracel-ai/burn#1056)
    "residual-from-normed": ({"DecoderBlock": BLOCK.format(forward="""x = self.norm1(x)
        x = x + self.attn(x, rope=rope)
        x = self.norm2(x)
        return x + self.mlp(x)""")}, BLOCK_VALUES),
    "post-norm": ({"DecoderBlock": BLOCK.format(forward="""x = self.norm1(x + self.attn(x, rope=rope))
        return self.norm2(x + self.mlp(x))""")}, BLOCK_VALUES),
    # LayerNorm of [x, -x] (mean 0) is RMSNorm of x: RMSNorm forbids torch's layer norms like its rms_norm; the
    # block, which wires this norm in, keeps its points (it forbids only torch's RMSNorm)
    "rmsnorm-via-layer-norm": ({"RMSNorm": "import torch.nn.functional as F\n" + RMSNORM.format(
        body="F.layer_norm(torch.cat([x, -x], -1), (2 * x.shape[-1],), eps=self.eps)[..., :x.shape[-1]] "
             "* self.weight")}, {"test_RMSNorm", "test_RMSNorm_hidden"}),
    # the same trick with a group norm of one group over the 2C features (RMSNorm forbids every torch norm)
    "rmsnorm-via-group-norm": ({"RMSNorm": "import torch.nn.functional as F\n" + RMSNORM.format(
        body="F.group_norm(torch.cat([x, -x], -1).reshape(-1, 2 * x.shape[-1]), 1, eps=self.eps)"
             ".reshape(*x.shape[:-1], -1)[..., :x.shape[-1]] * self.weight")}, {"test_RMSNorm", "test_RMSNorm_hidden"}),
}


# Written blind to the tests (issue 42), as written: student -> the test cells it fails (the block runs the student's
# norm and MLP, so their mistakes fail it too; a banned reference zeroes the piece and the block that uses it).
BLIND_FILE = Path(__file__).with_name("lab04_blind.cells")
# case -> {student (of WRONG, or blind): what the case's message says to it}
SAYS = {
    "04.RMSNorm.visible": {
        "divides-by-rsqrt": "x is divided by torch.rsqrt(mean(x^2) + eps)",
    },
    "04.DecoderBlock.visible": {
        "residual-from-normed": "the residual adds the normalised x",
    },
    "04.SwiGLU.visible": {
        "silu-of-product": "SiLU is applied to the product, silu(gate * value)",
    },
}

NORM_TESTS, MLP_TESTS = {"test_RMSNorm", "test_RMSNorm_hidden"}, {"test_SwiGLU", "test_SwiGLU_hidden"}
BLOCK_TESTS = BLOCK_VALUES | {"test_DecoderBlock_causal", "test_DecoderBlock_params"}
BLIND_FAILS = {
    **dict.fromkeys(("rms-subtracts-mean", "rms-l2-norm-no-mean", "rms-gemma-one-plus-weight"),
                    NORM_TESTS | BLOCK_VALUES),
    "rms-eps-outside-sqrt": NORM_TESTS,  # only tiny inputs show it; the block's are not
    "rms-over-time-axis": NORM_TESTS | BLOCK_VALUES | {"test_DecoderBlock_causal"},  # a norm over T mixes positions
    **dict.fromkeys(("rms-adds-bias", "rms-f-rms-norm", "rms-subclass-gptcourse"), NORM_TESTS | BLOCK_TESTS),
    **dict.fromkeys(("swiglu-halves-swapped", "swiglu-gelu", "swiglu-sigmoid-gate", "swiglu-interleaved-split",
                     "swiglu-silu-of-product"), MLP_TESTS | BLOCK_VALUES),
    # the same count in other names: the causal case checks the names too, the count by component passes
    "swiglu-three-linears": MLP_TESTS | BLOCK_VALUES | {"test_DecoderBlock_causal"},
    **dict.fromkeys(("block-post-norm", "block-mlp-without-residual", "block-residual-from-normed",
                     "block-norm1-twice", "block-parallel-sublayers"), BLOCK_VALUES),
    "block-drops-rope": BLOCK_VALUES - {"test_DecoderBlock"},  # the visible block has no RoPE
    # nn.LayerNorm in the block: RMSNorm forbids it (LayerNorm of [x, -x] is RMSNorm), and the scan costs every piece
    # that forbids a name wherever it is used, so the norm's cells too; the block fails on LayerNorm's bias
    "block-torch-layernorm": NORM_TESTS | BLOCK_TESTS,
    "rms-fused-kernel": NORM_TESTS | BLOCK_TESTS,  # torch._fused_rms_norm, the op behind F.rms_norm: banned
}


# the lab's points; nbgrader validate on a student: the cells it reports failed, the first failed case, its message
TOTAL, VALIDATE = 18, Validation("rmsnorm-subtracts-mean", 3, "04.RMSNorm.visible",
                                 "it subtracts the mean (that is LayerNorm)")


class TestLab04(RoundTrip, NamedMistakes, BlindStudents):
    @pytest.mark.slow
    def test_the_parameter_count_names_the_biases(self, course, scores):
        cell = self.autograded_cell(course, "swiglu-with-biases", "test_DecoderBlock_params")
        message = " ".join(" ".join(out.traceback) for out in cell.outputs if out.output_type == "error").split()
        message = " ".join(message)  # the message is wrapped for display
        assert "mlp has 6,304, expected 6,144 (+160: SwiGLU's linear" in message
        assert "use bias=False" in message
