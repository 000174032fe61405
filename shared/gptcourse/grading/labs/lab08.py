"""Lab 08, a byte-level BPE tokenizer: `count_pairs(ids)`, `merge_pair(ids, pair, new_id)`,
`train_bpe(text, vocab_size)`, `encode(text, merges)` and `decode(ids, merges)`.

Ids 0-255 are the bytes; merge k (a pair of ids) makes id 256 + k. `train_bpe` pre-tokenizes with GPT-2's regex
(`gptcourse.GPT2_PATTERN`) and breaks ties between equally frequent pairs towards the lexicographically greatest
pair of byte strings, as `gptcourse.BPETokenizer` does; the expected values come from that class. A wrong result
is compared with what the usual mistakes give (ties broken the other way, overlapping pairs merged twice, no
pre-tokenization, decoding token by token), and the diagnostic names the first wrong merge or the first position
where the ids differ, in bytes.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Mapping
from itertools import pairwise
from typing import Any

import regex
import torch

from ...checks import fail
from ...text.bpe import GPT2_PATTERN, BPETokenizer
from ...text.corpus import load_text
from ..cases import Inputs, Outputs, case_family, register, sizes_rng

_REFERENCE = ("gptcourse.BPETokenizer", "gptcourse.text.bpe")
FORBIDDEN: dict[str, tuple[str, ...]] = {piece: _REFERENCE for piece in ("count", "merge", "train", "encode",
                                                                          "decode")}
Pair = tuple[int, int]


def vocab_of(merges: list[Pair]) -> dict[int, bytes]:
    """id -> bytes for ids 0 .. 255 + len(merges)."""
    vocab = {i: bytes([i]) for i in range(256)}
    for k, (a, b) in enumerate(merges):
        vocab[256 + k] = vocab[a] + vocab[b]
    return vocab


def merge_ids(tok: BPETokenizer) -> list[Pair]:
    """The reference tokenizer's merges as pairs of ids (merge k makes id 256 + k)."""
    ids = {tok_bytes: i for i, tok_bytes in tok.vocab.items() if i < 256 + len(tok.merges)}
    return [(ids[a], ids[b]) for a, b in tok.merges]


def _as_ids(value: Any, what: str) -> list[int]:
    if isinstance(value, torch.Tensor):
        value = value.tolist()
    if not isinstance(value, (list, tuple)) or not all(isinstance(i, int) and not isinstance(i, bool) for i in value):
        raise fail(f"{what} returned {value!r:.80}, expected a list of int ids")
    return list(value)


def _ids_tensor(ids: list[int]) -> torch.Tensor:
    return torch.tensor(ids, dtype=torch.int64).reshape(-1)


def _name(i: int, vocab: Mapping[int, bytes]) -> str:
    return f"{i} {vocab[i]!r}" if i in vocab else str(i)


def _show(ids: list[int], vocab: Mapping[int, bytes], limit: int = 6) -> str:
    return "[" + ", ".join(_name(i, vocab) for i in ids[:limit]) + (", ...]" if len(ids) > limit else "]")


def first_difference(got: list[int], expected: list[int], vocab: Mapping[int, bytes], what: str) -> str:
    """"encode(...): the ids differ first at position 3: got 300 b'ing', expected 280 b'in'" (or the lengths)."""
    k = next((k for k, (g, e) in enumerate(zip(got, expected, strict=False)) if g != e), min(len(got), len(expected)))
    if k < len(got) and k < len(expected):
        where = (f"the ids differ first at position {k}: got {_name(got[k], vocab)}, expected "
                 f"{_name(expected[k], vocab)}")
    else:
        where = f"{len(got)} ids, expected {len(expected)}; the first {k} agree"
    return f"{what}: {where}. From there you have {_show(got[k:], vocab)}, expected {_show(expected[k:], vocab)}"


def pretokens(text: str, pretokenize: bool = True) -> Counter[tuple[int, ...]]:
    """Each pre-token's bytes (as ids) with its count; without pre-tokenization, the whole text is one."""
    words = regex.findall(GPT2_PATTERN, text) if pretokenize else [text]
    return Counter(tuple(w.encode("utf-8")) for w in words)


def replace_pair(word: tuple[int, ...], pair: Pair, new: int, overlap: bool = False) -> tuple[int, ...]:
    """Each occurrence of `pair` in `word` replaced by `new`, left to right; `overlap` is the mistake of reusing
    the right half of a replaced pair."""
    out, i = [], 0
    while i < len(word):
        if i + 1 < len(word) and (word[i], word[i + 1]) == pair:
            out.append(new)
            i += 1 if overlap else 2
        else:
            out.append(word[i])
            i += 1
    return tuple(out)


def _pair_counts(words: Mapping[tuple[int, ...], int], weighted: bool = True) -> Counter[Pair]:
    counts: Counter[Pair] = Counter()
    for word, n in words.items():
        for pair in pairwise(word):
            counts[pair] += n if weighted else 1
    return counts


TIE_RULES: dict[str, Callable[[list[Pair], dict[int, bytes]], Pair]] = {
    "greatest": lambda tied, vocab: max(tied, key=lambda p: (vocab[p[0]], vocab[p[1]])),
    "least": lambda tied, vocab: min(tied, key=lambda p: (vocab[p[0]], vocab[p[1]])),
    "first": lambda tied, vocab: tied[0],
    "ids": lambda tied, vocab: max(tied),
}


def slow_train(text: str, vocab_size: int, tie: str = "greatest", pretokenize: bool = True, weighted: bool = True,
               overlap: bool = False) -> list[Pair]:
    """A plain trainer, right or with one of the usual mistakes, for the diagnostics."""
    words = pretokens(text, pretokenize)
    vocab = vocab_of([])
    merges: list[Pair] = []
    while 256 + len(merges) < vocab_size:
        counts = _pair_counts(words, weighted)
        if not counts:
            break
        top = max(counts.values())
        pair = TIE_RULES[tie]([p for p, n in counts.items() if n == top], vocab)
        new = 256 + len(merges)
        merges.append(pair)
        vocab[new] = vocab[pair[0]] + vocab[pair[1]]
        merged: Counter[tuple[int, ...]] = Counter()
        for word, n in words.items():
            merged[replace_pair(word, pair, new, overlap)] += n
        words = merged
    return merges


# ---- count_pairs(ids) -> {(a, b): how often b follows a}


def _as_pair_counts(value: Any, what: str) -> torch.Tensor:
    if not isinstance(value, Mapping):
        raise fail(f"{what} returned {type(value).__name__}, expected a dict {{(a, b): count}}")
    rows = []
    for pair, n in value.items():
        if not (isinstance(pair, tuple) and len(pair) == 2 and all(isinstance(i, int) for i in pair)):
            raise fail(f"{what}: key {pair!r:.40} is not a pair of ids; the keys are tuples (a, b) of two ints")
        if not isinstance(n, int) or isinstance(n, bool):
            raise fail(f"{what}: the count of {pair} is {n!r:.40}, expected an int")
        rows.append((pair[0], pair[1], n))
    return torch.tensor(sorted(rows), dtype=torch.int64).reshape(-1, 3)  # (N, 3): a, b, count


def _count_what(inputs: Inputs) -> str:
    return f"count_pairs({inputs['ids']!r:.60})"


def _count_run(fn: Any, inputs: Inputs) -> Outputs:
    return {"counts": _as_pair_counts(fn(list(inputs["ids"])), _count_what(inputs))}


def _count_reference(inputs: Inputs) -> Outputs:
    return {"counts": _as_pair_counts(dict(Counter(pairwise(inputs["ids"]))), "the reference")}


def _table(rows: torch.Tensor) -> dict[Pair, int]:
    return {(int(a), int(b)): int(n) for a, b, n in rows.tolist()}


def _count_judge(got: Outputs, expected: Outputs, inputs: Inputs) -> None:
    g, e, ids = _table(got["counts"]), _table(expected["counts"]), inputs["ids"]
    if g == e:
        return
    what = _count_what(inputs)
    if set(g) == set(e) and all(n == 1 for n in g.values()):
        raise fail(f"{what}: every pair is counted once: count how *often* each adjacent pair occurs.")
    missing = sorted(set(e) - set(g))
    if missing == [(ids[-2], ids[-1])] and e[missing[0]] == 1:
        raise fail(f"{what}: the last pair {missing[0]} is missing: there are len(ids) - 1 adjacent pairs, and "
                   "zip(ids, ids[1:]) gives them all.")
    if missing:
        raise fail(f"{what}: the pair {missing[0]} occurs {e[missing[0]]} time(s) (as ids[i], ids[i + 1]) but is "
                   "not in your result.")
    extra = sorted(set(g) - set(e))
    if extra:
        raise fail(f"{what}: {extra[0]} is not an adjacent pair of the ids (each key is (ids[i], ids[i + 1])).")
    pair = next(p for p in sorted(e) if g[p] != e[p])
    raise fail(f"{what}: the pair {pair} is counted {g[pair]} times, expected {e[pair]} (overlapping occurrences "
               "count: (1, 1, 1) holds the pair (1, 1) twice).")


_count_case = case_family(_count_run, _count_reference, _count_judge)


def _random_ids(seed: int) -> list[int]:
    r = sizes_rng(seed)
    alphabet = r.sample(range(300), r.randint(2, 5))
    return [r.choice(alphabet) for _ in range(r.randint(8, 30))]


register(
    _count_case("08.count.visible", "count_pairs of the bytes of 'aaabdaaabac'",
                lambda seed: {"ids": list(b"aaabdaaabac")}),
    _count_case("08.count.hidden_short", "count_pairs of a single id (no pairs)", lambda seed: {"ids": [7]},
                hidden=True),
    _count_case("08.count.hidden_random", "count_pairs of other ids", lambda seed: {"ids": _random_ids(seed)},
                hidden=True),
)

# ---- merge_pair(ids, pair, new_id) -> ids with each occurrence of pair replaced, left to right


def _merge_inputs(ids: list[int], pair: Pair, new_id: int) -> Inputs:
    return {"ids": ids, "pair": pair, "new_id": new_id}


def _merge_what(inputs: Inputs) -> str:
    return f"merge_pair({inputs['ids']!r:.50}, {inputs['pair']}, {inputs['new_id']})"


def _merge_run(fn: Any, inputs: Inputs) -> Outputs:
    out = fn(list(inputs["ids"]), tuple(inputs["pair"]), inputs["new_id"])
    return {"ids": _ids_tensor(_as_ids(out, _merge_what(inputs)))}


def _merge_reference(inputs: Inputs) -> Outputs:
    return {"ids": _ids_tensor(list(replace_pair(tuple(inputs["ids"]), inputs["pair"], inputs["new_id"])))}


def _merge_judge(got: Outputs, expected: Outputs, inputs: Inputs) -> None:
    g, e = got["ids"].tolist(), expected["ids"].tolist()
    if g == e:
        return
    ids, (a, b), new = tuple(inputs["ids"]), inputs["pair"], inputs["new_id"]
    mistakes = {
        f"the right half of a replaced pair is used again: after replacing ids[i], ids[i + 1] by {new}, continue "
        "at i + 2 (so overlapping occurrences merge once: (97, 97, 97) with (97, 97) gives (256, 97))":
            replace_pair(ids, (a, b), new, overlap=True),
        "the pair was merged the wrong way round: (a, b) means a followed by b": replace_pair(ids, (b, a), new),
    }
    first = next((i for i in range(len(ids) - 1) if ids[i:i + 2] == (a, b)), None)
    if first is not None:
        mistakes["only the first occurrence was replaced: replace every one, left to right"] = (
            (*ids[:first], new, *ids[first + 2:]))
    for why, wrong in mistakes.items():
        if list(wrong) == g and list(wrong) != e:
            raise fail(f"{_merge_what(inputs)}: {why}.")
    raise fail(first_difference(g, e, {}, _merge_what(inputs)) + ".")


_merge_case = case_family(_merge_run, _merge_reference, _merge_judge)


def _merge_hidden(seed: int) -> Inputs:
    ids = _random_ids(seed)
    return _merge_inputs(ids, (ids[1], ids[2]), 300 + sizes_rng(seed).randint(0, 50))


register(
    _merge_case("08.merge.visible", "merge_pair of 'aaabdaaabac' with (97, 98) 'ab' -> 256",
                lambda seed: _merge_inputs(list(b"aaabdaaabac"), (97, 98), 256)),
    _merge_case("08.merge.overlap", "merge_pair of 'aaaaa' with (97, 97) 'aa' -> 256 (overlapping occurrences)",
                lambda seed: _merge_inputs(list(b"aaaaa"), (97, 97), 256)),
    _merge_case("08.merge.hidden_end", "merge_pair with the pair at the very end",
                lambda seed: _merge_inputs([5, 9, 5, 5, 9, 1, 5, 9], (5, 9), 300), hidden=True),
    _merge_case("08.merge.hidden_random", "merge_pair of other ids", _merge_hidden, hidden=True),
)

# ---- train_bpe(text, vocab_size) -> merges [(a, b), ...], merge k makes id 256 + k


TRAIN_MISTAKES = {
    "ties are broken the other way: among equally frequent pairs take the lexicographically *greatest* pair of "
    "byte strings, max(tied, key=lambda p: (vocab[p[0]], vocab[p[1]]))": {"tie": "least"},
    "ties are broken by which pair was counted first: among equally frequent pairs take the lexicographically "
    "greatest pair of byte strings, (vocab[a], vocab[b])": {"tie": "first"},
    "ties are broken by the ids, not by the bytes: compare (vocab[a], vocab[b]), the byte strings (a merged "
    "token's id says nothing about its bytes)": {"tie": "ids"},
    "the right half of a merged pair is used again (merge_pair must continue at i + 2 after a replacement), so "
    "overlapping occurrences are merged twice":
        {"overlap": True},
    "the text is not pre-tokenized: split it with regex.findall(GPT2_PATTERN, text) and count pairs only inside "
    "each piece, so that no merge crosses a word boundary": {"pretokenize": False},
    "each distinct pre-token is counted once: weight its pairs by how often the pre-token occurs":
        {"weighted": False},
}


def _train_what(inputs: Inputs) -> str:
    return f"train_bpe({inputs['text']!r:.40}, vocab_size={inputs['vocab_size']})"


def _as_merges(value: Any, what: str) -> torch.Tensor:
    if not isinstance(value, (list, tuple)) or not all(
            isinstance(m, tuple) and len(m) == 2 and all(isinstance(i, int) for i in m) for m in value):
        raise fail(f"{what} returned {value!r:.80}, expected a list of merges, each a tuple (a, b) of two ids")
    return torch.tensor(list(value), dtype=torch.int64).reshape(-1, 2)  # (M, 2)


def _train_run(fn: Any, inputs: Inputs) -> Outputs:
    return {"merges": _as_merges(fn(inputs["text"], inputs["vocab_size"]), _train_what(inputs))}


def _train_reference(inputs: Inputs) -> Outputs:
    tok = BPETokenizer.train(inputs["text"], inputs["vocab_size"], special_tokens=())
    return {"merges": torch.tensor(merge_ids(tok), dtype=torch.int64).reshape(-1, 2)}


def _pair_bytes(pair: Pair, vocab: Mapping[int, bytes]) -> str:
    return f"({vocab[pair[0]]!r}, {vocab[pair[1]]!r})" if all(i in vocab for i in pair) else "(ids never made)"


def _why_not(got: Pair, want: Pair, text: str, merges: list[Pair]) -> str:
    """The counts of both pairs once the merges that agree are applied."""
    words = pretokens(text)
    for k, pair in enumerate(merges):
        words = Counter({replace_pair(w, pair, 256 + k): n for w, n in words.items()})
    counts = _pair_counts(words)
    if counts[got] == counts[want]:
        return f"both occur {counts[want]} times, and a tie goes to the lexicographically greatest pair of byte strings"
    return f"the expected pair occurs {counts[want]} times, yours {counts[got]}"


def _train_judge(got: Outputs, expected: Outputs, inputs: Inputs) -> None:
    g = [tuple(m) for m in got["merges"].tolist()]
    e = [tuple(m) for m in expected["merges"].tolist()]
    if g == e:
        return
    what = _train_what(inputs)
    for why, flags in TRAIN_MISTAKES.items():
        wrong = slow_train(inputs["text"], inputs["vocab_size"], **flags)
        if wrong == g and wrong != e:
            raise fail(f"{what}: {why}.")
    vocab = vocab_of(e)
    k = next((k for k, (a, b) in enumerate(zip(g, e, strict=False)) if a != b), None)
    if k is None:
        if len(g) < len(e):
            raise fail(f"{what}: {len(g)} merges, expected {len(e)}: keep merging until there are vocab_size tokens "
                       "(256 bytes + one per merge).")
        raise fail(f"{what}: {len(g)} merges, expected {len(e)}: stop at vocab_size - 256 merges, or earlier when no "
                   "pair is left (every pre-token is a single token).")
    raise fail(f"{what}: merge {k} (making id {256 + k}) is {g[k]} = {_pair_bytes(g[k], vocab)}, expected {e[k]} = "
               f"{_pair_bytes(e[k], vocab)}: {_why_not(g[k], e[k], inputs['text'], e[:k])}. The {k} merges before "
               "it agree.")


_train_case = case_family(_train_run, _train_reference, _train_judge)

VISIBLE_TEXT = ("def add(a, b):\n    return a + b\n\n\ndef sub(a, b):\n    return a - b\n\n\n"
                "def mul(a, b):\n    return a * b\n")
TIES_TEXT = "low lower lowest newer wider new wide wider newest widest"  # after Sennrich et al.: many ties


def _corpus_slice(seed: int, length: int) -> str:
    corpus = load_text()
    start = sizes_rng(seed).randint(0, len(corpus) - length)
    return corpus[start:start + length]


register(
    _train_case("08.train.visible", "train_bpe on three small Python functions, vocab_size=276",
                lambda seed: {"text": VISIBLE_TEXT, "vocab_size": 276}),
    _train_case("08.train.ties", f"train_bpe({TIES_TEXT!r}, vocab_size=270): many ties",
                lambda seed: {"text": TIES_TEXT, "vocab_size": 270}),
    _train_case("08.train.hidden_corpus", "train_bpe on 3,000 characters of the course corpus, vocab_size=320",
                lambda seed: {"text": _corpus_slice(seed, 3000), "vocab_size": 320}, hidden=True),
    _train_case("08.train.hidden_unicode", "train_bpe on text with accents, CJK and emoji (multi-byte UTF-8)",
                lambda seed: {"text": "café crème, 日本語と日本, 😀😀 😀! " * 3 + "naïve café", "vocab_size": 290},
                hidden=True),
    _train_case("08.train.hidden_exhausted", "train_bpe asked for more tokens than the text has pairs to merge",
                lambda seed: {"text": "ab ab abc", "vocab_size": 300}, hidden=True),
)

# ---- encode(text, merges) -> ids


def _trained_merges(text: str, vocab_size: int) -> list[Pair]:
    return merge_ids(BPETokenizer.train(text, vocab_size, special_tokens=()))


def _encode_what(inputs: Inputs) -> str:
    return f"encode({inputs['text']!r:.40}, merges)"


def _encode_run(fn: Any, inputs: Inputs) -> Outputs:
    return {"ids": _ids_tensor(_as_ids(fn(inputs["text"], list(inputs["merges"])), _encode_what(inputs)))}


def _encode_reference(inputs: Inputs) -> Outputs:
    vocab = vocab_of(inputs["merges"])
    tok = BPETokenizer([(vocab[a], vocab[b]) for a, b in inputs["merges"]], special_tokens=())
    return {"ids": _ids_tensor(tok.encode(inputs["text"]))}


def _encode_with(text: str, merges: list[Pair], newest_first: bool = False, pretokenize: bool = True) -> list[int]:
    """Each merge applied to each pre-token, one merge after the other (oldest first, or the mistake)."""
    order = range(len(merges) - 1, -1, -1) if newest_first else range(len(merges))
    out: list[int] = []
    for word in regex.findall(GPT2_PATTERN, text) if pretokenize else [text]:
        ids = tuple(word.encode("utf-8"))
        for k in order:
            ids = replace_pair(ids, merges[k], 256 + k)
        out.extend(ids)
    return out


def _longest_match(text: str, merges: list[Pair]) -> list[int]:
    """The mistake of greedy longest-match tokenization with BPE's vocabulary."""
    ids = {b: i for i, b in vocab_of(merges).items()}
    out: list[int] = []
    for piece in regex.findall(GPT2_PATTERN, text):
        data, i = piece.encode("utf-8"), 0
        while i < len(data):
            j = next(j for j in range(len(data), i, -1) if data[i:j] in ids)
            out.append(ids[data[i:j]])
            i = j
    return out


def _encode_judge(got: Outputs, expected: Outputs, inputs: Inputs) -> None:
    g, e = got["ids"].tolist(), expected["ids"].tolist()
    if g == e:
        return
    merges, text = inputs["merges"], inputs["text"]
    mistakes = {
        "the text is not pre-tokenized: split it with regex.findall(GPT2_PATTERN, text) and encode each piece on "
        "its own, as training did": _encode_with(text, merges, pretokenize=False),
        "the merges are applied newest first: apply them in the order they were learned (merge 0 first), since a "
        "later merge builds on earlier ones": _encode_with(text, merges, newest_first=True),
        "the ids are the raw bytes: apply the merges": list(text.encode("utf-8")),
        "each piece was cut into the longest tokens of the vocabulary, left to right: that is not BPE; apply the "
        "merges one after the other, in the order they were learned": _longest_match(text, merges),
    }
    for why, wrong in mistakes.items():
        if wrong == g and wrong != e:
            raise fail(f"{_encode_what(inputs)}: {why}.")
    raise fail(first_difference(g, e, vocab_of(merges), _encode_what(inputs)) + ".")


_encode_case = case_family(_encode_run, _encode_reference, _encode_judge)
ENCODE_TEXT = "def div(a, b):\n    return a / b\n"

register(
    _encode_case("08.encode.visible", f"encode({ENCODE_TEXT!r}) with the merges of 08.train.visible",
                 lambda seed: {"merges": _trained_merges(VISIBLE_TEXT, 276), "text": ENCODE_TEXT}),
    _encode_case("08.encode.hidden_unicode", "encode a text with characters the training text never had",
                 lambda seed: {"merges": _trained_merges(VISIBLE_TEXT, 290),
                               "text": "def café(a, b):  # 日本 😀\n\treturn  a+b\n"}, hidden=True),
    _encode_case("08.encode.hidden_rank", "encode('abc abcd') with the merges (b'b', b'c') then (b'a', b'b'): the "
                 "rank decides, not the length", lambda seed: {"merges": [(98, 99), (97, 98), (32, 97), (257, 99)],
                                                              "text": "abc abcd"}, hidden=True),
    _encode_case("08.encode.hidden_corpus", "encode 1,000 characters of the corpus with merges learned on 3,000",
                 lambda seed: {"merges": _trained_merges(_corpus_slice(seed, 3000), 330),
                               "text": _corpus_slice(seed + 1, 1000)}, hidden=True),
)

# ---- decode(ids, merges) -> text


def _decode_what(inputs: Inputs) -> str:
    return f"decode({inputs['ids']!r:.50}, merges)"


def _decode_run(fn: Any, inputs: Inputs) -> Outputs:
    try:
        text = fn(list(inputs["ids"]), list(inputs["merges"]))
    except UnicodeDecodeError as err:  # the mistake this piece teaches: the judge explains it
        return {"text": "", "error": f"UnicodeDecodeError: {err}"[:300]}
    if not isinstance(text, str):
        raise fail(f"{_decode_what(inputs)} returned {type(text).__name__} {text!r:.60}, expected a str")
    return {"text": text, "error": ""}


def _decode_reference(inputs: Inputs) -> Outputs:
    vocab = vocab_of(inputs["merges"])
    tok = BPETokenizer([(vocab[a], vocab[b]) for a, b in inputs["merges"]], special_tokens=())
    return {"text": tok.decode(inputs["ids"]), "error": ""}


SPLIT_HINT = ("a character's UTF-8 bytes can be spread over several tokens (😀 is 4 bytes), so join the bytes of "
              "all the tokens first and decode once: b''.join(vocab[i] for i in ids).decode('utf-8', "
              "errors='replace')")


def _decode_judge(got: Outputs, expected: Outputs, inputs: Inputs) -> None:
    what = _decode_what(inputs)
    if got["error"]:
        raise fail(f"{what} raised {got['error']}: {SPLIT_HINT}; errors='replace' turns bytes that are not UTF-8 "
                   "into U+FFFD instead of raising.")
    g, e = got["text"], expected["text"]
    if g == e:
        return
    vocab = vocab_of(inputs["merges"])
    if g == "".join(vocab[i].decode("utf-8", "replace") for i in inputs["ids"]):
        raise fail(f"{what} returned {g!r:.60}, expected {e!r:.60}: each token was decoded on its own; {SPLIT_HINT}.")
    k = next((k for k, (a, b) in enumerate(zip(g, e, strict=False)) if a != b), min(len(g), len(e)))
    raise fail(f"{what} returned {g!r:.80}, expected {e!r:.80}: they differ first at character {k}.")


_decode_case = case_family(_decode_run, _decode_reference, _decode_judge)


def _decode_inputs(merges: list[Pair], text: str) -> Inputs:
    vocab = vocab_of(merges)
    tok = BPETokenizer([(vocab[a], vocab[b]) for a, b in merges], special_tokens=())
    return {"merges": merges, "ids": tok.encode(text)}


register(
    _decode_case("08.decode.visible", "decode the ids of 'def add(a, b):' with the merges of 08.train.visible",
                 lambda seed: _decode_inputs(_trained_merges(VISIBLE_TEXT, 276), "def add(a, b):")),
    _decode_case("08.decode.split", "decode ids whose tokens split characters: 'é' and '😀' as single bytes",
                 lambda seed: {"merges": _trained_merges(VISIBLE_TEXT, 276),
                               "ids": [*b"caf", *"é".encode(), 32, *"😀".encode()]}),
    _decode_case("08.decode.hidden_invalid", "decode ids holding bytes that are not UTF-8 (half an emoji, a stray "
                 "continuation byte): each becomes U+FFFD",
                 lambda seed: {"merges": _trained_merges(VISIBLE_TEXT, 276), "ids": [97, 0xF0, 0x9F, 32, 0x80, 98]},
                 hidden=True),
    _decode_case("08.decode.hidden_corpus", "decode 1,000 characters of the corpus",
                 lambda seed: _decode_inputs(_trained_merges(_corpus_slice(seed, 3000), 330),
                                             _corpus_slice(seed + 1, 1000)), hidden=True),
)
