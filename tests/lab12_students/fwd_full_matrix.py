# ruff: noqa (a lab notebook's cells, written blind to its tests: math and torch come from its setup cell)
# Piece: flash_forward. Kind: shortcut.
# Mistake: computes the whole (T, T) score matrix and its softmax at once, then calls on_tile for the tiles a tiled
#   loop would have visited: right out, lse and tile count, nothing tiled.
# Where: "compute full attention then slice into blocks" — the common first attempt at FlashAttention in PyTorch
#   (forum questions on why a "flash" version uses as much memory as the naive one).
# Names: \(T, T\)|whole.{0,40}matrix|full.{0,40}(matrix|scores)|not tiled|memory
# Partly: \btiled?\b|peak
# %% flash_forward
def flash_forward(q, k, v, causal, block_q, block_k, on_tile=None):
    B, H, T, D = q.shape
    G = H // k.shape[1]
    k, v = k.repeat_interleave(G, dim=1), v.repeat_interleave(G, dim=1)
    s = q @ k.transpose(-2, -1) / math.sqrt(D)                            # (B, H, T, T)
    if causal:
        s = s.masked_fill(torch.ones(T, T, dtype=torch.bool).triu(1), -math.inf)
    for q0 in range(0, T, block_q):
        for k0 in range(0, T, block_k):
            if on_tile is not None and not (causal and k0 > min(q0 + block_q, T) - 1):
                on_tile(q0, k0)
    return torch.softmax(s, -1) @ v, torch.logsumexp(s, -1)
