# ruff: noqa (a lab notebook's cells, written blind to its tests: math and torch come from its setup cell)
# Piece: online_softmax. Kind: honest slip.
# Mistake: the old state is rescaled by e^{m' - m} instead of e^{m - m'} (the exponent's sign flipped): inf * 0 = nan
#   on the first block, and a growing factor afterwards.
# Where: deepseek-ai/FlashMLA PR #177 ("fix sign of online softmax rescaling factors": exp(m_old - m_new), not
#   exp(m_new - m_old)).
# Names: sign|m_old - m_new|m - m'|exp\(m - m|e\^\{m - m|inverted|the wrong way
# Partly: rescal|\bnan\b
# %% online_softmax
def online_softmax(m, denom, o, scores, v):
    m_new = torch.maximum(m, scores.amax(-1))
    p = torch.exp(scores - m_new[..., None])
    alpha = torch.exp(m_new - m)
    return m_new, alpha * denom + p.sum(-1), alpha[..., None] * o + p @ v
