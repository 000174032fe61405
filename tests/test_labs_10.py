"""Lab 10 graded by real nbgrader: full marks for the solution, 0 for the untouched release, and each known
mistake loses exactly the points of the tests it should fail."""

from __future__ import annotations

from pathlib import Path

from lab_roundtrip import BlindStudents, NamedMistakes, RoundTrip, Validation
from reference_routes import copied_references

LAB = "10_finetuning_and_rewards"
POOL = '''
def last_real_token(hidden, attention_mask):
    b, t, _ = hidden.shape
    last = {last}
    return hidden[torch.arange(b), last]
'''
LABELS = '''
def response_labels(input_ids, prompt_lengths, attention_mask):
    index = attention_mask.cumsum(dim=-1) - 1
    keep = (index {keep} prompt_lengths[:, None]) & attention_mask.bool()
    labels = input_ids.masked_fill(~keep, -100)
    return {ret}
'''
RIGHT_LABELS = {"keep": ">=", "ret": "labels"}
LORA = '''
class LoRALinear(nn.Module):
    def __init__(self, base, rank, alpha):
        super().__init__()
        self.base = {freeze}
        self.scaling = alpha / rank
        self.A = nn.Parameter(torch.randn(rank, base.in_features) / math.sqrt(base.in_features))
        self.B = nn.Parameter(torch.{b_init}(base.out_features, rank))

    def forward(self, x):
        return self.base(x) + (x @ self.A.T @ self.B.T) * self.scaling
'''
RIGHT_LORA = {"freeze": "base.requires_grad_(False)", "b_init": "zeros"}
# causal and real keys, without each position seeing itself: a left-padded row's pad queries see nothing (NaN)
PAD_QUERY_SEES_NOTHING = '''
def padding_mask(attention_mask):
    t = attention_mask.size(1)
    return torch.ones(t, t, dtype=torch.bool).tril() & attention_mask.bool()[:, None, None, :]
'''
BRADLEY_TERRY = "def bradley_terry_loss(chosen, rejected):\n    return {loss}"
BT_TESTS = {"test_bradley_terry_loss_large", "test_bradley_terry_loss_hidden"}
# student -> ({solution cell grade_id: what they wrote}, test cells it must fail)
WRONG = {
    "pool-position-minus-one": ({"last_real_token": POOL.format(last="torch.full((b,), t - 1)")},
                                {"test_last_real_token", "test_last_real_token_hidden"}),  # left-padded: -1 is real
    "pool-mask-sum": ({"last_real_token": POOL.format(last="attention_mask.sum(-1) - 1")},
                      {"test_last_real_token_left", "test_last_real_token_hidden"}),
    "labels-mask-the-response": ({"response_labels": LABELS.format(**RIGHT_LABELS | {"keep": "<"})},
                                 {"test_response_labels", "test_response_labels_left",
                                  "test_response_labels_hidden"}),
    # pre-shifted for the loss, which shifts again
    "labels-shifted": ({"response_labels": LABELS.format(**RIGHT_LABELS | {
        "ret": "torch.cat([labels[:, 1:], torch.full_like(labels[:, :1], -100)], dim=1)"})},
        {"test_response_labels", "test_response_labels_left", "test_response_labels_hidden"}),
    "lora-b-random": ({"LoRALinear": LORA.format(**RIGHT_LORA | {"b_init": "randn"})},
                      {"test_LoRALinear", "test_LoRALinear_sequence", "test_LoRALinear_hidden"}),
    "lora-base-bias-trainable": ({"LoRALinear": LORA.format(**RIGHT_LORA | {
        "freeze": "base\n        base.weight.requires_grad_(False)"})},
        {"test_LoRALinear", "test_LoRALinear_sequence", "test_LoRALinear_hidden"}),
    # right for small rewards; inf once sigmoid(d) rounds to 0
    "bt-naive-log-sigmoid": ({"bradley_terry_loss": BRADLEY_TERRY.format(
        loss="-torch.log(torch.sigmoid(chosen - rejected)).mean()")}, BT_TESTS),
    "bt-log-plus-eps": ({"bradley_terry_loss": BRADLEY_TERRY.format(
        loss="-torch.log(torch.sigmoid(chosen - rejected) + 1e-8).mean()")}, BT_TESTS),
    "bt-mean-before-log-sigmoid": ({"bradley_terry_loss": BRADLEY_TERRY.format(
        loss="-F.logsigmoid((chosen - rejected).mean())")}, {"test_bradley_terry_loss", *BT_TESTS}),
    # right for an unpadded row (hidden_single) only: a right-padded row's pads lose their own key
    "mask-pad-query-sees-nothing": ({"padding_mask": PAD_QUERY_SEES_NOTHING},
                                    {"test_padding_mask", "test_padding_mask_left", "test_padding_mask_hidden"}),
    # rank-stabilised LoRA's alpha / sqrt(rank): right only at rank 1 (none of this student's hidden cases)
    "lora-rslora-scale": ({"LoRALinear": LORA.format(**RIGHT_LORA).replace("alpha / rank", "alpha / math.sqrt(rank)")},
                          {"test_LoRALinear", "test_LoRALinear_sequence", "test_LoRALinear_hidden"}),
    # lesson 12's tiled attention builds the padding mask of one tile; lesson 13's dpo_loss with zero reference
    # log-probabilities and beta 1 is the Bradley-Terry loss
    "mask-by-tiled-attention": ({"padding_mask": '''
from gptcourse.model.tiled_attention import _allowed

def padding_mask(attention_mask):
    t = attention_mask.size(1)
    return _allowed((0, t, 0, t), 0, True, None, attention_mask, attention_mask.device)[:, 0]  # (B, 1, T, T)
'''}, {"test_padding_mask", "test_padding_mask_left", "test_padding_mask_hidden"}),
    "bt-by-dpo-loss": ({"bradley_terry_loss": '''
from gptcourse import dpo_loss

def bradley_terry_loss(chosen, rejected):
    zero = torch.zeros_like(chosen)
    return dpo_loss(chosen, rejected, zero, zero, beta=1.0).loss
'''}, {"test_bradley_terry_loss", *BT_TESTS}),
    **copied_references(LAB),  # the reference copied by routes the scan does not follow
}


# Written blind to the tests (the blind students of labs 06-11), checked in-process against every test cell, hidden
# included, and by nbgrader in the round trip below. Before the fixes
# lora-merged-weight passed every cell, and lrt-gather-wrong-axis, bt-hinge-clamp and rl-pads-kept's left case (the
# table's pads-kept labels masked a left pad once the prompt was past it) got bare numeric diffs.
BLIND_FILE = Path(__file__).with_name("lab10_blind.cells")
MASK = frozenset({"test_padding_mask", "test_padding_mask_left", "test_padding_mask_hidden"})
POOL = frozenset({"test_last_real_token", "test_last_real_token_left", "test_last_real_token_hidden"})
LABEL = frozenset({"test_response_labels", "test_response_labels_left", "test_response_labels_hidden"})
BT = frozenset({"test_bradley_terry_loss", "test_bradley_terry_loss_large", "test_bradley_terry_loss_hidden"})
LORA_CELLS = frozenset({"test_LoRALinear", "test_LoRALinear_sequence", "test_LoRALinear_hidden"})
BLIND_FAILS = {
    **dict.fromkeys(("pm-no-diagonal", "pm-no-causal", "pm-masks-queries", "pm-additive-float", "pm-no-head-axis"),
                    MASK),
    # right with left padding (the last position is real there), and with right padding (the sum is the length)
    "lrt-position-minus-one": POOL - {"test_last_real_token_left"},
    "lrt-sum-minus-one": POOL - {"test_last_real_token"},
    **dict.fromkeys(("lrt-argmax-first", "lrt-gather-wrong-axis"), POOL),
    "rl-absolute-position": LABEL - {"test_response_labels"},  # the right-padded rows start at position 0
    **dict.fromkeys(("rl-pads-kept", "rl-prompt-one-short", "rl-shifted"), LABEL),
    **dict.fromkeys(("bt-log-sigmoid", "bt-hinge-clamp"), BT - {"test_bradley_terry_loss"}),  # ordinary rewards
    **dict.fromkeys(("bt-swapped", "bt-sum"), BT),
    **dict.fromkeys(("lora-no-scale", "lora-scale-alpha-only", "lora-not-frozen", "lora-A-zero-B-random",
                     "lora-both-zero", "lora-merged-weight"), LORA_CELLS),
}


# case -> {student (of WRONG, or blind): what the case's message says to it}
SAYS = {
    "10.last_real_token.visible": {
        "pool-position-minus-one": "position -1 was read",
    },
    "10.last_real_token.left": {
        "pool-mask-sum": "the last real token was taken at attention_mask.sum(-1) - 1",
    },
    "10.response_labels.visible": {
        "labels-mask-the-response": "the response is masked instead of the prompt",
        "labels-shifted": "the labels are shifted by one",
    },
    "10.LoRALinear.visible": {
        "lora-b-random": "B must start at zero",
        "lora-base-bias-trainable": "the base layer is trainable (base.bias)",
        "lora-rslora-scale": "the update is scaled by alpha / sqrt(rank) = 2.82843",
    },
    "10.bradley_terry_loss.large": {
        "bt-naive-log-sigmoid": "Use F.logsigmoid(d)",
        "bt-log-plus-eps": "log(sigmoid(d) + 1e-08) caps each pair's loss",
    },
    "10.bradley_terry_loss.visible": {
        "bt-mean-before-log-sigmoid": "the differences were averaged before the log-sigmoid",
    },
    "10.padding_mask.left": {
        "mask-pad-query-sees-nothing": "a pad query sees nothing at all",
    },
}

# the lab's points; nbgrader validate on a student: the cells it reports failed, the first failed case, its message
TOTAL, VALIDATE = 32, Validation("pool-position-minus-one", 1, "10.last_real_token.visible", "position -1 was read")


class TestLab10(RoundTrip, NamedMistakes, BlindStudents):
    """Lab 10's round trip and in-process checks, from the tables above."""
