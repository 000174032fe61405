# ruff: noqa (a lab notebook's cells, written blind to its tests: math and torch come from its setup cell)
# Piece: FlashAttention. Kind: shortcut.
# Mistake: saves only q, k, v, out, L with save_for_backward, but keeps the (T, T) scores as a plain attribute
#   ctx.scores and backward softmaxes them: right gradients, the (T, T) tensor still held.
# Where: tensors stashed on ctx attributes instead of save_for_backward (PyTorch docs warn against it; PyTorch forums
#   "can I store tensors on ctx directly?").
# Names: ctx\.\w+|attribute|\(T, T\)|memory|kept|holds?
# Partly: save|ctx
# %% FlashAttention
class FlashAttention(torch.autograd.Function):
    @staticmethod
    def forward(ctx, q, k, v, causal, block_q, block_k):
        out, lse = flash_forward(q, k, v, causal, block_q, block_k)
        ctx.save_for_backward(q, k, v, out, lse)
        T, D = q.shape[-2:]
        G = q.shape[1] // k.shape[1]
        s = q @ k.repeat_interleave(G, dim=1).transpose(-2, -1) / math.sqrt(D)
        ctx.scores = s.masked_fill(torch.ones(T, T, dtype=torch.bool).triu(1), -math.inf) if causal else s
        return out

    @staticmethod
    def backward(ctx, grad_out):
        q, k, v, out, lse = ctx.saved_tensors
        B, H, T, D = q.shape
        H_kv = k.shape[1]
        G = H // H_kv
        p = torch.softmax(ctx.scores, -1)
        ke, ve = k.repeat_interleave(G, dim=1), v.repeat_interleave(G, dim=1)
        dv = p.transpose(-2, -1) @ grad_out
        ds = p * (grad_out @ ve.transpose(-2, -1) - (grad_out * out).sum(-1, keepdim=True))
        dq, dk = ds @ ke / math.sqrt(D), ds.transpose(-2, -1) @ q / math.sqrt(D)
        return dq, dk.view(B, H_kv, G, T, D).sum(2), dv.view(B, H_kv, G, T, D).sum(2), None, None, None
