"""Lab 10 graded by real nbgrader: full marks for the solution, 0 for the untouched release, and each known
mistake loses exactly the points of the tests it should fail."""

from __future__ import annotations

from lab_roundtrip import RoundTrip, Validation

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
    return input_ids.masked_fill(~keep, -100)
'''
LORA = '''
class LoRALinear(nn.Module):
    def __init__(self, base, rank, alpha):
        super().__init__()
        self.base = base.requires_grad_(False)
        self.scaling = alpha / rank
        self.A = nn.Parameter(torch.randn(rank, base.in_features) / math.sqrt(base.in_features))
        self.B = nn.Parameter(torch.{b_init}(base.out_features, rank))

    def forward(self, x):
        return self.base(x) + (x @ self.A.T @ self.B.T) * self.scaling
'''
# student -> ({solution cell grade_id: what they wrote}, test cells it must fail)
WRONG = {
    "pool-position-minus-one": ({"last_real_token": POOL.format(last="torch.full((b,), t - 1)")},
                                {"test_last_real_token", "test_last_real_token_hidden"}),  # left-padded: -1 is real
    "pool-mask-sum": ({"last_real_token": POOL.format(last="attention_mask.sum(-1) - 1")},
                      {"test_last_real_token_left", "test_last_real_token_hidden"}),
    "labels-mask-the-response": ({"response_labels": LABELS.format(keep="<")},
                                 {"test_response_labels", "test_response_labels_left",
                                  "test_response_labels_hidden"}),
    "lora-b-random": ({"LoRALinear": LORA.format(b_init="randn")},
                      {"test_LoRALinear", "test_LoRALinear_sequence", "test_LoRALinear_hidden"}),
    "bt-naive-log-sigmoid": ({"bradley_terry_loss": "def bradley_terry_loss(chosen, rejected):\n"
                                    "    return -torch.log(torch.sigmoid(chosen - rejected)).mean()"},
                             {"test_bradley_terry_loss_hidden"}),
}


class TestLab10(RoundTrip):
    LAB = LAB
    WRONG = WRONG
    TOTAL = 31
    VALIDATE = Validation("pool-position-minus-one", 1, (
        'check("10.last_real_token.visible", last_real_token)',
        "position -1 was read",
    ))
