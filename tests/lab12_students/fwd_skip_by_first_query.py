# ruff: noqa (a lab notebook's cells, written blind to its tests: math and torch come from its setup cell)
# Piece: flash_forward. Kind: honest slip.
# Mistake: off-by-one causal tile boundary: a tile is skipped when its first key comes after the block's FIRST query
#   (k0 > q0) instead of its last (k0 > q1 - 1), dropping straddling tiles whenever block_k < block_q.
# Where: the causal early-exit bound in FlashAttention ports (flash-attention issues on causal results wrong for
#   seqlen_q != seqlen_k / unequal blocks).
# Names: skip.{0,120}(straddl|last query|q1|too many)|(straddl|q1 - 1).{0,120}skip|first\W{0,3}query
# Partly: \btile|skip
# %% flash_forward
def flash_forward(q, k, v, causal, block_q, block_k, on_tile=None):
    """Attention of q (B, H, T, D) on k, v (B, H_kv, T, D), one (block_q, block_k) tile of scores at a time.
    Returns the output (B, H, T, D) and L (B, H, T), the log-sum-exp of each query's scores."""
    B, H, T, D = q.shape
    G = H // k.shape[1]
    k, v = k.repeat_interleave(G, dim=1), v.repeat_interleave(G, dim=1)   # (B, H, T, D)
    out = torch.empty_like(q)
    lse = torch.empty(B, H, T, dtype=q.dtype)
    for q0 in range(0, T, block_q):
        q1 = min(q0 + block_q, T)
        m = torch.full((B, H, q1 - q0), -math.inf, dtype=q.dtype)
        denom = torch.zeros(B, H, q1 - q0, dtype=q.dtype)
        o = torch.zeros(B, H, q1 - q0, D, dtype=q.dtype)
        for k0 in range(0, T, block_k):
            k1 = min(k0 + block_k, T)
            if causal and k0 > q0:
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
