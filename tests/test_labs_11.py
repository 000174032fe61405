"""Lab 11 graded by real nbgrader: full marks for the solution, 0 for the untouched release, and each known
mistake loses exactly the points of the tests it should fail."""

from __future__ import annotations

from pathlib import Path

from lab_roundtrip import BlindStudents, NamedMistakes, RoundTrip, Validation, check_named_mistake

LAB = "11_inference"
CACHE = '''
class LayerCache:
    def __init__(self, capacity):
        self.capacity, self.length, self.k, self.v = capacity, 0, None, None

    def append(self, k, v):
        if self.k is None:
            b, h, _, d = k.shape
            self.k, self.v = k.new_zeros(b, h, self.capacity, d), v.new_zeros(b, h, self.capacity, d)
        end = self.length + k.size(2)
        self.k[:, :, {start}:{start} + k.size(2)] = k
        self.v[:, :, {start}:{start} + k.size(2)] = v
        self.length = end
        return {ret}
'''
RIGHT_CACHE = {"start": "self.length", "ret": "self.k[:, :, :end], self.v[:, :, :end]"}
# the cache that grows by torch.cat: the same keys and values, every cached position copied at every token
CAT_CACHE = '''
class LayerCache:
    def __init__(self, capacity):
        self.capacity, self.length, self.k, self.v = capacity, 0, None, None

    def append(self, k, v):
        self.k = k if self.k is None else torch.cat([self.k, k], dim=2)
        self.v = v if self.v is None else torch.cat([self.v, v], dim=2)
        self.length = self.k.size(2)
        return self.k, self.v
'''
TOP_P = '''
def top_p_filter(logits, top_p):
    ordered, order = logits.sort(dim=-1, descending=True)
    probs = {probs}
    keep = {keep}
    return logits.masked_fill(~keep.scatter(-1, order, keep), float("-inf"))
'''
RIGHT_TOP_P = {"probs": "ordered.softmax(dim=-1)", "keep": "probs.cumsum(dim=-1) - probs < top_p"}
GQA = '''
class GroupedQueryAttention(nn.Module):
    def __init__(self, d_model, n_heads, n_kv_heads):
        super().__init__()
        self.n_heads, self.n_kv_heads, self.d_head = n_heads, n_kv_heads, d_model // n_heads
        self.q_proj = nn.Linear(d_model, d_model, bias=False)
        self.k_proj = nn.Linear(d_model, n_kv_heads * self.d_head, bias=False)
        self.v_proj = nn.Linear(d_model, n_kv_heads * self.d_head, bias=False)
        self.o_proj = nn.Linear(d_model, d_model, bias=False)

    def forward(self, x, cache=None):
        b, t, c = x.shape
        n_rep = self.n_heads // self.n_kv_heads
        q = self.q_proj(x).view(b, t, self.n_heads, self.d_head).transpose(1, 2)
        k = self.k_proj(x).view(b, t, self.n_kv_heads, self.d_head).transpose(1, 2)
        v = self.v_proj(x).view(b, t, self.n_kv_heads, self.d_head).transpose(1, 2)
        {repeat_before}
        if cache is not None:
            k, v = cache.append(k, v)
        {repeat_after}
        t_k = k.size(2)
        mask = torch.ones(t, t_k, dtype=torch.bool).tril(diagonal={diagonal})
        y = F.scaled_dot_product_attention(q, k, v, attn_mask=mask)
        return self.o_proj(y.transpose(1, 2).reshape(b, t, c))
'''
GENERATE = '''
def generate_cached(model, prompt, max_new_tokens):
    caches = [LayerCache(model.context_length) for _ in range(model.n_layers)]
    tokens, new, steps = prompt, prompt, []
    {before_loop}
    for _ in range(max_new_tokens):
        feed = {feed}
        logits = model(feed, {positions}, caches)[:, -1]
        steps.append(logits)
        new = logits.argmax(dim=-1, keepdim=True)
        tokens = torch.cat([tokens, new], dim=1)
    return tokens, torch.stack(steps, dim=1)
'''
RIGHT_GENERATE = {"before_loop": "pass", "feed": "new", "positions": "new_positions(caches[0].length, feed.size(1))"}
GENERATE_TESTS = {"test_generate_cached", "test_generate_cached_hidden"}
POSITIONS_TESTS = {"test_new_positions", "test_new_positions_hidden", *GENERATE_TESTS}
REPEAT = "k, v = repeat_kv(k, n_rep), repeat_kv(v, n_rep)"
RIGHT_GQA = {"repeat_before": "pass", "repeat_after": REPEAT, "diagonal": "t_k - t"}
GQA_TESTS = {"test_GroupedQueryAttention_cached", "test_GroupedQueryAttention_hidden"}
ATTENTION_TESTS = {"test_attend_new_token", "test_attend_new_token_large", "test_attend_new_token_hidden",
                   "test_repeat_kv", "test_repeat_kv_hidden", "test_GroupedQueryAttention", *GQA_TESTS}
FLASH_FAILS = ATTENTION_TESTS | GENERATE_TESTS  # the pieces that forbid the attention references
# student -> ({solution cell grade_id: what they wrote}, test cells it must fail)
WRONG = {
    # the student's LayerCache holds their generation's keys and values, so its tests fail too
    "cache-at-zero": ({"LayerCache": CACHE.format(**RIGHT_CACHE | {"start": "0"})},
                      {"test_LayerCache", "test_LayerCache_hidden", *GENERATE_TESTS}),
    "cache-grown-by-cat": ({"LayerCache": CAT_CACHE}, {"test_LayerCache", "test_LayerCache_hidden"}),
    "cache-whole-buffer": ({"LayerCache": CACHE.format(**RIGHT_CACHE | {"ret": "self.k, self.v"})},
                           {"test_LayerCache", "test_LayerCache_hidden", *GENERATE_TESTS}),
    # the token that crosses p is dropped: wrong on every row whose top token alone does not reach p
    "top-p-above-threshold": ({"top_p_filter": TOP_P.format(**RIGHT_TOP_P | {"keep": "probs.cumsum(dim=-1) <= top_p"})},
                              {"test_top_p_filter", "test_top_p_filter_skewed", "test_top_p_filter_large",
                               "test_top_p_filter_hidden"}),
    # right for ordinary logits; NaN probabilities, so every token masked, on the rows where exp() overflows
    "top-p-sorted-ascending": ({"top_p_filter": TOP_P.format(**RIGHT_TOP_P).replace("descending=True",
                                                                                   "descending=False")},
                               {"test_top_p_filter", "test_top_p_filter_skewed", "test_top_p_filter_large",
                                "test_top_p_filter_hidden"}),
    "top-p-naive-softmax": ({"top_p_filter": TOP_P.format(**RIGHT_TOP_P | {
        "probs": "ordered.exp() / ordered.exp().sum(dim=-1, keepdim=True)"})}, {"test_top_p_filter_large"}),
    # the threshold 1 - p (lucidrains/x-transformers#184): right only at p = 0.5 (the skewed case); p = 1 masks all
    "top-p-one-minus-p": ({"top_p_filter": TOP_P.format(**RIGHT_TOP_P | {
        "keep": "probs.cumsum(dim=-1) - probs < 1 - top_p"})},
        {"test_top_p_filter", "test_top_p_filter_large", "test_top_p_filter_hidden"}),
    # one query and a top-left mask: right only when the single key is the token itself (hidden_first)
    "one-token-causal-mask": ({"attend_new_token": "def attend_new_token(q, k, v):\n"
                                            "    return F.scaled_dot_product_attention(q, k, v, is_causal=True)"},
                              {"test_attend_new_token", "test_attend_new_token_large", "test_attend_new_token_hidden"}),
    # right for small scores; NaN once exp() overflows
    "attend-naive-softmax": ({"attend_new_token": "def attend_new_token(q, k, v):\n"
                                                  "    w = (q @ k.transpose(-2, -1) / math.sqrt(q.size(-1))).exp()\n"
                                                  "    return w / w.sum(dim=-1, keepdim=True) @ v"},
                             {"test_attend_new_token_large"}),
    # the student's repeat_kv feeds their attention layer, so its tests fail too (one kv head is the same either way)
    "repeat-tiled": ({"repeat_kv": "def repeat_kv(x, n_rep):\n    return x.repeat(1, n_rep, 1, 1)"},
                     {"test_repeat_kv", "test_repeat_kv_hidden", "test_GroupedQueryAttention", *GQA_TESTS}),
    "gqa-mask-top-left": ({"GroupedQueryAttention": GQA.format(**RIGHT_GQA | {"diagonal": "0"})}, GQA_TESTS),
    "gqa-caches-repeated-heads": ({"GroupedQueryAttention": GQA.format(**RIGHT_GQA | {"repeat_before": REPEAT,
                                                                     "repeat_after": "pass"})}, GQA_TESTS),
    # the student's new_positions feeds their generation loop, so its tests fail too
    "positions-from-zero": ({"new_positions": "def new_positions(past, t):\n    return torch.arange(t)"},
                            POSITIONS_TESTS),
    "positions-past-plus-one": ({"new_positions": "def new_positions(past, t):\n"
                                                  "    return torch.arange(past + 1, past + 1 + t)"}, POSITIONS_TESTS),
    "generate-feeds-whole-sequence": ({"generate_cached": GENERATE.format(**RIGHT_GENERATE | {
        "feed": "tokens if steps else prompt"})}, GENERATE_TESTS),
    "generate-refeeds-last-prompt-token": ({"generate_cached": GENERATE.format(**RIGHT_GENERATE | {
        "before_loop": "model(prompt, new_positions(0, prompt.size(1)), caches); new = prompt[:, -1:]"})},
        GENERATE_TESTS),
    "generate-rope-positions-from-zero": ({"generate_cached": GENERATE.format(**RIGHT_GENERATE | {
        "positions": "torch.arange(feed.size(1))"})}, GENERATE_TESTS),
    # an offset that adds the prompt's length once more after the prefill (skyzh/tiny-llm#46)
    "generate-prompt-counted-twice": ({"generate_cached": GENERATE.format(**RIGHT_GENERATE | {
        "positions": "new_positions(caches[0].length + (prompt.size(1) if caches[0].length else 0), feed.size(1))"})},
        GENERATE_TESTS),
    # lesson 12's flash_attention aligns the queries to the last keys and groups the kv heads itself; imported, it
    # costs every piece that forbids the attention references
    "attend-by-flash-attention": ({"attend_new_token": '''
from gptcourse import flash_attention

def attend_new_token(q, k, v):
    return flash_attention(q, k, v)
'''}, FLASH_FAILS),
    "gqa-by-flash-attention": ({"GroupedQueryAttention": GQA.format(**RIGHT_GQA | {"repeat_after": "pass"}).replace(
        "F.scaled_dot_product_attention(q, k, v, attn_mask=mask)", "flash_attention(q, k, v)").replace(
        "class GroupedQueryAttention", "from gptcourse import flash_attention\n\nclass GroupedQueryAttention")},
        FLASH_FAILS),
}


def test_the_ascending_sort_kept_below_p_is_named():
    """Least likely first and `cumsum <= p`: the least likely tokens stay (mlx-examples#602's confusion)."""
    check_named_mistake(LAB, {"top_p_filter": TOP_P.format(**RIGHT_TOP_P | {"keep": "probs.cumsum(dim=-1) <= top_p"})
                              .replace("descending=True", "descending=False")},
                        "11.top_p_filter.visible", "the tokens are sorted least likely first and kept while their mass "
                        "is <= p")


# Written blind to the tests (the blind students of labs 06-11), checked in-process against every test cell, hidden
# included, and by nbgrader in the round trip below. Before the fixes
# cache-returns-new-only got a bare shape diff, topp-unsorted-cumsum, topp-sorted-order-returned and
# gqa-view-no-transpose bare numeric diffs, and gen-prefill-first-logits was sent to its LayerCache.
BLIND_FILE = Path(__file__).with_name("lab11_blind.cells")
CACHE_CELLS = frozenset({"test_LayerCache", "test_LayerCache_hidden"})
GENERATE_CELLS = frozenset({"test_generate_cached", "test_generate_cached_hidden"})
ATTEND = frozenset({"test_attend_new_token", "test_attend_new_token_large", "test_attend_new_token_hidden"})
TOP_P_CELLS = frozenset({"test_top_p_filter", "test_top_p_filter_skewed", "test_top_p_filter_large",
                         "test_top_p_filter_hidden"})
GQA_CELLS = frozenset({"test_GroupedQueryAttention", "test_GroupedQueryAttention_cached",
                       "test_GroupedQueryAttention_hidden"})
POSITIONS = frozenset({"test_new_positions", "test_new_positions_hidden"})
BLIND_FAILS = {
    "cache-torch-cat": CACHE_CELLS,  # right keys and values: generate_cached, which uses it, passes
    # generate_cached runs the student's LayerCache (that piece's message need not name a mistake made in another)
    **dict.fromkeys(("cache-returns-new-only", "cache-returns-buffer", "cache-length-plus-one"),
                    CACHE_CELLS | GENERATE_CELLS),
    **dict.fromkeys(("attend-top-left-causal", "attend-no-scale", "attend-softmax-wrong-axis"), ATTEND),
    "attend-naive-exp": {"test_attend_new_token_large"},  # only scores in the hundreds overflow
    **dict.fromkeys(("topp-drops-crossing", "topp-unsorted-cumsum", "topp-sorted-order-returned"), TOP_P_CELLS),
    "topp-naive-softmax": {"test_top_p_filter_large"},
    # GroupedQueryAttention runs the student's repeat_kv
    **dict.fromkeys(("repeat-tiled", "repeat-wrong-axis"), GQA_CELLS | {"test_repeat_kv", "test_repeat_kv_hidden"}),
    **dict.fromkeys(("gqa-is-causal-with-cache", "gqa-cache-after-repeat"), GQA_CELLS - {"test_GroupedQueryAttention"}),
    **dict.fromkeys(("gqa-view-no-transpose", "gqa-no-causal-mask"), GQA_CELLS),
    **dict.fromkeys(("positions-from-zero", "positions-off-by-one", "positions-float"), POSITIONS | GENERATE_CELLS),
    **dict.fromkeys(("gen-recompute-no-cache", "gen-feeds-all-with-cache", "gen-positions-restart",
                     "gen-prefill-first-logits"), GENERATE_CELLS),
}


# case -> {student (of WRONG, or blind): what the case's message says to it}
SAYS = {
    "11.LayerCache.visible": {
        "cache-grown-by-cat": "they are not views of one buffer of capacity = 12 positions",
        "cache-at-zero": "the cache is written at position 0 every step",
        "cache-whole-buffer": "all 12 positions of the buffer, expected the 4 written",
    },
    "11.top_p_filter.visible": {
        "top-p-above-threshold": "top-p keeps the tokens *above* the threshold",
        # least likely first, the rule of the descending order kept: every token stays (the message was about 0 vs -inf)
        "top-p-sorted-ascending": "top_p_filter kept every token, 80 of them, where the nucleus leaves out 44: the "
                                  "tokens are sorted least likely first",
        "top-p-one-minus-p": "the threshold is 1 - top_p",
    },
    "11.top_p_filter.large": {
        "top-p-naive-softmax": "exp() overflows float32 past 88, so exp(logits) / exp(logits).sum() is inf / inf = "
                               "NaN there",
    },
    "11.attend_new_token.visible": {
        "one-token-causal-mask": "the causal mask is aligned top-left",
    },
    "11.attend_new_token.large": {
        "attend-naive-softmax": "exp() overflows float32 past 88",
    },
    "11.repeat_kv.visible": {
        "repeat-tiled": "the kv heads are tiled",
    },
    "11.GroupedQueryAttention.cached": {
        "gqa-mask-top-left": "the causal mask is aligned top-left",
        "gqa-caches-repeated-heads": "append k and v *before* repeat_kv",
    },
    "11.new_positions.visible": {
        "positions-from-zero": "the positions start at 0 in every call",
        "positions-past-plus-one": "the positions start at past + 1",
    },
    "11.generate_cached.visible": {
        "generate-feeds-whole-sequence": "the whole sequence again",
        "generate-refeeds-last-prompt-token": "the last prompt token was fed again",
        "generate-rope-positions-from-zero": "with RoPE its query and key are rotated",
        "generate-prompt-counted-twice": "the prompt was counted twice",
    },
}

# the lab's points; nbgrader validate on a student: the cells it reports failed, the first failed case, its message
TOTAL, VALIDATE = 38, Validation("top-p-above-threshold", 3, "11.top_p_filter.visible",
                                 ("the smallest set of the most likely tokens whose mass reaches p",
                                  "top_p_filter masked every token of a row: the most likely token always stays"))


class TestLab11(RoundTrip, NamedMistakes, BlindStudents):
    """Lab 11's round trip and in-process checks, from the tables above."""
