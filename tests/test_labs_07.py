"""Lab 07 graded by real nbgrader: full marks for the solution, 0 for the untouched release, and each known
mistake loses exactly the points of the tests it should fail."""

from __future__ import annotations

from lab_roundtrip import RoundTrip, Validation

LAB = "07_training_and_generation"
STEP = '''
def train_step(model, optimizer, tokens, grad_clip):
    {zero}
    loss = next_token_loss(model, tokens)
    loss.backward()
    {clip}
    optimizer.step()
    return loss.item()
'''
RIGHT_STEP = {"zero": "optimizer.zero_grad()", "clip": "torch.nn.utils.clip_grad_norm_(model.parameters(), grad_clip)"}
PROBS = '''
def next_token_probs(logits, temperature=1.0, top_k=None):
    {scale}
    if top_k is not None:
        kth = torch.topk(logits, top_k, dim=-1).values[:, -1:]
        logits = logits.masked_fill(logits {keep} kth, float("-inf"))
    return {softmax}
'''
RIGHT_PROBS = {"scale": "logits = logits / temperature", "keep": "<", "softmax": "logits.softmax(dim=-1)"}
SAMPLE = '''
def sample_next_token(model, idx, temperature=1.0, top_k=None, generator=None):
    logits = model(idx[:, -model.config.context_length:])[:, {position}]
    if temperature == 0:
        return logits.argmax(dim=-1, keepdim=True)
    return torch.multinomial(next_token_probs(logits, temperature, top_k), 1, generator=generator)
'''
STEP_TESTS = {"test_step", "test_step_twice", "test_step_hidden"}
# student -> ({solution cell grade_id: what they wrote}, test cells it must fail)
WRONG = {
    # train_step uses the loss, so the steps go wrong too
    "targets-not-shifted": ({"loss": "def next_token_loss(model, tokens):\n    x = tokens[:, :-1]\n"
                                     "    return F.cross_entropy(model(x).flatten(0, 1), x.flatten())"},
                            {"test_loss", "test_loss_hidden"} | STEP_TESTS),
    # a single step from fresh gradients is right; the second adds the first step's gradients
    "no-zero-grad": ({"step": STEP.format(**RIGHT_STEP | {"zero": "pass"})}, {"test_step_twice", "test_step_hidden"}),
    "no-clip": ({"step": STEP.format(**RIGHT_STEP | {"clip": "pass"})}, STEP_TESTS),
    # multinomial renormalises, so the draws follow temperature 1: a few draws may agree by chance (the visible
    # ones do), 64 at temperature 1.5 do not
    "temperature-after-softmax": ({"probs": PROBS.format(**RIGHT_PROBS | {
        "scale": "pass", "softmax": "logits.softmax(dim=-1) / temperature"})},
        {"test_probs", "test_probs_top_k", "test_probs_hidden", "test_sample_hidden"}),
    "top-k-keeps-k-minus-1": ({"probs": PROBS.format(**RIGHT_PROBS | {"keep": "<="})},
                              {"test_probs_top_k", "test_probs_hidden"}),
    "first-position": ({"sample": SAMPLE.format(position=0)},
                       {"test_sample_greedy", "test_sample", "test_sample_hidden"}),
}

class TestLab07(RoundTrip):
    LAB = LAB
    WRONG = WRONG
    TOTAL = 24
    VALIDATE = Validation('no-zero-grad', 1, (
        'check("07.step.twice", train_step)',
        "the gradients accumulate from one step to the next",
    ))
