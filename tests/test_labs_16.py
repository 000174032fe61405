"""Lab 16 graded by real nbgrader: full marks for the solution, 0 for the untouched release, and each known
mistake loses exactly the points of the tests it should fail, in-process with a message that names it."""

from __future__ import annotations

from pathlib import Path

from lab_roundtrip import BlindStudents, NamedMistakes, RoundTrip, Validation

LAB = "16_mixture_of_experts"
ROUTE = '''
def route(router_logits, top_k):
    probs = F.softmax(router_logits, dim={axis})
    weights, experts = {pick}
    return {weights}, experts
'''
RIGHT_ROUTE = {"axis": "-1", "pick": "probs.topk(top_k, dim=-1)", "weights": "weights / weights.sum(-1, keepdim=True)"}
BY_POSITION = ("(lambda e: (probs.gather(1, e), e))((torch.arange(probs.shape[0])[:, None] + torch.arange(top_k))"
               " % probs.shape[1])")
DISPATCH = '''
def dispatch_combine(x, weights, experts, expert_fns):
    y = torch.zeros_like(x)
    for e, fn in enumerate(expert_fns):
        token, slot = (experts == e).nonzero(as_tuple=True)
        if token.numel() == 0:
            continue
        {combine}
    return y
'''
RIGHT_DISPATCH = "y.index_add_(0, token, fn(x[token]) * weights[token, slot, None])"
DENSE = '''
def dispatch_combine(x, weights, experts, expert_fns):
    y = torch.zeros_like(x)
    for e, fn in enumerate(expert_fns):
        gate = (weights * (experts == e)).sum(-1, keepdim=True)  # (N, 1): 0 where e is not chosen
        y = y + gate * fn(x)
    return y
'''
BALANCE = '''
def load_balancing_loss(router_logits, top_k, attention_mask=None):
    n, e = router_logits.shape
    probs = F.softmax(router_logits, dim=-1)
    top = probs.topk(top_k, dim=-1)
    routed = F.one_hot(top.indices, e).sum(1).float()
    real = torch.ones(n) if {no_mask} else attention_mask.reshape(n).float()
    kept = {kept}
    share = (routed * real[:, None]).sum(0) / real.sum()
    mean = (kept * real[:, None]).sum(0) / real.sum()
    return {factor} * (share * mean).sum()
'''
RIGHT_BALANCE = {"no_mask": "attention_mask is None", "kept": "probs", "factor": "e"}
COUNTS = '''
def moe_parameter_counts(config):
    c, v, n, m = config.d_model, config.vocab_size, config.n_layers, config.moe
    kv = config.kv_heads * config.d_head
    attention = 2 * c * c + 2 * c * kv
    expert = 3 * c * (m.d_ff or config.hidden_width)
    shared = {shared}
    embeddings = v * c * (1 if config.tie_weights else 2)
    rest = n * (attention + 2 * c) + c + embeddings + m.dense_layers * 3 * c * config.hidden_width
    sparse = n - m.dense_layers
    router = {router}
    total = rest + sparse * (router + m.n_experts * expert + shared)
    active = rest + sparse * (router + {active} * expert + shared)
    return total, active
'''
RIGHT_COUNTS = {"shared": "3 * c * m.shared_d_ff", "router": "c * m.n_experts", "active": "m.top_k"}
ROUTE_TESTS = {"test_route", "test_route_hidden"}
DISPATCH_TESTS = {"test_dispatch_combine", "test_dispatch_combine_hidden"}
BALANCE_TESTS = {"test_load_balancing_loss", "test_load_balancing_loss_hidden"}
COUNT_TESTS = {"test_moe_parameter_counts", "test_moe_parameter_counts_mixtral", "test_moe_parameter_counts_hidden"}
# student -> ({solution cell grade_id: what they wrote}, a case it fails, what that case's message says)
CASES = {
    "route-not-renormalised": ({"route": ROUTE.format(**RIGHT_ROUTE | {"weights": "weights"})},
                               "16.route.visible", "not renormalised"),
    "route-softmax-after-top-k": ({"route": ROUTE.format(**RIGHT_ROUTE | {"weights": "F.softmax(weights, dim=-1)"})},
                                  "16.route.visible", "a second softmax ran over the top-k probabilities"),
    "route-by-position": ({"route": ROUTE.format(**RIGHT_ROUTE | {"pick": BY_POSITION})}, "16.route.visible",
                          "routed by their position"),
    "route-softmax-over-tokens": ({"route": ROUTE.format(**RIGHT_ROUTE | {"axis": "0"})}, "16.route.visible",
                                  "the softmax ran over the tokens"),
    "dispatch-dense": ({"dispatch_combine": DENSE}, "16.dispatch_combine.visible", "the dense computation"),
    "dispatch-unweighted": ({"dispatch_combine": DISPATCH.format(combine="y.index_add_(0, token, fn(x[token]))")},
                            "16.dispatch_combine.visible", "without their routing weights"),
    "dispatch-overwrite": ({"dispatch_combine": DISPATCH.format(
        combine="y[token] = fn(x[token]) * weights[token, slot, None]")}, "16.dispatch_combine.visible",
        "a token's later expert overwrites"),
    "balance-on-top-k-probabilities": ({"load_balancing_loss": BALANCE.format(**RIGHT_BALANCE | {
        "kept": "torch.zeros_like(probs).scatter(1, top.indices, top.values)"})}, "16.load_balancing_loss.visible",
        "averaged over the top-k probabilities only"),
    "balance-padding-counted": ({"load_balancing_loss": BALANCE.format(**RIGHT_BALANCE | {"no_mask": "True"})},
                                "16.load_balancing_loss.visible", "the padding tokens were counted"),
    "balance-without-e": ({"load_balancing_loss": BALANCE.format(**RIGHT_BALANCE | {"factor": "1"})},
                          "16.load_balancing_loss.visible", "the factor E is missing"),
    "counts-shared-as-routed": ({"moe_parameter_counts": COUNTS.format(**RIGHT_COUNTS | {
        "shared": "expert if m.shared_d_ff else 0"})}, "16.moe_parameter_counts.visible",
        "the shared expert was counted as a routed expert"),
    "counts-every-expert-active": ({"moe_parameter_counts": COUNTS.format(**RIGHT_COUNTS | {
        "active": "m.n_experts"})}, "16.moe_parameter_counts.visible", "the active count holds every expert"),
    "counts-no-router": ({"moe_parameter_counts": COUNTS.format(**RIGHT_COUNTS | {"router": "0"})},
                         "16.moe_parameter_counts.mixtral", "the router was left out"),
    # a reference imported costs its own piece alone
    "route-imports-reference": ({"route": "from gptcourse import top_k_routing as route\n"}, "16.route.visible",
                                "is gptcourse.top_k_routing, the reference"),
    "counts-imports-reference": ({"moe_parameter_counts": "from gptcourse import count_parameters\n\n\n"
                                  "def moe_parameter_counts(config):\n"
                                  "    return count_parameters(config), count_parameters(config, active=True)\n"},
                                 "16.moe_parameter_counts.visible", "calls gptcourse.count_parameters, the reference"),
}

# the test cells each student fails: all of its piece's, but the shared expert's (Mixtral has none)
FAILS = {student: {"route": ROUTE_TESTS, "dispatch": DISPATCH_TESTS, "balance": BALANCE_TESTS,
                   "counts": COUNT_TESTS}[student.split("-")[0]] for student in CASES}
FAILS["counts-shared-as-routed"] = COUNT_TESTS - {"test_moe_parameter_counts_mixtral"}
WRONG = {student: (answers, FAILS[student]) for student, (answers, _, _) in CASES.items()}
# case -> {student: what the case's message says to it}
SAYS = {case: {student: says for student, (_, test_id, says) in CASES.items() if test_id == case}
        for case in dict.fromkeys(test_id for _, test_id, _ in CASES.values())}

# Written blind to the tests (tests/lab16_blind.cells), checked in-process against every test cell, hidden included,
# and by nbgrader in the round trip below. Before these fixes dc-per-token-calls, dc-empty-expert-crash,
# lb-padding-counted, lb-mask-only-counts, lb-mask-column-major, pc-untied-always and
# pc-expert-width-from-config-dff passed every visible check (none counted the calls; no visible expert went
# without a token, no visible batch was padded, no visible config was tied or left d_ff None), and the messages for
# route-logits-as-weights, route-sigmoid-gates, dc-weight-by-expert-index, lb-soft-counts, lb-top1-counts-only,
# pc-router-not-active, pc-shared-counted-as-routed, pc-mha-attention and pc-no-final-norm gave numbers only.
# route-softmax-of-topk-logits-shortcut is right (a softmax of the top-k logits is the renormalised top-k
# probabilities): it fails nothing.
BLIND_FILE = Path(__file__).with_name("lab16_blind.cells")
BLIND_FAILS = {
    **dict.fromkeys(("route-no-renormalise", "route-softmax-over-tokens", "route-logits-as-weights",
                     "route-smallest-k", "route-sigmoid-gates"), ROUTE_TESTS),
    "route-softmax-of-topk-logits-shortcut": set(),
    **dict.fromkeys(("dc-dense-masked", "dc-per-token-calls", "dc-unweighted", "dc-assign-not-add",
                     "dc-weight-by-expert-index", "dc-routed-by-position", "dc-first-slot-weight-only",
                     "dc-empty-expert-crash"), DISPATCH_TESTS),
    **dict.fromkeys(("lb-post-topk-probs", "lb-padding-counted", "lb-f-sums-to-one", "lb-no-E-factor",
                     "lb-mask-only-counts", "lb-soft-counts", "lb-mask-column-major", "lb-top1-counts-only"),
                    BALANCE_TESTS),
    # it imports gptcourse.load_balancing_loss, which only its own piece forbids: the scan zeroes that piece alone
    "lb-calls-package": BALANCE_TESTS,
    # the mistakes in terms Mixtral has too (the router, the final norm, two matrices, the embeddings, GQA)
    **dict.fromkeys(("pc-router-not-active", "pc-swiglu-two-matrices", "pc-active-without-embeddings",
                     "pc-no-final-norm", "pc-mha-attention"), COUNT_TESTS),
    # Mixtral has no shared expert, no dense block and is untied
    **dict.fromkeys(("pc-shared-counted-as-routed", "pc-dense-layers-ignored", "pc-untied-always",
                     "pc-shared-not-active"), COUNT_TESTS - {"test_moe_parameter_counts_mixtral"}),
    # Mixtral sets d_ff
    "pc-expert-width-from-config-dff": COUNT_TESTS - {"test_moe_parameter_counts_mixtral"},
    # the second blind reading (the students after the reader's line in the file)
    **dict.fromkeys(("route-weights-from-raw-logits", "route-double-softmax", "route-log-softmax-weights"),
                    ROUTE_TESTS),
    **dict.fromkeys(("dc-experts-off-by-one", "dc-run-all-then-select", "dc-one-call-per-slot"), DISPATCH_TESTS),
    **dict.fromkeys(("lb-probs-from-logits", "lb-mask-only-probs", "lb-padded-denominator",
                     "lb-f-per-batch-not-per-expert"), BALANCE_TESTS),
    **dict.fromkeys(("pc-router-with-bias", "pc-kv-without-head-dim", "pc-router-active-k-columns",
                     "pc-one-norm-per-block"), COUNT_TESTS),
    # Mixtral has no dense block
    "pc-dense-layers-expert-width": COUNT_TESTS - {"test_moe_parameter_counts_mixtral"},
}


# the lab's points; nbgrader validate on a student: the cells it reports failed, the first failed case, its message
TOTAL, VALIDATE = 18, Validation("dispatch-dense", 1, "16.dispatch_combine.visible", "this is the dense computation")


class TestLab16(RoundTrip, NamedMistakes, BlindStudents):
    """Lab 16's round trip and in-process checks, from the tables above."""
