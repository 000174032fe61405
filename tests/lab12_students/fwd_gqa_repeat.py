# ruff: noqa (a lab notebook's cells, written blind to its tests: math and torch come from its setup cell)
# Piece: flash_forward. Kind: honest slip.
# Mistake: grouped-query kv heads expanded with repeat (heads j, j+H_kv, ... share a kv head) instead of
#   repeat_interleave (heads j*G ... j*G+G-1 share it).
# Where: onnx/onnx PR #7274 (GQA expanded with Tile, [h0, h1, h0, h1], where torch uses repeat_interleave);
#   apple/axlearn PR #842.
# Names: repeat_interleave|repeat\b.{0,80}(interleave|group)|kv head.{0,80}(map|serve|wrong)
# Partly: group|gqa|kv head|H_kv
# %% flash_forward
def flash_forward(q, k, v, causal, block_q, block_k, on_tile=None):
    """Attention of q (B, H, T, D) on k, v (B, H_kv, T, D), one (block_q, block_k) tile of scores at a time.
    Returns the output (B, H, T, D) and L (B, H, T), the log-sum-exp of each query's scores."""
    B, H, T, D = q.shape
    G = H // k.shape[1]
    k, v = k.repeat(1, G, 1, 1), v.repeat(1, G, 1, 1)   # (B, H, T, D)
    out = torch.empty_like(q)
    lse = torch.empty(B, H, T, dtype=q.dtype)
    for q0 in range(0, T, block_q):
        q1 = min(q0 + block_q, T)
        m = torch.full((B, H, q1 - q0), -math.inf, dtype=q.dtype)
        denom = torch.zeros(B, H, q1 - q0, dtype=q.dtype)
        o = torch.zeros(B, H, q1 - q0, D, dtype=q.dtype)
        for k0 in range(0, T, block_k):
            k1 = min(k0 + block_k, T)
            if causal and k0 > q1 - 1:
                break
            if on_tile is not None:
                on_tile(q0, k0)
            s = q[:, :, q0:q1] @ k[:, :, k0:k1].transpose(-2, -1) / math.sqrt(D)   # (B, H, tq, tk)
            if causal and k1 - 1 > q0:
                i = torch.arange(q0, q1)[:, None]
                j = torch.arange(k0, k1)[None, :]
                s = s.masked_fill(j > i, -math.inf)
            m, denom, o = online_softmax(m, denom, o, s, v[:, :, k0:k1])
        out[:, :, q0:q1] = o / denom[..., None]
        lse[:, :, q0:q1] = m + torch.log(denom)
    return out, lse
