"""Lab 12 graded by real nbgrader: full marks for the solution, 0 for the untouched release, and each known
mistake loses exactly the points of the tests it should fail."""

from __future__ import annotations

from pathlib import Path

from lab_roundtrip import BlindStudents, NamedMistakes, RoundTrip, Validation

LAB = "12_flash_attention"
MERGE = '''
def online_softmax(m, denom, o, scores, v):
    m_new = torch.maximum(m, scores.amax(dim=-1))
    rescale = torch.exp(m - m_new)
    p = torch.exp(scores - m_new[..., None])
    denom_new = {denom}
    return m_new, denom_new, {o}
'''
RIGHT_MERGE = {"denom": "rescale * denom + p.sum(dim=-1)", "o": "rescale[..., None] * o + p @ v"}
FORWARD = '''
def flash_forward(q, k, v, causal, block_q, block_k, on_tile=None):
    b, h, t, d = q.shape
    k, v = {kv}
    scale = {scale}{setup}
    out, lse = torch.empty_like(q), q.new_empty(b, h, t)
    for q0 in range(0, t, block_q):
        q1 = min(q0 + block_q, t)
        m = q.new_full((b, h, q1 - q0), float("-inf"))
        denom, o = torch.zeros_like(m), q.new_zeros(b, h, q1 - q0, d)
        for k0 in range(0, t, block_k):
            if causal and {skip}:
                break
            k1 = min(k0 + block_k, t)
            if {report}:
                on_tile(q0, k0)
            scores = {scores}
            if causal:
                future = torch.arange(k0, k1)[None, :] > torch.arange(q0, q1)[:, None]
                scores = scores.masked_fill(future, float("-inf"))
            m, denom, o = online_softmax(m, denom, o, scores, v[:, :, k0:k1])
        out[:, :, q0:q1] = o / denom[..., None]
        lse[:, :, q0:q1] = {lse}
    return out, lse
'''
INTERLEAVED = "k.repeat_interleave(h // k.size(1), dim=1), v.repeat_interleave(h // v.size(1), dim=1)"
TILED = "k.repeat(1, h // k.size(1), 1, 1), v.repeat(1, h // v.size(1), 1, 1)"
RIGHT_FORWARD = {"kv": INTERLEAVED, "scale": "1 / math.sqrt(d)", "setup": "", "skip": "k0 > q1 - 1",
                 "report": "on_tile is not None", "scores": "q[:, :, q0:q1] @ k[:, :, k0:k1].transpose(-2, -1) * scale",
                 "lse": "m + denom.log()"}
BACKWARD = '''
def flash_backward(q, k, v, out, lse, grad_out, causal, block_q, block_k):
    b, h, t, d = q.shape
    h_kv = k.size(1)
    k, v = {kv}
    scale = 1 / math.sqrt(d)
    delta = (grad_out * out).sum(dim=-1, keepdim=True)
    dq, dk, dv = torch.zeros_like(q), torch.zeros_like(k), torch.zeros_like(v)
    for q0 in range(0, t, block_q):
        q1 = min(q0 + block_q, t)
        for k0 in range(0, t, block_k):
            if causal and {skip}:
                break
            k1 = min(k0 + block_k, t)
            qt, kt, vt, dot = q[:, :, q0:q1], k[:, :, k0:k1], v[:, :, k0:k1], grad_out[:, :, q0:q1]
            p = torch.exp(qt @ kt.transpose(-2, -1) * scale - lse[:, :, q0:q1, None])
            if causal:
                p = p.masked_fill(torch.arange(k0, k1)[None, :] > torch.arange(q0, q1)[:, None], 0.0)
            dv[:, :, k0:k1] += p.transpose(-2, -1) @ dot
            ds = p * (dot @ vt.transpose(-2, -1){delta})
            dq[:, :, q0:q1] += ds @ kt * scale
            dk[:, :, k0:k1] += ds.transpose(-2, -1) @ qt * scale
    return dq, dk.view({group}).sum({axis}), dv.view({group}).sum({axis})
'''
RIGHT_BACKWARD = {"kv": INTERLEAVED.replace("k.size(1)", "h_kv").replace("v.size(1)", "h_kv"), "skip": "k0 > q1 - 1",
                  "delta": " - delta[:, :, q0:q1]", "group": "b, h_kv, h // h_kv, t, d", "axis": "2"}
FUNCTION = '''
class FlashAttention(torch.autograd.Function):
    @staticmethod
    def forward(ctx, q, k, v, causal, block_q, block_k):
        out, lse = flash_forward(q, k, v, causal, block_q, block_k)
        h = q.size(1)
        kr = k.repeat_interleave(h // k.size(1), dim=1)
        {keep}
        ctx.options = (causal, block_q, block_k)
        return out

    @staticmethod
    def backward(ctx, grad_out):
        q, k, v, out{more} = ctx.saved_tensors
        probs = {probs}
        b, h, t, d = q.shape
        h_kv = k.size(1)
        kr, vr = k.repeat_interleave(h // h_kv, dim=1), v.repeat_interleave(h // h_kv, dim=1)
        dp = grad_out @ vr.transpose(-2, -1)
        ds = probs * (dp - (grad_out * out).sum(-1, keepdim=True))
        group = (b, h_kv, h // h_kv, t, d)
        dq = ds @ kr / math.sqrt(d)
        dk = (ds.transpose(-2, -1) @ q / math.sqrt(d)).view(group).sum(2)
        dv = (probs.transpose(-2, -1) @ grad_out).view(group).sum(2)
        return dq, dk, dv, None, None, None
'''
WHOLE_PROBS = '''probs = torch.exp(q @ kr.transpose(-2, -1) / math.sqrt(q.size(-1)) - lse[..., None])
        if causal:
            probs = probs.tril()'''
# the probabilities a block of queries at a time, (B, H, block_q, T): no (T, T) tensor, but all of them kept
ROWS_PROBS = '''ctx.rows = []
        for q0 in range(0, q.size(2), block_q):
            s = q[:, :, q0:q0 + block_q] @ kr.transpose(-2, -1) / math.sqrt(q.size(-1))
            if causal:
                s = s.masked_fill(torch.arange(s.size(-1)) > torch.arange(q0, q0 + s.size(2))[:, None], -math.inf)
            ctx.rows.append(torch.exp(s - lse[:, :, q0:q0 + block_q, None]))
        ctx.save_for_backward(q, k, v, out)'''
SAVES_SOFTMAX = FUNCTION.format(keep=WHOLE_PROBS + "\n        ctx.save_for_backward(q, k, v, out, probs)",
                                more=", probs", probs="probs")
MERGE_TESTS = {"test_online_softmax", "test_online_softmax_max_moves", "test_online_softmax_hidden"}
OUTPUT_TESTS = {"test_flash_forward", "test_flash_forward_hidden", "test_FlashAttention", "test_FlashAttention_hidden"}
TILE_TESTS = {"test_flash_forward_tiles", "test_flash_forward_hidden"}
FORWARD_TESTS = {"test_flash_forward", "test_flash_forward_tiles", "test_flash_forward_hidden"}
BACKWARD_TESTS = {"test_flash_backward", "test_flash_backward_hidden"}
FUNCTION_TESTS = {"test_FlashAttention", "test_FlashAttention_hidden"}
ALL_FORWARD = FORWARD_TESTS | FUNCTION_TESTS  # the class runs the student's forward


def forward(**wrong: str) -> dict[str, str]:
    return {"flash_forward": FORWARD.format(**RIGHT_FORWARD | wrong)}


def backward(**wrong: str) -> dict[str, str]:
    return {"flash_backward": BACKWARD.format(**RIGHT_BACKWARD | wrong)}


# student -> ({solution cell grade_id: what they wrote}, test cells it must fail); the student's online_softmax
# feeds their flash_forward, which feeds their FlashAttention, so a wrong merge fails those too
WRONG = {
    "merge-no-rescale-o": ({"online_softmax": MERGE.format(**RIGHT_MERGE | {"o": "o + p @ v"})},
                           MERGE_TESTS | OUTPUT_TESTS),
    "merge-denom-not-updated": ({"online_softmax": MERGE.format(**RIGHT_MERGE | {"denom": "denom"})},
                                MERGE_TESTS | OUTPUT_TESTS),
    "merge-divides-early": ({"online_softmax": MERGE.format(**RIGHT_MERGE | {
        "o": "(rescale[..., None] * o + p @ v) / denom_new[..., None]"})}, MERGE_TESTS | OUTPUT_TESTS),
    # right outputs: the products counted in the kernel show the tiles above the diagonal computed and masked
    "forward-masks-instead-of-skipping": (forward(skip="False"), ALL_FORWARD),
    # the same, reporting to on_tile only the tiles it should compute (issue 42)
    "forward-computes-every-tile-reports-some": (forward(skip="False", report="on_tile is not None and k0 < q1"),
                                                 ALL_FORWARD),
    # right outputs and tiles, from the whole (B, H, T, T) score matrix computed once and sliced (LAB12-1); the
    # class runs it too
    "forward-whole-score-matrix": (forward(setup="\n    whole = q @ k.transpose(-2, -1) * scale",
                                           scores="whole[:, :, q0:q1, k0:k1]"), FORWARD_TESTS | FUNCTION_TESTS),
    # stops at the block's first query: with blocks of 4 queries and 3 keys, the last keys of a block are missed
    "forward-skip-off-by-one": (forward(skip="k0 > q0"), OUTPUT_TESTS | TILE_TESTS),
    # one tile late (LAB12-3): right outputs; the visible tiles case, and the class's hidden_gqa, have key tiles
    # starting at q1
    "forward-skip-one-late": (forward(skip="k0 > q1"), TILE_TESTS | {"test_FlashAttention_hidden"}),
    "forward-scale-by-d": (forward(scale="1 / d"), OUTPUT_TESTS),
    # the output is right; the backward, fed the max as L, recomputes wrong probabilities
    "forward-lse-is-max": (forward(lse="m"), OUTPUT_TESTS),
    # kv heads tiled (LAB12-4): the visible case is grouped
    "forward-kv-heads-tiled": (forward(kv=TILED), OUTPUT_TESTS),
    "backward-no-delta": (backward(delta=""), BACKWARD_TESTS | FUNCTION_TESTS),
    # right gradients, every tile computed and masked (LAB12-5); the class runs it, and counts its products too
    "backward-visits-every-tile": (backward(skip="False"), BACKWARD_TESTS | FUNCTION_TESTS),
    "backward-kv-heads-tiled": (backward(kv=TILED.replace("k.size(1)", "h_kv").replace("v.size(1)", "h_kv"),
                                         group="b, h // h_kv, h_kv, t, d", axis="1"), BACKWARD_TESTS | FUNCTION_TESTS),
    "function-saves-softmax": ({"FlashAttention": SAVES_SOFTMAX}, FUNCTION_TESTS),
    # P kept on ctx outside save_for_backward (LAB12-2), whole or a block of query rows at a time
    "function-keeps-probs-on-ctx": ({"FlashAttention": FUNCTION.format(
        keep=WHOLE_PROBS + "\n        ctx.probs = probs\n        ctx.save_for_backward(q, k, v, out)", more="",
        probs="ctx.probs")}, FUNCTION_TESTS),
    "function-keeps-prob-rows-on-ctx": ({"FlashAttention": FUNCTION.format(keep=ROWS_PROBS, more="",
                                                                           probs="torch.cat(ctx.rows, dim=2)")},
                                        FUNCTION_TESTS),
    # a reference imported costs its own piece and the class, which calls the student's flash_backward
    "backward-imports-reference": ({"flash_backward": "from gptcourse import flash_backward\n"},
                                   BACKWARD_TESTS | FUNCTION_TESTS),
}

# Written blind to the tests (issue 42), as written: student -> the test cells it fails (tests/lab12_blind.cells;
# each "# Names:" regex was written before the messages were seen).
BLIND_FILE = Path(__file__).with_name("lab12_blind.cells")
BLIND_FAILS = {
    **dict.fromkeys(("bwd-autograd", "bwd-every-tile", "bwd-full-matrix", "bwd-gqa-sum-wrong-order", "bwd-no-mask",
                     "bwd-scores-unscaled"), BACKWARD_TESTS | FUNCTION_TESTS),
    **dict.fromkeys(("fa-autograd-through-tiles", "fa-p-on-ctx-attr", "fa-save-p", "fa-three-grads"), FUNCTION_TESTS),
    **dict.fromkeys(("fwd-every-tile", "fwd-full-matrix", "fwd-skip-by-first-query", "fwd-tail-block-dropped"),
                    ALL_FORWARD),
    **dict.fromkeys(("fwd-gqa-repeat", "fwd-lse-without-max", "fwd-mask-only-diagonal-tile", "fwd-scale-twice"),
                    OUTPUT_TESTS),
    "fwd-keys-untiled": FORWARD_TESTS,
    **dict.fromkeys(("os-alpha-inverted", "os-o-not-rescaled"), MERGE_TESTS | OUTPUT_TESTS),
    "os-unshifted-exp": {"test_online_softmax_max_moves"},
    "os-wrong-max": {"test_online_softmax"} | OUTPUT_TESTS,
    # torch's own CPU flash kernel: a name the forward, the backward and the class forbid (not the merge, which
    # computes no attention), so the scan zeroes those three
    "fwd-cpu-flash-kernel": ALL_FORWARD | BACKWARD_TESTS,
}


# case -> {student (of WRONG, or blind): what the case's message says to it}
SAYS = {
    "12.online_softmax.max_moves": {
        "merge-no-rescale-o": "the running output o was not rescaled",
    },
    "12.online_softmax.visible": {
        "merge-denom-not-updated": "the denominator was not updated",
        "merge-divides-early": "o was divided by the denominator inside the merge",
    },
    "12.flash_forward.tiles": {
        "forward-masks-instead-of-skipping": "lie wholly above the diagonal",
        "forward-skip-one-late": "not q1 (an off-by-one)",
    },
    "12.flash_forward.visible": {
        "forward-computes-every-tile-reports-some": "it computed every tile",
        "forward-whole-score-matrix": "made a tensor of shape (12, 10, 10): the whole score matrix",
        "forward-skip-off-by-one": "the key tiles stop at k0 <= q0",
        "forward-scale-by-d": "the scores were divided by D, not sqrt(D)",
        "forward-lse-is-max": "L is the running max m alone",
        "forward-kv-heads-tiled": "the kv heads are tiled",
    },
    "12.flash_backward.visible": {
        "backward-no-delta": "the softmax's backward lacks its row term",
        "backward-visits-every-tile": "it computed every tile",
        "backward-kv-heads-tiled": "the kv heads are tiled",
        "backward-imports-reference": "is gptcourse.flash_backward, the reference",
    },
    "12.FlashAttention.visible": {
        "function-saves-softmax": "(with save_for_backward), B H T T = 484: the (T, T) probabilities",
        "function-keeps-probs-on-ctx": "(on ctx, outside save_for_backward), B H T T",
        "function-keeps-prob-rows-on-ctx": "more than q, k, v, the output and L",
    },
}

# the lab's points; nbgrader validate on a student: the cells it reports failed, the first failed case, its message
TOTAL, VALIDATE = 22, Validation("merge-no-rescale-o", 4, "12.online_softmax.max_moves",
                                 "the running output o was not rescaled")


class TestLab12(RoundTrip, NamedMistakes, BlindStudents):
    """Lab 12's round trip and in-process checks, from the tables above."""
