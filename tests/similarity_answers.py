"""Answers for tests/test_grading_similarity.py: for labs 05, 08 and 09, three honest solutions written in
distinctly different styles (each piece's code as a student would put it in its solution cell), and a copy of
the package's reference, renamed and reordered, as a student who opened shared/gptcourse/ would hand it in.

Data, not code under test: none of it is run. `HONEST[lab][style][piece]`, `FROM_REFERENCE[lab][piece]`.
"""

from __future__ import annotations

HONEST: dict[str, dict[str, dict[str, str]]] = {}
FROM_REFERENCE: dict[str, dict[str, str]] = {}

# ---- lab 05: one piece, the GPT class (the lab fixes its attribute names)

HONEST["05_assembling_gpt"] = {
    "plain": {"GPT": '''
class GPT(nn.Module):
    """Token ids (B, T) -> next-token logits (B, T, V)."""

    def __init__(self, config: GPTConfig) -> None:
        super().__init__()
        self.config = config
        self.tok_emb = nn.Embedding(config.vocab_size, config.d_model)
        if config.position == "learned":
            self.pos_emb = LearnedPositions(config.context_length, config.d_model)
        else:
            self.pos_emb = None
        if config.position == "rope":
            self.rope = RotaryEmbedding(config.d_head, config.context_length, config.rope_theta)
        else:
            self.rope = None
        layers = []
        for _ in range(config.n_layers):
            layers.append(DecoderBlock(config))
        self.blocks = nn.ModuleList(layers)
        self.final_norm = make_norm(config.norm, config.d_model, config.norm_eps, config.norm_bias)
        self.lm_head = nn.Linear(config.d_model, config.vocab_size, bias=config.lm_head_bias)
        if config.tie_weights:
            self.lm_head.weight = self.tok_emb.weight

    def forward_hidden(self, idx: torch.Tensor) -> torch.Tensor:
        """Token ids (B, T) -> hidden states (B, T, C) after the final norm."""
        B, T = idx.shape
        h = self.tok_emb(idx)
        pos = torch.arange(T, device=idx.device)
        cos_sin = None
        if self.rope is not None:
            cos_sin = self.rope(pos)
        if self.pos_emb is not None:
            h = h + self.pos_emb(pos)
        for blk in self.blocks:
            h = blk(h, rope=cos_sin)
        h = self.final_norm(h)
        return h

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        """Token ids (B, T) -> logits (B, T, V)."""
        h = self.forward_hidden(idx)
        logits = self.lm_head(h)
        return logits
'''},
    "helpers": {"GPT": '''
class GPT(nn.Module):
    """Token ids (B, T) -> next-token logits (B, T, V)."""

    def __init__(self, config: GPTConfig) -> None:
        super().__init__()
        self.config = config
        vocab, width = config.vocab_size, config.d_model
        self.tok_emb = nn.Embedding(vocab, width)
        self.pos_emb, self.rope = self._positions(config)
        self.blocks = nn.ModuleList([DecoderBlock(config) for layer in range(config.n_layers)])
        self.final_norm = make_norm(config.norm, width, config.norm_eps, config.norm_bias)
        self.lm_head = nn.Linear(width, vocab, bias=config.lm_head_bias)
        self._maybe_tie()

    @staticmethod
    def _positions(config):
        """(learned table or None, rotary embedding or None)"""
        kind = config.position
        table = LearnedPositions(config.context_length, config.d_model) if kind == "learned" else None
        rotary = RotaryEmbedding(config.d_head, config.context_length, config.rope_theta) if kind == "rope" else None
        return table, rotary

    def _maybe_tie(self):
        if not self.config.tie_weights:
            return
        self.lm_head.weight = self.tok_emb.weight

    def _embed(self, idx):
        where = torch.arange(idx.shape[-1], device=idx.device)
        vectors = self.tok_emb(idx)
        vectors = vectors if self.pos_emb is None else vectors + self.pos_emb(where)
        angles = None if self.rope is None else self.rope(where)
        return vectors, angles

    def forward_hidden(self, idx: torch.Tensor) -> torch.Tensor:
        """Token ids (B, T) -> hidden states (B, T, C) after the final norm."""
        vectors, angles = self._embed(idx)
        for i in range(len(self.blocks)):
            vectors = self.blocks[i](vectors, rope=angles)
        return self.final_norm(vectors)

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        """Token ids (B, T) -> logits (B, T, V)."""
        return self.lm_head(self.forward_hidden(idx))
'''},
    "functional": {"GPT": '''
import functools


class GPT(nn.Module):
    """Token ids (B, T) -> next-token logits (B, T, V)."""

    def __init__(self, config: GPTConfig) -> None:
        super().__init__()
        self.config = config
        cfg = config
        assert cfg.position in ("learned", "rope"), cfg.position
        embedding_dims = (cfg.vocab_size, cfg.d_model)
        self.tok_emb = nn.Embedding(*embedding_dims)
        self.lm_head = nn.Linear(cfg.d_model, cfg.vocab_size, bias=cfg.lm_head_bias)
        self.tie = cfg.tie_weights
        self.lm_head.weight = self.tok_emb.weight if self.tie else self.lm_head.weight
        self.pos_emb = {"learned": lambda: LearnedPositions(cfg.context_length, cfg.d_model),
                        "rope": lambda: None}[cfg.position]()
        self.rope = {"rope": lambda: RotaryEmbedding(cfg.d_head, cfg.context_length, cfg.rope_theta),
                     "learned": lambda: None}[cfg.position]()
        self.blocks = nn.ModuleList(map(lambda _: DecoderBlock(cfg), range(cfg.n_layers)))
        self.final_norm = make_norm(cfg.norm, cfg.d_model, cfg.norm_eps, cfg.norm_bias)

    def forward_hidden(self, idx: torch.Tensor) -> torch.Tensor:
        """Token ids (B, T) -> hidden states (B, T, C) after the final norm."""
        steps = torch.arange(0, idx.size(-1), dtype=torch.long, device=idx.device)
        start = self.tok_emb(idx) + (0 if self.pos_emb is None else self.pos_emb(steps))
        rot = self.rope(steps) if self.rope else None
        out = functools.reduce(lambda acc, layer: layer(acc, rope=rot), self.blocks, start)
        return self.final_norm(out)

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        """Token ids (B, T) -> logits (B, T, V)."""
        hidden = self.forward_hidden(idx)
        return hidden @ self.lm_head.weight.T + (0 if self.lm_head.bias is None else self.lm_head.bias)
'''},
}

# gptcourse.GPT's own __init__, forward_hidden and forward (shared/gptcourse/model/gpt.py), names changed, the
# attribute assignments and the two embedding steps reordered, the cache and padding arguments kept.
FROM_REFERENCE["05_assembling_gpt"] = {"GPT": '''
class GPT(nn.Module):
    """Token ids (B, T) -> next-token logits (B, T, V)."""

    def __init__(self, config: GPTConfig) -> None:
        super().__init__()
        self.config = config
        if not isinstance(config, GPTConfig):
            raise TypeError(f"GPT expects a GPTConfig, got {type(config).__name__}")
        cf = self.config = config
        self.rope = (
            RotaryEmbedding(cf.d_head, cf.context_length, cf.rope_theta) if cf.position == "rope" else None
        )
        self.tok_emb = nn.Embedding(cf.vocab_size, cf.d_model)
        self.pos_emb = LearnedPositions(cf.context_length, cf.d_model) if cf.position == "learned" else None
        self.final_norm = make_norm(cf.norm, cf.d_model, cf.norm_eps, cf.norm_bias)
        self.blocks = nn.ModuleList(DecoderBlock(cf) for _ in range(cf.n_layers))
        self.lm_head = nn.Linear(cf.d_model, cf.vocab_size, bias=cf.lm_head_bias)
        if cf.tie_weights:
            self.lm_head.weight = self.tok_emb.weight

    def forward_hidden(self, tokens, cache=None, attention_mask=None):
        """Token ids (B, T) -> hidden states (B, T, C) after the final norm."""
        offset = cache.length if cache is not None else 0
        pad_mask = None
        if attention_mask is None:
            where = torch.arange(offset, offset + tokens.size(1), device=tokens.device)
        else:
            where = (attention_mask.long().cumsum(-1) - 1).clamp(min=0)
            pad_mask = padding_mask(attention_mask)
        angles = None
        if self.rope is not None:
            c, s = self.rope(where)
            angles = (c, s) if where.dim() == 1 else (c[:, None], s[:, None])
        h = self.tok_emb(tokens)
        if self.pos_emb is not None:
            h = h + self.pos_emb(where)
        for n, layer in enumerate(self.blocks):
            h = layer(h, rope=angles, cache=cache.layers[n] if cache is not None else None, mask=pad_mask)
        return self.final_norm(h)

    def forward(self, tokens, cache=None, attention_mask=None):
        """Token ids (B, T) -> logits (B, T, V)."""
        return self.lm_head(self.forward_hidden(tokens, cache, attention_mask))
'''}

# ---- lab 08: count_pairs, merge_pair, train_bpe, encode, decode

HONEST["08_bpe_tokenizer"] = {
    "plain": {
        "count_pairs": '''
def count_pairs(ids: list[int]) -> dict[tuple[int, int], int]:
    """How often each adjacent pair (ids[i], ids[i + 1]) occurs."""
    result = {}
    for i in range(len(ids) - 1):
        key = (ids[i], ids[i + 1])
        if key in result:
            result[key] += 1
        else:
            result[key] = 1
    return result
''',
        "merge_pair": '''
def merge_pair(ids: list[int], pair: tuple[int, int], new_id: int) -> list[int]:
    """ids with each occurrence of pair replaced by new_id, left to right, without overlaps."""
    merged = []
    i = 0
    n = len(ids)
    while i < n:
        if i < n - 1 and ids[i] == pair[0] and ids[i + 1] == pair[1]:
            merged.append(new_id)
            i = i + 2
            continue
        merged.append(ids[i])
        i = i + 1
    return merged
''',
        "train_bpe": '''
def train_bpe(text: str, vocab_size: int) -> list[tuple[int, int]]:
    """The merges [(a, b), ...] of byte-level BPE on text; merge k makes id 256 + k."""
    words = regex.findall(GPT2_PATTERN, text)
    freq = {}
    for w in words:
        freq[w] = freq.get(w, 0) + 1
    seqs = {w: list(w.encode("utf-8")) for w in freq}
    token_bytes = [bytes([b]) for b in range(256)]
    merges = []
    for new_id in range(256, vocab_size):
        stats = {}
        for w, seq in seqs.items():
            for p, c in count_pairs(seq).items():
                stats[p] = stats.get(p, 0) + c * freq[w]
        if len(stats) == 0:
            break
        best = None
        for p, c in stats.items():
            key = (c, token_bytes[p[0]], token_bytes[p[1]])
            if best is None or key > best[0]:
                best = (key, p)
        pair = best[1]
        for w in seqs:
            seqs[w] = merge_pair(seqs[w], pair, new_id)
        merges.append(pair)
        token_bytes.append(token_bytes[pair[0]] + token_bytes[pair[1]])
    return merges
''',
        "encode": '''
def encode(text: str, merges: list[tuple[int, int]]) -> list[int]:
    """The token ids of text under the merges (merge k makes id 256 + k)."""
    result = []
    for word in regex.findall(GPT2_PATTERN, text):
        seq = list(word.encode("utf-8"))
        for rank in range(len(merges)):
            seq = merge_pair(seq, merges[rank], 256 + rank)
        result += seq
    return result
''',
        "decode": '''
def decode(ids: list[int], merges: list[tuple[int, int]]) -> str:
    """The text of the token ids under the merges."""
    table = [bytes([b]) for b in range(256)]
    for a, b in merges:
        table.append(table[a] + table[b])
    data = b""
    for i in ids:
        data += table[i]
    return data.decode("utf-8", errors="replace")
''',
    },
    "library": {
        "count_pairs": '''
from collections import Counter
import itertools


def count_pairs(ids: list[int]) -> dict[tuple[int, int], int]:
    """How often each adjacent pair (ids[i], ids[i + 1]) occurs."""
    return dict(Counter(zip(ids, ids[1:])))
''',
        "merge_pair": '''
def merge_pair(ids: list[int], pair: tuple[int, int], new_id: int) -> list[int]:
    """ids with each occurrence of pair replaced by new_id, left to right, without overlaps."""
    out = []
    skip = False
    for j, tok in enumerate(ids):
        if skip:
            skip = False
            continue
        nxt = ids[j + 1] if j + 1 < len(ids) else None
        if (tok, nxt) == pair:
            out.append(new_id)
            skip = True
        else:
            out.append(tok)
    return out
''',
        "train_bpe": '''
def train_bpe(text: str, vocab_size: int) -> list[tuple[int, int]]:
    """The merges [(a, b), ...] of byte-level BPE on text; merge k makes id 256 + k."""
    counter = Counter(regex.findall(GPT2_PATTERN, text))
    corpus = [[list(chunk.encode()), times] for chunk, times in counter.items()]
    spelled = {b: bytes([b]) for b in range(256)}
    learned = []
    while len(spelled) < vocab_size:
        totals = Counter()
        for seq, times in corpus:
            for two in zip(seq, seq[1:]):
                totals[two] += times
        if not totals:
            break
        top = max(totals.items(), key=lambda item: (item[1], spelled[item[0][0]], spelled[item[0][1]]))[0]
        token = len(spelled)
        spelled[token] = spelled[top[0]] + spelled[top[1]]
        learned.append(top)
        for entry in corpus:
            entry[0] = merge_pair(entry[0], top, token)
    return learned
''',
        "encode": '''
def encode(text: str, merges: list[tuple[int, int]]) -> list[int]:
    """The token ids of text under the merges (merge k makes id 256 + k)."""
    rank = {two: 256 + r for r, two in enumerate(merges)}
    tokens = []
    for chunk in regex.findall(GPT2_PATTERN, text):
        seq = list(chunk.encode())
        while len(seq) >= 2:
            candidates = [p for p in zip(seq, seq[1:]) if p in rank]
            if not candidates:
                break
            lowest = min(candidates, key=rank.get)
            seq = merge_pair(seq, lowest, rank[lowest])
        tokens.extend(seq)
    return tokens
''',
        "decode": '''
def decode(ids: list[int], merges: list[tuple[int, int]]) -> str:
    """The text of the token ids under the merges."""
    spelled = {b: bytes([b]) for b in range(256)}
    for r, (left, right) in enumerate(merges):
        spelled[256 + r] = spelled[left] + spelled[right]
    return bytes(itertools.chain.from_iterable(spelled[t] for t in ids)).decode("utf-8", "replace")
''',
    },
    "recursive": {
        "count_pairs": '''
from collections import defaultdict
from itertools import pairwise


def count_pairs(ids: list[int]) -> dict[tuple[int, int], int]:
    """How often each adjacent pair (ids[i], ids[i + 1]) occurs."""
    # walk over neighbours
    stats = defaultdict(int)
    for left, right in pairwise(ids):
        stats[left, right] += 1
    return dict(stats)
''',
        "merge_pair": '''
def merge_pair(ids: list[int], pair: tuple[int, int], new_id: int) -> list[int]:
    """ids with each occurrence of pair replaced by new_id, left to right, without overlaps."""
    result = list(ids)
    position = 0
    while position < len(result) - 1:
        if tuple(result[position:position + 2]) == pair:
            result[position:position + 2] = [new_id]  # the slice shrinks by one
        position += 1
    return result
''',
        "train_bpe": '''
def _best_pair(stats, table):
    """Most frequent; ties to the greatest pair of byte strings."""
    best_pair, best_key = None, None
    for candidate in sorted(stats):
        key = (stats[candidate], table[candidate[0]], table[candidate[1]])
        if best_key is None or key > best_key:
            best_pair, best_key = candidate, key
    return best_pair


def train_bpe(text: str, vocab_size: int) -> list[tuple[int, int]]:
    """The merges [(a, b), ...] of byte-level BPE on text; merge k makes id 256 + k."""
    chunks = defaultdict(int)
    for m in regex.finditer(GPT2_PATTERN, text):
        chunks[m.group()] += 1
    sequences = [(tuple(c.encode("utf-8")), f) for c, f in chunks.items()]
    table = {i: bytes([i]) for i in range(256)}
    out = []
    next_id = 256
    while next_id < vocab_size:
        stats = defaultdict(int)
        for seq, f in sequences:
            for left, right in pairwise(seq):
                stats[left, right] += f
        if not stats:
            break
        chosen = _best_pair(stats, table)
        out.append(chosen)
        table[next_id] = table[chosen[0]] + table[chosen[1]]
        sequences = [(tuple(merge_pair(list(seq), chosen, next_id)), f) for seq, f in sequences]
        next_id += 1
    return out
''',
        "encode": '''
def encode(text: str, merges: list[tuple[int, int]]) -> list[int]:
    """The token ids of text under the merges (merge k makes id 256 + k)."""
    lookup = {}
    for index, two in enumerate(merges):
        lookup[two] = index
    ids = []
    for m in regex.finditer(GPT2_PATTERN, text):
        word = list(m.group().encode("utf-8"))
        while True:
            ranked = sorted((lookup[p], p) for p in pairwise(word) if p in lookup)
            if not ranked:
                break
            index, two = ranked[0]
            word = merge_pair(word, two, 256 + index)
        ids += word
    return ids
''',
        "decode": '''
def decode(ids: list[int], merges: list[tuple[int, int]]) -> str:
    """The text of the token ids under the merges."""
    known = {}

    def spell(token):
        if token < 256:
            return bytes([token])
        if token not in known:
            a, b = merges[token - 256]
            known[token] = spell(a) + spell(b)
        return known[token]

    raw = bytearray()
    for token in ids:
        raw.extend(spell(token))
    return raw.decode("utf-8", errors="replace")
''',
    },
}

# gptcourse.text.bpe's merge_pair, train_merges (incremental counts and a heap), _encode_word's lowest-rank loop
# and decode_bytes, adapted to the lab's ids, renamed and partly reordered.
FROM_REFERENCE["08_bpe_tokenizer"] = {
    "count_pairs": '''
def count_pairs(ids: list[int]) -> dict[tuple[int, int], int]:
    """How often each adjacent pair (ids[i], ids[i + 1]) occurs."""
    out = defaultdict(int)
    for p in pairwise(ids):
        out[p] += 1
    return dict(out)
''',
    "merge_pair": '''
def merge_pair(ids: list[int], pair: tuple[int, int], new_id: int) -> list[int]:
    """ids with each occurrence of pair replaced by new_id, left to right, without overlaps."""
    x, y = pair
    result, k = [], 0
    while k < len(ids):
        if k + 1 < len(ids) and ids[k] == x and ids[k + 1] == y:
            result.append(new_id)
            k += 2
        else:
            result.append(ids[k])
            k += 1
    return result
''',
    "train_bpe": '''
import heapq
from collections import Counter, defaultdict
from itertools import pairwise


class _Greatest:
    __slots__ = ("key",)

    def __init__(self, key):
        self.key = key

    def __lt__(self, other):
        return self.key > other.key


def train_bpe(text: str, vocab_size: int) -> list[tuple[int, int]]:
    """The merges [(a, b), ...] of byte-level BPE on text; merge k makes id 256 + k."""
    words = Counter(w.encode("utf-8") for w in regex.findall(GPT2_PATTERN, text))
    table = [bytes([b]) for b in range(256)]
    freq = list(words.values())
    seqs = [list(w) for w in words]
    where = defaultdict(set)
    counts = defaultdict(int)
    for n, seq in enumerate(seqs):
        for pr in pairwise(seq):
            counts[pr] += freq[n]
            where[pr].add(n)
    heap = [(-c, _Greatest((table[x], table[y])), (x, y)) for (x, y), c in counts.items()]
    heapq.heapify(heap)
    result = []
    while len(table) < vocab_size and heap:
        negative, _, pr = heapq.heappop(heap)
        if counts.get(pr, 0) != -negative or negative == 0:
            continue
        x, y = pr
        fresh_id = len(table)
        table.append(table[x] + table[y])
        result.append((x, y))
        delta = defaultdict(int)
        for n in where.pop(pr):
            seq, f = seqs[n], freq[n]
            merged = merge_pair(seq, (x, y), fresh_id)
            if len(merged) == len(seq):
                continue
            for old in pairwise(seq):
                delta[old] -= f
            for new in pairwise(merged):
                delta[new] += f
                where[new].add(n)
            seqs[n] = merged
        for q, d in delta.items():
            if d:
                counts[q] += d
                if counts[q] > 0:
                    heapq.heappush(heap, (-counts[q], _Greatest((table[q[0]], table[q[1]])), q))
                else:
                    del counts[q]
        counts.pop(pr, None)
    return result
''',
    "encode": '''
def encode(text: str, merges: list[tuple[int, int]]) -> list[int]:
    """The token ids of text under the merges (merge k makes id 256 + k)."""
    ranks = {pr: (r, 256 + r) for r, pr in enumerate(merges)}
    never = (1 << 62, 0)
    result = []
    for w in regex.findall(GPT2_PATTERN, text):
        seq = list(w.encode("utf-8"))
        while len(seq) > 1:
            rank, fresh = min((ranks.get(pr, never) for pr in pairwise(seq)), default=never)
            if rank == never[0]:
                break
            seq = merge_pair(seq, next(pr for pr in pairwise(seq) if ranks.get(pr) == (rank, fresh)), fresh)
        result.extend(seq)
    return result
''',
    "decode": '''
def decode(ids: list[int], merges: list[tuple[int, int]]) -> str:
    """The text of the token ids under the merges."""
    table = [bytes([b]) for b in range(256)]
    for x, y in merges:
        table.append(table[x] + table[y])
    return b"".join(table[i] for i in ids).decode("utf-8", errors="replace")
''',
}

# ---- lab 09: cross_entropy, adamw_step, lr_at, clip_grad_norm, accumulate_gradients, training_state,
# restore_training_state (the signature lines are the release's)

_SIGNATURES = {
    "cross_entropy": "def cross_entropy(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:",
    "adamw_step": "def adamw_step(param: torch.Tensor, grad: torch.Tensor, exp_avg: torch.Tensor, "
                  "exp_avg_sq: torch.Tensor,\n               step: int, lr: float, beta1: float, beta2: float, "
                  "eps: float,\n               weight_decay: float) -> tuple[torch.Tensor, torch.Tensor, "
                  "torch.Tensor]:",
    "lr_at": "def lr_at(step: int, max_lr: float, min_lr: float, warmup_steps: int, total_steps: int) -> float:",
    "clip_grad_norm": "def clip_grad_norm(parameters, max_norm: float) -> torch.Tensor:",
    "accumulate_gradients": "def accumulate_gradients(model: torch.nn.Module, tokens: torch.Tensor, "
                            "micro_batches: int) -> float:",
    "training_state": "def training_state(model: torch.nn.Module, optimizer: torch.optim.Optimizer, "
                      "generator: torch.Generator,\n                   step: int) -> dict:",
    "restore_training_state": "def restore_training_state(state: dict, model: torch.nn.Module, "
                              "optimizer: torch.optim.Optimizer,\n                           "
                              "generator: torch.Generator) -> int:",
}


def _lab09(bodies: dict[str, str]) -> dict[str, str]:
    """Each piece's cell: the release's signature line, then the body (indented 4 spaces already)."""
    return {name: f"{_SIGNATURES[name]}\n{body.strip(chr(10))}\n" for name, body in bodies.items()}


HONEST["09_training_by_hand"] = {
    "plain": _lab09({
        "cross_entropy": '''
    biggest = logits.max(dim=1).values
    shifted = logits - biggest.unsqueeze(1)
    lse = biggest + torch.log(torch.exp(shifted).sum(dim=1))
    picked = logits[torch.arange(logits.shape[0]), targets]
    return torch.mean(lse - picked)
''',
        "adamw_step": '''
    decayed = param - lr * weight_decay * param
    m = exp_avg * beta1 + grad * (1 - beta1)
    v = exp_avg_sq * beta2 + grad ** 2 * (1 - beta2)
    bias1 = 1 - beta1 ** step
    bias2 = 1 - beta2 ** step
    new_param = decayed - lr * (m / bias1) / (torch.sqrt(v / bias2) + eps)
    return new_param, m, v
''',
        "lr_at": '''
    if step < warmup_steps:
        return max_lr * (step + 1) / warmup_steps
    if step >= total_steps:
        return min_lr
    decay_ratio = (step - warmup_steps) / (total_steps - warmup_steps)
    coeff = 0.5 * (1.0 + math.cos(math.pi * decay_ratio))
    return min_lr + coeff * (max_lr - min_lr)
''',
        "clip_grad_norm": '''
    parameters = [p for p in parameters if p.grad is not None]
    total = 0.0
    for p in parameters:
        total += (p.grad ** 2).sum()
    total_norm = torch.sqrt(torch.as_tensor(total))
    if total_norm > max_norm:
        factor = max_norm / (total_norm + 1e-6)
        for p in parameters:
            p.grad *= factor
    return total_norm
''',
        "accumulate_gradients": '''
    model.zero_grad()
    size = tokens.shape[0] // micro_batches
    losses = []
    for k in range(micro_batches):
        batch = tokens[k * size:(k + 1) * size]
        inputs, labels = batch[:, :-1], batch[:, 1:]
        out = model(inputs)
        loss = cross_entropy(out.reshape(-1, out.shape[-1]), labels.reshape(-1))
        loss = loss / micro_batches
        loss.backward()
        losses.append(loss.item())
    return sum(losses)
''',
        "training_state": '''
    state = {}
    state["model"] = model.state_dict()
    state["optimizer"] = optimizer.state_dict()
    state["generator"] = generator.get_state()
    state["step"] = step
    return state
''',
        "restore_training_state": '''
    model.load_state_dict(state["model"])
    optimizer.load_state_dict(state["optimizer"])
    generator.set_state(state["generator"])
    return state["step"]
''',
    }),
    "in_place": _lab09({
        "cross_entropy": '''
    n = targets.numel()
    log_z = torch.logsumexp(logits, dim=-1)
    correct = torch.gather(logits, dim=-1, index=targets.view(n, 1)).view(n)
    nll = log_z - correct
    return nll.sum() / n
''',
        "adamw_step": '''
    p = param.clone()
    p.mul_(1 - lr * weight_decay)
    m = exp_avg.clone().mul_(beta1).add_(grad, alpha=1 - beta1)
    v = exp_avg_sq.clone().mul_(beta2).addcmul_(grad, grad, value=1 - beta2)
    step_size = lr / (1 - beta1 ** step)
    denom = (v.sqrt() / math.sqrt(1 - beta2 ** step)).add_(eps)
    p.addcdiv_(m, denom, value=-step_size)
    return p, m, v
''',
        "lr_at": '''
    warm = step < warmup_steps
    if warm:
        frac = (step + 1) / warmup_steps
        return frac * max_lr
    span = max(total_steps - warmup_steps, 1)
    t = min((step - warmup_steps) / span, 1.0)
    cosine = (math.cos(t * math.pi) + 1) / 2
    return cosine * max_lr + (1 - cosine) * min_lr
''',
        "clip_grad_norm": '''
    grads = [p.grad for p in parameters if p.grad is not None]
    norms = torch.stack([torch.linalg.norm(g) for g in grads])
    total = torch.linalg.norm(norms)
    coef = torch.clamp(max_norm / (total + 1e-6), max=1.0)
    for g in grads:
        g.mul_(coef)
    return total
''',
        "accumulate_gradients": '''
    model.zero_grad(set_to_none=True)
    chunks = torch.split(tokens, tokens.size(0) // micro_batches)
    total_loss = 0.0
    for chunk in chunks:
        x, y = chunk[:, :-1], chunk[:, 1:]
        logits = model(x)
        B, T, V = logits.shape
        loss = cross_entropy(logits.view(B * T, V), y.reshape(B * T))
        total_loss += loss.detach()
        (loss / len(chunks)).backward()
    return float(total_loss) / len(chunks)
''',
        "training_state": '''
    return dict(model=model.state_dict(), optimizer=optimizer.state_dict(), generator=generator.get_state(),
                step=step)
''',
        "restore_training_state": '''
    for key, obj in (("model", model), ("optimizer", optimizer)):
        obj.load_state_dict(state[key])
    generator.set_state(state["generator"])
    return int(state["step"])
''',
    }),
    "per_row": _lab09({
        "cross_entropy": '''
    rows = []
    for row, target in zip(logits, targets):
        top = torch.max(row)
        normaliser = top + torch.log(torch.sum(torch.exp(row - top)))
        rows.append(normaliser - row[target])
    return torch.stack(rows).mean()
''',
        "adamw_step": '''
    # first and second moments, as running averages
    first = torch.lerp(exp_avg, grad, 1 - beta1)
    second = torch.lerp(exp_avg_sq, grad.square(), 1 - beta2)
    first_hat = first / (1.0 - math.pow(beta1, step))
    second_hat = second / (1.0 - math.pow(beta2, step))
    update = first_hat / (second_hat.sqrt() + eps)
    result = param * (1.0 - lr * weight_decay) - lr * update
    return result, first, second
''',
        "lr_at": '''
    if step >= warmup_steps:
        done = step - warmup_steps
        length = total_steps - warmup_steps
        if length <= 0 or done >= length:
            return min_lr
        amplitude = (max_lr - min_lr) / 2
        return min_lr + amplitude + amplitude * math.cos(math.pi * done / length)
    return (step + 1) * max_lr / warmup_steps
''',
        "clip_grad_norm": '''
    params = [p for p in parameters if p.grad is not None]
    with torch.no_grad():
        norm = torch.sqrt(sum(torch.sum(p.grad * p.grad) for p in params))
        ratio = max_norm / (norm.item() + 1e-6)
        if ratio < 1:
            for p in params:
                p.grad.copy_(p.grad * ratio)
    return norm
''',
        "accumulate_gradients": '''
    for p in model.parameters():
        p.grad = None
    running = []
    for part in tokens.tensor_split(micro_batches, dim=0):
        predictions = model(part[:, :-1])
        goal = part[:, 1:]
        piece_loss = cross_entropy(predictions.reshape(-1, predictions.size(-1)), goal.reshape(-1))
        running.append(piece_loss.item())
        scaled = piece_loss * (1.0 / micro_batches)
        scaled.backward()
    return sum(running) / len(running)
''',
        "training_state": '''
    snapshot = {"step": step, "generator": generator.get_state()}
    snapshot.update(model=model.state_dict(), optimizer=optimizer.state_dict())
    return snapshot
''',
        "restore_training_state": '''
    generator.set_state(state["generator"])
    optimizer.load_state_dict(state["optimizer"])
    model.load_state_dict(state["model"])
    step = state["step"]
    return step
''',
    }),
}

# gptcourse.training: losses.cross_entropy, optim.AdamW._update (its foreach calls on one-tensor lists),
# clipping.clip_grad_norm, loop.lr_at and train_step's micro-batch loop; renamed, independent lines reordered.
FROM_REFERENCE["09_training_by_hand"] = _lab09({
    "cross_entropy": '''
    ignore_index = -100
    if logits.shape[:-1] != targets.shape:
        raise ValueError(f"logits {tuple(logits.shape)} need targets of shape {tuple(logits.shape[:-1])} "
                         f"(one class id per row of V={logits.shape[-1]} scores), got {tuple(targets.shape)}")
    tgt = targets.flatten()
    scores = logits.flatten(0, -2) if logits.dim() > 1 else logits[None]
    kept = tgt != ignore_index
    shift = scores.max(dim=-1, keepdim=True).values.detach()
    lse = shift.squeeze(-1) + (scores - shift).exp().sum(dim=-1).log()
    picked = scores.gather(-1, tgt.where(kept, 0)[:, None]).squeeze(-1)
    per_row = (lse - picked)[kept]
    return per_row.sum() / kept.sum()
''',
    "adamw_step": '''
    params, grads = [param.clone()], [grad]
    v = [exp_avg_sq.clone()]
    m = [exp_avg.clone()]
    if weight_decay:
        torch._foreach_mul_(params, 1 - lr * weight_decay)
    torch._foreach_lerp_(m, grads, 1 - beta1)
    torch._foreach_mul_(v, beta2)
    torch._foreach_addcmul_(v, grads, grads, 1 - beta2)
    denominator = torch._foreach_sqrt(v)
    torch._foreach_div_(denominator, math.sqrt(1 - beta2**step))
    torch._foreach_add_(denominator, eps)
    torch._foreach_addcdiv_(params, m, denominator, -lr / (1 - beta1**step))
    return params[0], m[0], v[0]
''',
    "lr_at": '''
    if step < warmup_steps:
        return max_lr * (step + 1) / warmup_steps
    progress = min(1.0, (step - warmup_steps) / max(1, total_steps - warmup_steps))
    return min_lr + 0.5 * (1 + math.cos(math.pi * progress)) * (max_lr - min_lr)
''',
    "clip_grad_norm": '''
    if max_norm <= 0:
        raise ValueError(f"max_norm must be > 0, got {max_norm}")
    gs = [q.grad for q in parameters if q.grad is not None]
    if not gs:
        return torch.tensor(0.0)
    total = torch.linalg.vector_norm(torch.stack([torch.linalg.vector_norm(g) for g in gs]))
    factor = (max_norm / (total + 1e-6)).clamp(max=1.0)
    torch._foreach_mul_(gs, factor)
    return total
''',
    "accumulate_gradients": '''
    x, y = tokens[:, :-1], tokens[:, 1:]
    if x.size(0) % micro_batches:
        raise ValueError(f"a batch of {x.size(0)} rows does not split into micro_batches={micro_batches} "
                         "equal pieces: use a batch size that is a multiple of it")
    model.zero_grad(set_to_none=True)
    total = torch.zeros((), device=x.device)
    chunks = list(zip(x.chunk(micro_batches), y.chunk(micro_batches), strict=True))
    for n, (x_chunk, y_chunk) in enumerate(chunks):
        chunk_loss = cross_entropy(model(x_chunk).flatten(0, 1), y_chunk.flatten()) / micro_batches
        chunk_loss.backward()
        total += chunk_loss.detach()
    return total.item()
''',
    "training_state": '''
    return {"model": model.state_dict(), "optimizer": optimizer.state_dict(), "generator": generator.get_state(),
            "step": step}
''',
    "restore_training_state": '''
    model.load_state_dict(state["model"])
    optimizer.load_state_dict(state["optimizer"])
    generator.set_state(state["generator"])
    return state["step"]
''',
})
