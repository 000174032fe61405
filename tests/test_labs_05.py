"""Lab 05 graded by real nbgrader: full marks for the solution, 0 for the untouched release, and each known
mistake loses exactly the points of the tests it should fail."""

from __future__ import annotations

from pathlib import Path

from lab_roundtrip import BlindStudents, NamedMistakes, RoundTrip, Validation

LAB = "05_assembling_gpt"
GPT_CELL = '''
class GPT(nn.Module):
    def __init__(self, config):
        super().__init__()
        c = self.config = config
        self.tok_emb = nn.Embedding(c.vocab_size, c.d_model)
        self.pos_emb = LearnedPositions(c.context_length, c.d_model) if c.position == "learned" else None
        self.rope = RotaryEmbedding(c.d_head, c.context_length, c.rope_theta) if c.position == "rope" else None
        self.blocks = nn.ModuleList(DecoderBlock(c) for _ in range(c.n_layers))
        self.final_norm = make_norm(c.norm, c.d_model, c.norm_eps, c.norm_bias)
        self.lm_head = nn.Linear(c.d_model, c.vocab_size, bias=c.lm_head_bias)
        if {tie}:
            self.lm_head.weight = self.tok_emb.weight

    def forward_hidden(self, idx):
        positions = torch.arange(idx.size(1))
        x = self.tok_emb(idx)
        if self.pos_emb is not None:
            x = x + self.pos_emb(positions)
        rope = self.rope(positions) if self.rope is not None else None
        for block in self.blocks:
            x = block(x, rope={rope})
        return {final}

    def forward(self, idx):
        return {head}
'''
RIGHT = {"tie": "c.tie_weights", "rope": "rope", "final": "self.final_norm(x)",
         "head": "self.lm_head(self.forward_hidden(idx))"}
GPT_TESTS = {"test_GPT", "test_GPT_rope", "test_GPT_hidden"}
# student -> ({solution cell grade_id: what they wrote}, test cells it must fail)
WRONG = {
    # forward returns the hidden states: logits (B, T, C), and an untied head whose parameters never load
    "no-output-projection": ({"GPT": GPT_CELL.format(**RIGHT | {"head": "self.forward_hidden(idx)"})},
                             GPT_TESTS),
    "no-final-norm": ({"GPT": GPT_CELL.format(**RIGHT | {"final": "x"})},
                      GPT_TESTS | {"test_GPT_forward_hidden", "test_GPT_forward_hidden_hidden"}),
    # learned positions (the visible test) work; every RoPE model fails
    "rope-not-passed": ({"GPT": GPT_CELL.format(**RIGHT | {"rope": "None"})},
                        {"test_GPT_rope", "test_GPT_hidden", "test_GPT_forward_hidden_hidden"}),
    # the logits are right (the head is loaded with the token table), but two matrices are counted
    "never-tied": ({"GPT": GPT_CELL.format(**RIGHT | {"tie": "False"})}, {"test_GPT_tying", "test_GPT_tying_hidden"}),
    # a copy of the token table, not the table itself (rasbt/LLMs-from-scratch#822): right logits, two matrices
    "tied-by-copy": ({"GPT": GPT_CELL.format(**RIGHT).replace(
        "self.lm_head.weight = self.tok_emb.weight",
        "self.lm_head.weight = nn.Parameter(self.tok_emb.weight.clone())")},
        {"test_GPT_tying", "test_GPT_tying_hidden"}),
}


# Written blind to the tests (issue 42), as written: student -> the test cells it fails.
BLIND_FILE = Path(__file__).with_name("lab05_blind.cells")
TYING_TESTS = {"test_GPT_tying", "test_GPT_tying_hidden"}
HIDDEN_STATE_TESTS = {"test_GPT_forward_hidden", "test_GPT_forward_hidden_hidden"}
ALL_TESTS = GPT_TESTS | TYING_TESTS | HIDDEN_STATE_TESTS | {"test_GPT_causal"}
ROPE_TESTS = {"test_GPT_rope", "test_GPT_hidden", "test_GPT_forward_hidden_hidden"}
BLIND_FAILS = {
    **dict.fromkeys(("tie-by-copy", "logits-from-tok-emb-untied-head"), TYING_TESTS),
    # the visible models are tied: only the hidden untied ones show the head it never has
    "always-tied": TYING_TESTS | {"test_GPT_hidden", "test_GPT_forward_hidden_hidden"},
    "no-final-norm": GPT_TESTS | HIDDEN_STATE_TESTS,
    "hidden-before-norm": HIDDEN_STATE_TESTS,  # right logits
    # every model with learned positions (a RoPE model has no table; the tying cases run no forward)
    "positions-are-token-ids": ALL_TESTS - TYING_TESTS - {"test_GPT_rope"},
    **dict.fromkeys(("rope-tables-full-context", "rope-not-passed"), ROPE_TESTS),
    # a plain list registers no block: every model has other parameters; a banned reference zeroes the piece
    **dict.fromkeys(("blocks-python-list", "subclass-course-gpt"), ALL_TESTS),
    "same-block-n-times": ALL_TESTS - {"test_GPT_causal"},  # one block N times is still causal
    "none-treated-as-learned": {"test_GPT_hidden"},  # no visible model is position='none'
    # no visible model has an output bias
    "lm-head-never-bias": {"test_GPT_hidden", "test_GPT_forward_hidden_hidden", "test_GPT_tying_hidden"},
    "softmax-output": GPT_TESTS,
}


# case -> {student (of WRONG, or blind): what the case's message says to it}
SAYS = {
    "05.GPT.tying": {
        "tied-by-copy": "lm_head.weight is a copy of tok_emb.weight",
    },
}

# the lab's points; nbgrader validate on a student: the cells it reports failed, the first failed case, its message
TOTAL, VALIDATE = 16, Validation("no-output-projection", 2, "05.GPT.visible",
                                 ("(2, 5, 32), expected (B, T, V) = (2, 5, 100)", "the output projection is missing"))


class TestLab05(RoundTrip, NamedMistakes, BlindStudents):
    """Lab 05's round trip and in-process checks, from the tables above."""
