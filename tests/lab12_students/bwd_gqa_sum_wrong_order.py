# ruff: noqa (a lab notebook's cells, written blind to its tests: math and torch come from its setup cell)
# Piece: flash_backward. Kind: honest slip.
# Mistake: grouped-query dk, dv summed over the wrong grouping (view(B, G, H_kv, ...).sum(1), the layout of repeat),
#   while the forward expanded with repeat_interleave.
# Where: the backward twin of onnx/onnx PR #7274 (tile vs repeat_interleave head order); flash-attention's
#   dk_expanded / dv_expanded reduction for GQA.
# Names: repeat_interleave|interleav|wrong (group|order)|order of the (kv )?heads|which query heads
# Partly: group
# %% flash_backward
def flash_backward(q, k, v, out, lse, grad_out, causal, block_q, block_k):
    """dq (B, H, T, D), dk, dv (B, H_kv, T, D), tile by tile, recomputing each tile's probabilities from L."""
    B, H, T, D = q.shape
    H_kv = k.shape[1]
    G = H // H_kv
    k, v = k.repeat_interleave(G, dim=1), v.repeat_interleave(G, dim=1)   # (B, H, T, D)
    delta = (grad_out * out).sum(-1)                                       # (B, H, T)
    dq, dk, dv = torch.zeros_like(q), torch.zeros_like(k), torch.zeros_like(v)
    scale = 1 / math.sqrt(D)
    for q0 in range(0, T, block_q):
        q1 = min(q0 + block_q, T)
        for k0 in range(0, T, block_k):
            k1 = min(k0 + block_k, T)
            if causal and k0 > q1 - 1:
                break
            s = q[:, :, q0:q1] @ k[:, :, k0:k1].transpose(-2, -1) * scale    # (B, H, tq, tk)
            if causal and k1 - 1 > q0:
                i = torch.arange(q0, q1)[:, None]
                j = torch.arange(k0, k1)[None, :]
                s = s.masked_fill(j > i, -math.inf)
            p = torch.exp(s - lse[:, :, q0:q1, None])
            do = grad_out[:, :, q0:q1]
            dv[:, :, k0:k1] += p.transpose(-2, -1) @ do
            dp = do @ v[:, :, k0:k1].transpose(-2, -1)
            ds = p * (dp - delta[:, :, q0:q1, None])
            dq[:, :, q0:q1] += ds @ k[:, :, k0:k1] * scale
            dk[:, :, k0:k1] += ds.transpose(-2, -1) @ q[:, :, q0:q1] * scale
    dk = dk.view(B, G, H_kv, T, D).sum(1)
    dv = dv.view(B, G, H_kv, T, D).sum(1)
    return dq, dk, dv
