"""A stand-in for nanoGPT's model.py, written for the tests from its public interface: the parameter names,
`GPTConfig`, `GPT(config)`, `forward(idx, targets) -> (logits, loss)` and `configure_optimizers`. Attention is
explicit (a (T, T) mask and softmax), so it is an independent check of the course's fused path, not a copy."""

import math
from dataclasses import dataclass

import torch
from torch import nn
from torch.nn import functional as F


@dataclass
class GPTConfig:
    block_size: int = 64
    vocab_size: int = 65
    n_layer: int = 2
    n_head: int = 2
    n_embd: int = 32
    dropout: float = 0.0
    bias: bool = True


class LayerNorm(nn.Module):
    def __init__(self, n, bias):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(n))
        self.bias = nn.Parameter(torch.zeros(n)) if bias else None

    def forward(self, x):
        mean = x.mean(-1, keepdim=True)
        var = ((x - mean) ** 2).mean(-1, keepdim=True)
        y = (x - mean) / torch.sqrt(var + 1e-5) * self.weight
        return y + self.bias if self.bias is not None else y


class Attention(nn.Module):
    def __init__(self, c):
        super().__init__()
        self.c_attn = nn.Linear(c.n_embd, 3 * c.n_embd, bias=c.bias)
        self.c_proj = nn.Linear(c.n_embd, c.n_embd, bias=c.bias)
        self.n_head = c.n_head

    def forward(self, x):
        b, t, d = x.shape
        q, k, v = (z.view(b, t, self.n_head, d // self.n_head).transpose(1, 2) for z in self.c_attn(x).chunk(3, -1))
        scores = q @ k.transpose(-2, -1) / math.sqrt(d // self.n_head)
        future = torch.triu(torch.ones(t, t, dtype=torch.bool), diagonal=1)
        y = scores.masked_fill(future, float("-inf")).softmax(-1) @ v
        return self.c_proj(y.transpose(1, 2).reshape(b, t, d))


class MLP(nn.Module):
    def __init__(self, c):
        super().__init__()
        self.c_fc = nn.Linear(c.n_embd, 4 * c.n_embd, bias=c.bias)
        self.c_proj = nn.Linear(4 * c.n_embd, c.n_embd, bias=c.bias)

    def forward(self, x):
        return self.c_proj(0.5 * self.c_fc(x) * (1 + torch.erf(self.c_fc(x) / math.sqrt(2))))


class Block(nn.Module):
    def __init__(self, c):
        super().__init__()
        self.ln_1, self.attn, self.ln_2, self.mlp = LayerNorm(c.n_embd, c.bias), Attention(c), \
            LayerNorm(c.n_embd, c.bias), MLP(c)

    def forward(self, x):
        x = x + self.attn(self.ln_1(x))
        return x + self.mlp(self.ln_2(x))


class GPT(nn.Module):
    def __init__(self, c):
        super().__init__()
        self.transformer = nn.ModuleDict(dict(
            wte=nn.Embedding(c.vocab_size, c.n_embd), wpe=nn.Embedding(c.block_size, c.n_embd),
            h=nn.ModuleList(Block(c) for _ in range(c.n_layer)), ln_f=LayerNorm(c.n_embd, c.bias)))
        self.lm_head = nn.Linear(c.n_embd, c.vocab_size, bias=False)
        self.transformer.wte.weight = self.lm_head.weight
        print("stand-in nanoGPT built")  # nanoGPT prints its parameter count; the peer must keep it quiet

    def forward(self, idx, targets=None):
        x = self.transformer.wte(idx) + self.transformer.wpe(torch.arange(idx.size(1)))
        for block in self.transformer.h:
            x = block(x)
        logits = self.lm_head(self.transformer.ln_f(x))
        loss = None if targets is None else F.cross_entropy(logits.flatten(0, 1), targets.flatten())
        return logits, loss

    def configure_optimizers(self, weight_decay, learning_rate, betas, device_type):
        decay = [p for p in self.parameters() if p.dim() >= 2]
        rest = [p for p in self.parameters() if p.dim() < 2]
        print("using fused AdamW: False")
        return torch.optim.AdamW([{"params": decay, "weight_decay": weight_decay},
                                  {"params": rest, "weight_decay": 0.0}], lr=learning_rate, betas=betas)
