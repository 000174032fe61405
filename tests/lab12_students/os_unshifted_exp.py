# ruff: noqa (a lab notebook's cells, written blind to its tests: math and torch come from its setup cell)
# Piece: online_softmax. Kind: shortcut.
# Mistake: e^{s - m'} written as e^{s} * e^{-m'}: equal on small scores, the max-subtraction (the point) skipped,
#   so large scores overflow to inf and the merge returns nan.
# Where: the numerically-unstable softmax, the classic forum question ("softmax returns nan for large inputs");
#   in FlashAttention learners "simplify" the rescale the same way.
# Names: overflow|\binf\b|\bnan\b|unstable|subtract.{0,20}\bmax\b|\bmax\b.{0,20}subtract
# Partly: \blarge|\bmax\b
# %% online_softmax
def online_softmax(m, denom, o, scores, v):
    m_new = torch.maximum(m, scores.amax(-1))
    p = torch.exp(scores) * torch.exp(-m_new)[..., None]
    alpha = torch.exp(m) * torch.exp(-m_new)
    return m_new, alpha * denom + p.sum(-1), alpha[..., None] * o + p @ v
