# ruff: noqa (a lab notebook's cells, written blind to its tests: math and torch come from its setup cell)
# Piece: online_softmax. Kind: honest slip.
# Mistake: the denominator is rescaled by e^{m - m'} but the running output o is not.
# Where: the "online normalizer" paper (Milakov & Gimelshein 2018) rescales only the sum; learners extending it to
#   the output forget o's rescale (flash-attention issue threads on writing a naive PyTorch FlashAttention).
# Names: (\bo\b|output|numerator).{0,80}(rescal|e\^|exp\(m)|(rescal|e\^).{0,80}(\bo\b|output)
# Partly: rescal|maximum moves|\bo\b
# %% online_softmax
def online_softmax(m, denom, o, scores, v):
    m_new = torch.maximum(m, scores.amax(-1))
    p = torch.exp(scores - m_new[..., None])
    alpha = torch.exp(m - m_new)
    return m_new, alpha * denom + p.sum(-1), o + p @ v
