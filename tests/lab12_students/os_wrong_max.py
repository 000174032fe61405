# ruff: noqa (a lab notebook's cells, written blind to its tests: math and torch come from its setup cell)
# Piece: online_softmax. Kind: honest slip.
# Mistake: the block's exponentials are shifted by the block's own max, not by the new running max m'.
# Where: deepseek-ai/FlashMLA PR #177 (the rescale factors' max written the wrong way round); FlashAttention-1
#   Alg. 1 keeps a per-block max m~_ij whose rescale e^{m~_ij - m_new} learners drop.
# Names: (block'?s (own )?max|max of (the|this) block|shift|wrong max|new max|m')
# Partly: \bmax\b|maximum|rescal
# %% online_softmax
def online_softmax(m, denom, o, scores, v):
    m_blk = scores.amax(-1)                                   # (..., T_q)
    m_new = torch.maximum(m, m_blk)
    p = torch.exp(scores - m_blk[..., None])                  # shifted by the block's max
    alpha = torch.exp(m - m_new)
    return m_new, alpha * denom + p.sum(-1), alpha[..., None] * o + p @ v
