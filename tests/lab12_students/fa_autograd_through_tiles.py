# ruff: noqa (a lab notebook's cells, written blind to its tests: math and torch come from its setup cell)
# Piece: FlashAttention. Kind: shortcut.
# Mistake: saves only q, k, v (no out, no L); backward re-runs the tiled flash_forward with autograd on and calls
#   torch.autograd.grad: right gradients, flash_backward never used, and the backward's graph holds every tile's P.
# Where: "just differentiate through my tiled forward" — PyTorch forums on writing custom attention backward;
#   FlashAttention-1 paper sec. 3.1 is the recomputation this replaces with autograd's stored activations.
# Names: flash_backward|autograd|not (called|used)|recomput|save.{0,60}(out|\bL\b|lse)
# Partly: \bsave|ctx
# %% FlashAttention
class FlashAttention(torch.autograd.Function):
    @staticmethod
    def forward(ctx, q, k, v, causal, block_q, block_k):
        ctx.save_for_backward(q, k, v)
        ctx.args = (causal, block_q, block_k)
        return flash_forward(q, k, v, causal, block_q, block_k)[0]

    @staticmethod
    def backward(ctx, grad_out):
        q, k, v = (x.detach().requires_grad_() for x in ctx.saved_tensors)
        with torch.enable_grad():
            out, _ = flash_forward(q, k, v, *ctx.args)
            return (*torch.autograd.grad(out, (q, k, v), grad_out), None, None, None)
