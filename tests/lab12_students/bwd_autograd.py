# ruff: noqa (a lab notebook's cells, written blind to its tests: math and torch come from its setup cell)
# Piece: flash_backward. Kind: shortcut.
# Mistake: the backward re-runs plain attention with autograd on and calls torch.autograd.grad: right gradients, but it
#   builds and keeps the (T, T) probabilities, the thing the recompute-from-L backward avoids.
# Where: "just let autograd do it" — the usual answer to "how do I write the backward of my custom attention"
#   (PyTorch forums on custom autograd.Function backward).
# Names: autograd|\(T, T\)|recomput|memory
# Partly: \btiled?\b|peak
# %% flash_backward
def flash_backward(q, k, v, out, lse, grad_out, causal, block_q, block_k):
    T, D = q.shape[-2:]
    G = q.shape[1] // k.shape[1]
    with torch.enable_grad():
        q, k, v = (x.detach().requires_grad_() for x in (q, k, v))
        s = q @ k.repeat_interleave(G, dim=1).transpose(-2, -1) / math.sqrt(D)
        if causal:
            s = s.masked_fill(torch.ones(T, T, dtype=torch.bool).triu(1), -math.inf)
        o = torch.softmax(s, -1) @ v.repeat_interleave(G, dim=1)
        return torch.autograd.grad(o, (q, k, v), grad_out)
