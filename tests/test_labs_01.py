"""Lab 01 graded by real nbgrader: full marks for the solution, 0 for the untouched release, and each known
mistake loses exactly the points of the tests it should fail."""

from __future__ import annotations

from pathlib import Path

import pytest
from lab_roundtrip import BlindStudents, NamedMistakes, RoundTrip, Validation

LAB = "01_tokens_and_embeddings"
EMBEDDING = '''
class TokenAndPositionEmbedding(nn.Module):
    def __init__(self, vocab_size, context_length, d_model):
        super().__init__()
        self.tok_emb = nn.Embedding(vocab_size, d_model)
        self.pos_emb = nn.Embedding(context_length, d_model)

    def forward(self, idx):
        return {body}
'''
# student -> ({solution cell grade_id: what they wrote}, test cells it must fail)
WRONG = {
    "tokenizer-keyerror-on-unknown": ({"CharTokenizer": '''
class CharTokenizer:
    def __init__(self, text):
        self.chars = sorted(set(text))
        self.stoi = {ch: i for i, ch in enumerate(self.chars)}
        self.vocab_size = len(self.chars)

    def encode(self, s):
        return [self.stoi[ch] for ch in s]  # an unknown character: a bare KeyError

    def decode(self, ids):
        return "".join(self.chars[i] for i in ids)
'''}, {"test_CharTokenizer", "test_CharTokenizer_hidden"}),
    "no-positions": ({"TokenAndPositionEmbedding": EMBEDDING.format(body="self.tok_emb(idx)")},
                     {"test_TokenAndPositionEmbedding", "test_TokenAndPositionEmbedding_hidden"}),
    "positions-from-1": ({"TokenAndPositionEmbedding": EMBEDDING.format(
        body="self.tok_emb(idx) + self.pos_emb(torch.arange(1, idx.size(1) + 1))")},
        {"test_TokenAndPositionEmbedding", "test_TokenAndPositionEmbedding_hidden"}),
    "one-hot-without-num-classes": ({"one_hot_embed": '''
def one_hot_embed(ids, table):
    return nn.functional.one_hot(ids).float() @ table  # width max(ids) + 1, not V
'''}, {"test_one_hot_embed", "test_one_hot_embed_hidden"}),
    "one-hot-float64": ({"one_hot_embed": '''
def one_hot_embed(ids, table):
    return nn.functional.one_hot(ids, table.size(0)).double() @ table
'''}, {"test_one_hot_embed", "test_one_hot_embed_hidden"}),
    # the lookup the piece is there to show is a product: same embeddings, no one-hot matrix (counted by TensorsMade)
    "one-hot-lookup": ({"one_hot_embed": "def one_hot_embed(ids, table):\n    return table[ids]\n"},
                       {"test_one_hot_embed", "test_one_hot_embed_hidden"}),
}


# Written blind to the tests (issue 42), as written: student -> the test cells it fails, each case of each cell run
# in-process (`check_blind_student`) and each cell by nbgrader (the round trip). Before issue 42
# onehot-num-classes-default passed every visible case (the visible batch held the last id), onehot-float32-cast
# every case (no table was float64), and the messages for tok-unsorted-set, emb-positions-over-batch-axis and
# emb-scaled-by-sqrt-d named nothing, nor did the raw IndexError of emb-positions-are-token-ids and broadcast error
# of emb-full-context-positions.
# emb-dropout-added is left out: the lab's modules are graded in eval mode, where its dropout is the identity,
# and it adds no parameter (nanoGPT drops out its embeddings too).
BLIND_FILE = Path(__file__).with_name("lab01_blind.cells")
TOKENIZER_TESTS = {"test_CharTokenizer", "test_CharTokenizer_hidden"}
ONE_HOT_TESTS = {"test_one_hot_embed", "test_one_hot_embed_hidden"}
EMBEDDING_TESTS = {"test_TokenAndPositionEmbedding", "test_TokenAndPositionEmbedding_hidden"}
BLIND_FAILS = {
    **dict.fromkeys(("tok-unsorted-set", "tok-first-appearance-order", "tok-unknown-maps-to-zero", "tok-bare-keyerror",
                     "tok-error-does-not-name-char", "tok-vocab-size-len-text", "tok-decode-joins-with-space"),
                    TOKENIZER_TESTS),
    **dict.fromkeys(("onehot-num-classes-default", "onehot-indexes-table", "onehot-f-embedding"), ONE_HOT_TESTS),
    "onehot-float32-cast": {"test_one_hot_embed_hidden"},  # only the float64 table shows it
    **dict.fromkeys(("emb-positions-are-token-ids", "emb-positions-over-batch-axis", "emb-full-context-positions",
                     "emb-scaled-by-sqrt-d"), EMBEDDING_TESTS),
}


# case -> {student (of WRONG, or blind): what the case's message says to it}
SAYS = {
    "01.one_hot_embed.visible": {
        "one-hot-lookup": "no (2, 4, 6) one-hot matrix was made: the rows were looked up",
    },
    "01.one_hot_embed.hidden_sizes": {
        # the largest ids need not occur (jwcalder/GraphLearning#12, pytorch/vision#7173)
        "one-hot-without-num-classes": "one_hot(ids) without num_classes makes max(ids) + 1",
    },
}

# the lab's points; nbgrader validate on a student: the cells it reports failed, the first failed case, its message
TOTAL, VALIDATE = 11, Validation("no-positions", 1, "01.TokenAndPositionEmbedding.visible", "the positions are missing")


class TestLab01(RoundTrip, NamedMistakes, BlindStudents):
    @pytest.mark.slow
    def test_feedback_shows_the_diagnostic_and_export_has_the_scores(self, course, scores):
        course.nbgrader("generate_feedback", LAB)
        feedback = (course.root / "grading" / "feedback" / "no-positions" / LAB / f"{LAB}.html").read_text()
        assert "the positions are missing" in feedback and "Traceback (most recent call last)" not in feedback
        # each piece's verdict, nbgrader's comment on its solution cell (steps/verdict_comments.py), under the answer
        assert "verdict on <code>TokenAndPositionEmbedding</code>: 0 of " in feedback
        assert "Failed: <code>01.TokenAndPositionEmbedding.visible</code>" in feedback
        assert "verdict on <code>CharTokenizer</code>: all " in feedback
        course.nbgrader("export")
        rows = (course.root / "grading" / "grades.csv").read_text().splitlines()
        header = rows[0].split(",")
        totals = {r["student_id"]: (float(r["score"]), float(r["max_score"]))
                  for r in (dict(zip(header, row.split(","), strict=True)) for row in rows[1:])
                  if r["assignment"] == LAB}
        assert totals["solution"] == (11.0, 11.0) and totals["untouched"] == (0.0, 11.0)
        assert totals["no-positions"] == (6.0, 11.0)
