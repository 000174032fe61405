# ruff: noqa (a lab notebook's cells, written blind to its tests: math and torch come from its setup cell)
# Piece: FlashAttention. Kind: shortcut.
# Mistake: forward also computes and saves the (T, T) probabilities P on ctx (save_for_backward), and backward uses
#   them instead of recomputing from L: right gradients, the memory saving (the point) lost.
# Where: the standard custom-attention autograd.Function pattern (PyTorch "extending autograd" tutorial saves what
#   backward needs); FlashAttention-1 paper sec. 3.1 "Recomputation" is what it skips.
# Names: \(T, T\)|probabilit|save[ds]?.{0,80}(P\b|too much|size)|memory
# Partly: save|ctx
# %% FlashAttention
class FlashAttention(torch.autograd.Function):
    @staticmethod
    def forward(ctx, q, k, v, causal, block_q, block_k):
        out, lse = flash_forward(q, k, v, causal, block_q, block_k)
        T, D = q.shape[-2:]
        G = q.shape[1] // k.shape[1]
        s = q @ k.repeat_interleave(G, dim=1).transpose(-2, -1) / math.sqrt(D)
        if causal:
            s = s.masked_fill(torch.ones(T, T, dtype=torch.bool).triu(1), -math.inf)
        ctx.save_for_backward(q, k, v, out, torch.softmax(s, -1))
        return out

    @staticmethod
    def backward(ctx, grad_out):
        q, k, v, out, p = ctx.saved_tensors
        B, H, T, D = q.shape
        H_kv = k.shape[1]
        G = H // H_kv
        ke, ve = k.repeat_interleave(G, dim=1), v.repeat_interleave(G, dim=1)
        dv = p.transpose(-2, -1) @ grad_out
        ds = p * (grad_out @ ve.transpose(-2, -1) - (grad_out * out).sum(-1, keepdim=True))
        dq, dk = ds @ ke / math.sqrt(D), ds.transpose(-2, -1) @ q / math.sqrt(D)
        return dq, dk.view(B, H_kv, G, T, D).sum(2), dv.view(B, H_kv, G, T, D).sum(2), None, None, None
