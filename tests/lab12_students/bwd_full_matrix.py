# ruff: noqa (a lab notebook's cells, written blind to its tests: math and torch come from its setup cell)
# Piece: flash_backward. Kind: shortcut.
# Mistake: the recompute-from-L formulas applied once to the whole (T, T) matrix instead of tile by tile: right
#   gradients, nothing tiled (memory O(T^2) again).
# Where: FlashAttention-2 paper Alg. 2 read as matrix algebra ("standard attention backward", FA-1 paper Alg. 3).
# Names: \(T, T\)|whole.{0,40}matrix|full.{0,40}matrix|not tiled|memory|tile by tile
# Partly: \btiled?\b|peak
# %% flash_backward
def flash_backward(q, k, v, out, lse, grad_out, causal, block_q, block_k):
    B, H, T, D = q.shape
    H_kv = k.shape[1]
    G = H // H_kv
    k, v = k.repeat_interleave(G, dim=1), v.repeat_interleave(G, dim=1)
    s = q @ k.transpose(-2, -1) / math.sqrt(D)                            # (B, H, T, T)
    if causal:
        s = s.masked_fill(torch.ones(T, T, dtype=torch.bool).triu(1), -math.inf)
    p = torch.exp(s - lse[..., None])
    dv = p.transpose(-2, -1) @ grad_out
    ds = p * (grad_out @ v.transpose(-2, -1) - (grad_out * out).sum(-1, keepdim=True))
    dq = ds @ k / math.sqrt(D)
    dk = ds.transpose(-2, -1) @ q / math.sqrt(D)
    return dq, dk.view(B, H_kv, G, T, D).sum(2), dv.view(B, H_kv, G, T, D).sum(2)
