"""A byte-level BPE tokenizer, trained here, like GPT-2's: 256 byte tokens, then merges, then special tokens.

Training (`BPETokenizer.train`) splits the text at special tokens, cuts each piece into pre-tokens with GPT-2's
regex (words with their leading space, numbers, punctuation runs, whitespace), and then repeatedly merges the most
frequent adjacent pair of tokens *within* pre-tokens into a new token. The merge order is fully defined: the most
frequent pair wins, and a tie goes to the lexicographically greatest pair of byte strings, compared as the tuple
(bytes of the left token, bytes of the right token) (CS336's rule; `max` over `(count, left, right)`).

Speed: pair counts are kept over the *unique* pre-tokens (each with its frequency) and updated incrementally: a
merge touches only the pre-tokens that hold the pair (an index pair -> pre-tokens), and the next pair comes from
a heap with lazy deletion, so no merge recounts the corpus. `python -m gptcourse.bench` times it against a naive
recount-every-merge loop and against Hugging Face `tokenizers`' Rust `BpeTrainer`.

Encoding applies the merges to each pre-token lowest rank first, which is what the Rust BPE model does, so
`to_hf()` encodes identically. Text that holds a special token's string is refused unless `allowed_special` says
what to do with it (as tiktoken does): such text may come from a user, and silently turning it into a control token
lets a prompt end a document or fake a turn. A pretrained vocabulary (`from_hf`, GPT-2's 50,257 tokens) keeps its
own ids, whatever order they come in. Decoding joins the tokens' bytes and decodes them once (a character may span
tokens); bytes that are not valid UTF-8 become U+FFFD, as the bytes say.
"""

from __future__ import annotations

import heapq
import json
from collections import Counter, defaultdict
from collections.abc import Collection, Iterable, Mapping, Sequence
from functools import lru_cache
from itertools import pairwise
from pathlib import Path
from typing import Any, Literal

import regex

# GPT-2's pre-tokenizer (openai/gpt-2, encoder.py): contractions, letters with one optional leading space, numbers,
# other symbols, whitespace runs (all but the last space when a word follows, which keeps its space).
GPT2_PATTERN = r"""'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+"""
FORMAT = "gptcourse-bpe"
Pair = tuple[int, int]


@lru_cache(maxsize=1)
def byte_to_unicode() -> dict[int, str]:
    """GPT-2's printable stand-in for each byte (how HF vocab files spell tokens: a space is 'Ġ', a newline 'Ċ').

    Printable Latin-1 bytes stand for themselves; the other 68 get the characters 256, 257, ... in byte order.
    """
    keep = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1), *range(ord("®"), ord("ÿ") + 1)]
    mapping = {b: chr(b) for b in keep}
    for n, b in enumerate(b for b in range(256) if b not in mapping):
        mapping[b] = chr(256 + n)
    return mapping


def _printable(token: bytes) -> str:
    table = byte_to_unicode()
    return "".join(table[b] for b in token)


def _from_printable(text: str) -> bytes:
    table = {ch: b for b, ch in byte_to_unicode().items()}
    try:
        return bytes(table[ch] for ch in text)
    except KeyError as err:
        raise ValueError(f"{text!r} is not a byte-level token: {err.args[0]!r} stands for no byte") from None


def _text_bytes(text: str) -> bytes:
    # A lone surrogate (not a character, but a Python str may hold one) keeps the 3 bytes it stands for.
    return text.encode("utf-8", errors="surrogatepass")


def _check_text(text: Any, what: str) -> None:
    if not isinstance(text, str):
        raise TypeError(f"{what} must be a str, got {type(text).__name__}; decode bytes first (data.decode('utf-8'))")


def _split_special(text: str, specials: Collection[str]) -> list[tuple[str, bool]]:
    """[(piece, is_special)]: the text cut at every occurrence of a special token (longest first at a tie)."""
    if not specials:
        return [(text, False)]
    pattern = "|".join(regex.escape(s) for s in sorted(specials, key=len, reverse=True))
    pieces, start = [], 0
    for match in regex.finditer(pattern, text):
        if match.start() > start:
            pieces.append((text[start:match.start()], False))
        pieces.append((match.group(), True))
        start = match.end()
    if start < len(text):
        pieces.append((text[start:], False))
    return pieces


def pretoken_counts(text: str, specials: Collection[str], pattern: str) -> Counter[bytes]:
    """How often each pre-token (as bytes) occurs; special tokens cut the text and never take part."""
    compiled = regex.compile(pattern)
    counts: Counter[str] = Counter()
    for piece, special in _split_special(text, specials):
        if not special:
            counts.update(compiled.findall(piece))
    out: Counter[bytes] = Counter()
    for word, n in counts.items():
        out[_text_bytes(word)] += n
    return out


class _Greatest:
    """Heap key that puts the lexicographically greatest pair of byte strings first among equal counts."""

    __slots__ = ("key",)

    def __init__(self, key: tuple[bytes, bytes]) -> None:
        self.key = key

    def __lt__(self, other: _Greatest) -> bool:
        return self.key > other.key


def merge_pair(ids: Sequence[int], a: int, b: int, new: int) -> list[int]:
    """`ids` with each occurrence of the pair (a, b) replaced by `new`, left to right (so (a, a, a) with (a, a)
    gives (new, a))."""
    merged, j = [], 0
    while j < len(ids):
        if j + 1 < len(ids) and ids[j] == a and ids[j + 1] == b:
            merged.append(new)
            j += 2
        else:
            merged.append(ids[j])
            j += 1
    return merged


def train_merges(words: Counter[bytes], size: int) -> list[tuple[bytes, bytes]]:
    """Merges over pre-tokens with their counts until there are `size` tokens (or no pair is left).

    Incremental: `counts` holds every adjacent pair's frequency, `where` which pre-tokens may hold it; a merge
    rewrites only those pre-tokens and adjusts the counts of the pairs it removed and created. The heap holds
    (-count, tie key, pair) entries; an entry whose count is no longer the pair's is skipped when popped.
    A merge whose bytes an earlier merge already made (a+bc after ab+c) keeps that token's id, as Hugging Face's
    trainer does.
    """
    vocab = [bytes([b]) for b in range(256)]
    ids = {tok: i for i, tok in enumerate(vocab)}
    seqs = [list(w) for w in words]
    freq = list(words.values())
    counts: defaultdict[Pair, int] = defaultdict(int)
    where: defaultdict[Pair, set[int]] = defaultdict(set)
    for i, seq in enumerate(seqs):
        for pair in pairwise(seq):
            counts[pair] += freq[i]
            where[pair].add(i)
    heap = [(-n, _Greatest((vocab[a], vocab[b])), (a, b)) for (a, b), n in counts.items()]
    heapq.heapify(heap)
    merges: list[tuple[bytes, bytes]] = []
    while len(vocab) < size and heap:
        neg, _, pair = heapq.heappop(heap)
        if counts.get(pair, 0) != -neg or neg == 0:
            continue  # stale: the pair's count changed after this entry was pushed
        a, b = pair
        new = ids.setdefault(vocab[a] + vocab[b], len(vocab))
        if new == len(vocab):
            vocab.append(vocab[a] + vocab[b])
        merges.append((vocab[a], vocab[b]))
        changed: dict[Pair, int] = defaultdict(int)
        for i in where.pop(pair):
            seq, n = seqs[i], freq[i]
            merged = merge_pair(seq, a, b, new)
            if len(merged) == len(seq):
                continue  # listed under the pair earlier, no longer holds it
            for old in pairwise(seq):
                changed[old] -= n
            for fresh in pairwise(merged):
                changed[fresh] += n
                where[fresh].add(i)
            seqs[i] = merged
        for p, delta in changed.items():
            if delta:
                counts[p] += delta
                if counts[p] > 0:
                    heapq.heappush(heap, (-counts[p], _Greatest((vocab[p[0]], vocab[p[1]])), p))
                else:
                    del counts[p]
        counts.pop(pair, None)
    return merges


def _numbering(keys: Sequence[bytes | str], ids: Mapping[bytes | str, int]) -> list[int]:
    """The id `ids` gives each of `keys` (the tokens in the course's order), checking that `ids` numbers exactly
    those tokens, 0 .. n-1, each id once."""
    missing = [k for k in keys if k not in ids]
    extra = set(ids) - set(keys)
    if missing or extra:
        raise ValueError(f"ids must number exactly the 256 bytes, the merged tokens and the special tokens: "
                         f"{len(missing)} have no id (first {missing[:3]}), {len(extra)} are none of them "
                         f"(first {sorted(extra, key=repr)[:3]})")
    numbers = [ids[k] for k in keys]
    if sorted(numbers) != list(range(len(keys))):
        raise ValueError(f"ids must be 0 .. {len(keys) - 1}, each once, got {len(set(numbers))} distinct ids "
                         f"from {min(numbers)} to {max(numbers)}")
    return numbers


class BPETokenizer:
    """Byte-level BPE: by default ids 0-255 are the bytes, 256.. the merges in order, then the special tokens.

    Build one with `BPETokenizer.train(text, vocab_size)`, `BPETokenizer.load(path)`, `BPETokenizer.from_hf(t)`
    or from its parts, `BPETokenizer(merges, special_tokens, pattern)` (a prefix of a trained tokenizer's merges
    is the tokenizer that training to that smaller size gives). `ids` numbers the tokens another way, as a
    pretrained vocabulary does: each byte or merged token (its bytes) and each special token (its str) -> its id.
    """

    def __init__(self, merges: Sequence[tuple[bytes, bytes]], special_tokens: Sequence[str] = ("<|endoftext|>",),
                 pattern: str = GPT2_PATTERN, ids: Mapping[bytes | str, int] | None = None) -> None:
        vocab = [bytes([b]) for b in range(256)]
        ranks: dict[Pair, tuple[int, int]] = {}  # (left, right) -> (rank, merged token), in the course's order
        order = {tok: i for i, tok in enumerate(vocab)}
        for rank, (left, right) in enumerate(merges):
            if left not in order or right not in order:
                missing = left if left not in order else right
                raise ValueError(f"merge {rank} ({left!r}, {right!r}) uses {missing!r}, which no earlier merge made")
            if (order[left], order[right]) in ranks:
                raise ValueError(f"merge {rank} ({left!r}, {right!r}) is listed twice")
            new = order.setdefault(left + right, len(vocab))
            if new == len(vocab):
                vocab.append(left + right)
            ranks[order[left], order[right]] = (rank, new)
        special_tokens = list(special_tokens)
        if len(set(special_tokens)) != len(special_tokens) or not all(special_tokens):
            raise ValueError(f"special tokens must be distinct non-empty strings, got {special_tokens}")
        keys: list[bytes | str] = [*vocab, *special_tokens]
        number = list(range(len(keys))) if ids is None else _numbering(keys, ids)
        self.pattern = pattern
        self._compiled = regex.compile(pattern)
        self._ranks = {(number[a], number[b]): (rank, number[new]) for (a, b), (rank, new) in ranks.items()}
        self._byte_ids = number[:256]
        self._merges = [(bytes(a), bytes(b)) for a, b in merges]
        self.special_tokens: dict[str, int] = {s: number[len(vocab) + k] for k, s in enumerate(special_tokens)}
        self._vocab = [b""] * len(keys)  # id -> bytes
        for key, i in zip(keys, number, strict=True):
            self._vocab[i] = _text_bytes(key) if isinstance(key, str) else key
        self._renumbered = number != sorted(number)
        self._cache: dict[bytes, list[int]] = {}

    # ---- building

    @classmethod
    def train(cls, text: str, vocab_size: int, special_tokens: Sequence[str] = ("<|endoftext|>",),
              pattern: str = GPT2_PATTERN) -> BPETokenizer:
        """Merge until there are `vocab_size` tokens, special tokens included (fewer if `text` runs out of pairs).

        Merge order: the most frequent adjacent pair within pre-tokens; a tie goes to the lexicographically
        greatest (left bytes, right bytes). Special tokens cut the text and are never merged with anything.
        """
        _check_text(text, "the training text")
        special_tokens = tuple(special_tokens)
        if not isinstance(vocab_size, int) or vocab_size < 256 + len(special_tokens):
            raise ValueError(f"vocab_size must be an int >= 256 + {len(special_tokens)} (the bytes and the special "
                             f"tokens {list(special_tokens)}), got {vocab_size!r}")
        words = pretoken_counts(text, special_tokens, pattern)
        return cls(train_merges(words, vocab_size - len(special_tokens)), special_tokens, pattern)

    # ---- what it is

    @property
    def merges(self) -> list[tuple[bytes, bytes]]:
        """The merges in the order they were learned (in the default layout merge k made token 256 + k)."""
        return list(self._merges)

    @property
    def vocab(self) -> dict[int, bytes]:
        """id -> the bytes it stands for (a special token: its UTF-8 text)."""
        return dict(enumerate(self._vocab))

    @property
    def vocab_size(self) -> int:
        return len(self._vocab)

    def __repr__(self) -> str:
        return (f"BPETokenizer(vocab_size={self.vocab_size}: 256 bytes, {len(self._merges)} merges, "
                f"special tokens {list(self.special_tokens)})")

    # ---- encoding and decoding

    def _encode_word(self, word: bytes) -> list[int]:
        cached = self._cache.get(word)
        if cached is not None:
            return cached
        ids = [self._byte_ids[b] for b in word]
        ranks, never = self._ranks, (1 << 62, 0)
        while len(ids) > 1:
            best = min(pairwise(ids), key=lambda p: ranks.get(p, never))
            if best not in ranks:
                break
            ids = merge_pair(ids, *best, ranks[best][1])
        if len(self._cache) < 200_000:
            self._cache[word] = ids
        return ids

    def encode(self, text: str, allowed_special: Literal["all", "none"] | Collection[str] = frozenset()) -> list[int]:
        """Token ids of `text`. The string of a special token in `allowed_special` ("all" or a set of them) becomes
        its one id. By default, as in tiktoken, text holding any other special token's string is refused with a
        ValueError (it may come from a user); "none" encodes every such string as plain text, byte by byte."""
        _check_text(text, "the text to encode")
        if allowed_special == "all":
            allowed: Collection[str] = self.special_tokens
        elif allowed_special == "none":
            allowed = ()
        else:
            unknown = set(allowed_special) - set(self.special_tokens)
            if isinstance(allowed_special, str) or unknown:
                raise ValueError(f"allowed_special must be 'all', 'none' or a set of this tokenizer's special tokens "
                                 f"{list(self.special_tokens)}, got {allowed_special!r}")
            allowed = allowed_special
        refused = () if allowed_special == "none" else set(self.special_tokens) - set(allowed)
        out: list[int] = []
        for piece, special in _split_special(text, allowed):
            if special:
                out.append(self.special_tokens[piece])
                continue
            found = next((p for p, s in _split_special(piece, refused) if s), None)
            if found is not None:
                raise ValueError(f"the text contains the special token {found!r}: pass allowed_special={{{found!r}}} "
                                 f"(or 'all') to encode it as its id {self.special_tokens[found]}, or "
                                 f"allowed_special='none' to encode it as plain text")
            for word in self._compiled.findall(piece):
                out.extend(self._encode_word(_text_bytes(word)))
        return out

    def decode_bytes(self, ids: Iterable[int]) -> bytes:
        out = []
        for i in ids:
            i = int(i)
            if not 0 <= i < len(self._vocab):
                raise ValueError(f"token id {i} is out of range: expected 0 <= id < {len(self._vocab)}")
            out.append(self._vocab[i])
        return b"".join(out)

    def decode(self, ids: Iterable[int], errors: str = "replace") -> str:
        """The text of `ids`: all the tokens' bytes joined, then decoded once as UTF-8 (a character may span
        several tokens). Invalid bytes become U+FFFD; errors="surrogatepass" gives a lone surrogate back."""
        return self.decode_bytes(ids).decode("utf-8", errors=errors)

    # ---- files

    def save(self, path: str | Path) -> None:
        """A readable JSON file: the pattern, the special tokens, and the merges spelled as in GPT-2's merges.txt
        (each byte as its printable stand-in: 'Ġ' is a space); and every token's id where they are not the
        default layout's (a pretrained vocabulary's)."""
        data: dict[str, Any] = {"format": FORMAT, "version": 1, "pattern": self.pattern,
                                "special_tokens": list(self.special_tokens),
                                "merges": [f"{_printable(a)} {_printable(b)}" for a, b in self.merges]}
        if self._renumbered:
            data["ids"] = {"tokens": self._printable_ids(), "special_tokens": self.special_tokens}
        Path(path).write_text(json.dumps(data, indent=1, ensure_ascii=False) + "\n", encoding="utf-8")

    @classmethod
    def load(cls, path: str | Path) -> BPETokenizer:
        data = json.loads(Path(path).read_text(encoding="utf-8"))
        if not isinstance(data, dict) or data.get("format") != FORMAT:
            raise ValueError(f"{path} is not a file written by BPETokenizer.save (no \"format\": {FORMAT!r})")
        merges = []
        for line in data["merges"]:
            left, right = line.split(" ")
            merges.append((_from_printable(left), _from_printable(right)))
        ids = None
        if "ids" in data:
            ids = {_from_printable(t): i for t, i in data["ids"]["tokens"].items()} | data["ids"]["special_tokens"]
        return cls(merges, data["special_tokens"], data["pattern"], ids)

    # ---- Hugging Face tokenizers

    def _printable_ids(self) -> dict[str, int]:
        """Each byte or merged token, spelled as in GPT-2's vocab.json, -> its id."""
        specials = set(self.special_tokens.values())
        return {_printable(tok): i for i, tok in enumerate(self._vocab) if i not in specials}

    def to_hf(self) -> Any:
        """The same tokenizer as a Hugging Face `tokenizers.Tokenizer` (the Rust BPE model): same vocabulary and
        ids, merges, pre-tokenizer regex and special tokens, so it encodes every text to the same ids (a
        `tokenizers.Tokenizer` always encodes special tokens: `encode(text, allowed_special="all")`)."""
        from tokenizers import AddedToken, Regex, Tokenizer, decoders, models, pre_tokenizers

        vocab = self._printable_ids()
        clash = sorted(set(vocab) & set(self.special_tokens))
        if clash:
            raise ValueError(f"special tokens {clash} are spelled like merged tokens: a tokenizers vocabulary cannot "
                             f"hold both")
        merges = [(_printable(a), _printable(b)) for a, b in self.merges]
        tokenizer = Tokenizer(models.BPE(vocab=vocab | self.special_tokens, merges=merges))
        tokenizer.pre_tokenizer = pre_tokenizers.Sequence([
            pre_tokenizers.Split(Regex(self.pattern), behavior="isolated"),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
        ])
        tokenizer.decoder = decoders.ByteLevel()
        tokenizer.add_special_tokens([AddedToken(s, special=True, normalized=False) for s in self.special_tokens])
        return tokenizer

    @classmethod
    def from_hf(cls, tokenizer: Any, pattern: str | None = None) -> BPETokenizer:
        """A BPETokenizer from a byte-level `tokenizers.Tokenizer` (GPT-2's, or one trained with `tokenizers`),
        with its own ids: the same merges, vocabulary and special tokens, so it encodes every text to the ids
        `tokenizer` gives. The pre-tokenizer regex is read from `tokenizer` (GPT-2's for a plain ByteLevel one)
        unless `pattern` is given. What this class cannot reproduce (a normalizer, a prefix space, dropout, an
        unknown token, a post-processor that adds tokens, added tokens that are not special) is refused rather than
        encoded differently."""
        spec = json.loads(tokenizer.to_str())
        model = spec["model"]
        if model.get("type") != "BPE":
            raise ValueError(f"expected a byte-level BPE tokenizer, got a {model.get('type')} model")
        options = [k for k in ("dropout", "unk_token", "continuing_subword_prefix", "end_of_word_suffix",
                               "byte_fallback", "ignore_merges") if model.get(k)]
        post = spec.get("post_processor")
        if post is not None and post.get("type") != "ByteLevel":
            options.append(f"{post.get('type')} post-processor")  # it may add tokens, as Llama's adds a BOS
        if spec.get("normalizer"):
            options.append("normalizer")
        if options:
            raise ValueError(f"this tokenizer's {', '.join(options)} would encode differently from BPETokenizer "
                             f"(a plain byte-level BPE): not supported")
        added = spec.get("added_tokens") or []
        plain = [t["content"] for t in added if not t["special"]]
        if plain:
            raise ValueError(f"added tokens that are not special ({plain[:3]}) are not supported")
        specials = {t["content"]: t["id"] for t in sorted(added, key=lambda t: t["id"])}
        ids: dict[bytes | str, int] = dict(specials)
        for token, i in model["vocab"].items():
            if token not in specials:
                ids[_from_printable(token)] = i
        merges = [m.split(" ") if isinstance(m, str) else m for m in model["merges"]]
        return cls([(_from_printable(a), _from_printable(b)) for a, b in merges], list(specials),
                   pattern if pattern is not None else _hf_pattern(spec.get("pre_tokenizer")), ids)


def _is_byte_level(step: Any, use_regex: bool) -> bool:
    """Whether `step` (a pre-tokenizer's JSON) is ByteLevel without a prefix space, using its regex or not."""
    return (isinstance(step, dict) and step.get("type") == "ByteLevel" and not step.get("add_prefix_space")
            and step.get("use_regex", True) == use_regex)


def _hf_pattern(pre: Any) -> str:
    """The pre-tokenizer regex of a `tokenizers` pre-tokenizer: GPT-2's for a plain ByteLevel one (its built-in
    regex is GPT-2's), the Split's for a regex Split then a ByteLevel without its regex (as `to_hf()` writes)."""
    if _is_byte_level(pre, use_regex=True):
        return GPT2_PATTERN
    steps = pre.get("pretokenizers", []) if isinstance(pre, dict) and pre.get("type") == "Sequence" else []
    if len(steps) == 2 and _is_byte_level(steps[1], use_regex=False):
        split = steps[0]
        if split.get("type") == "Split" and split.get("behavior") == "Isolated" and not split.get("invert") \
                and "Regex" in split.get("pattern", {}):
            return split["pattern"]["Regex"]
    raise ValueError(f"expected a ByteLevel pre-tokenizer without a prefix space (or a regex Split then ByteLevel, "
                     f"as to_hf() writes), got {json.dumps(pre)[:200]}; pass pattern= to say which regex it uses")
