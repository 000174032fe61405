# ruff: noqa (a lab notebook's cells, written blind to its tests: math and torch come from its setup cell)
# Piece: FlashAttention. Kind: honest slip.
# Mistake: backward returns only (dq, dk, dv), no None for causal, block_q, block_k.
# Where: "function backward returned an incorrect number of gradients (expected 6, got 3)", a top PyTorch forums
#   question on custom autograd.Function.
# Names: (number|one|six|6).{0,60}gradient|None.{0,60}(causal|block)|gradients? per input
# Partly: backward|None|gradient
# %% FlashAttention
class FlashAttention(torch.autograd.Function):
    @staticmethod
    def forward(ctx, q, k, v, causal, block_q, block_k):
        out, lse = flash_forward(q, k, v, causal, block_q, block_k)
        ctx.save_for_backward(q, k, v, out, lse)
        ctx.args = (causal, block_q, block_k)
        return out

    @staticmethod
    def backward(ctx, grad_out):
        q, k, v, out, lse = ctx.saved_tensors
        return flash_backward(q, k, v, out, lse, grad_out, *ctx.args)
