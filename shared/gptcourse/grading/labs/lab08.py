"""Lab 08, a byte-level BPE tokenizer: `count_pairs(ids)`, `merge_pair(ids, pair, new_id)`,
`train_bpe(text, vocab_size)`, `encode(text, merges)` and `decode(ids, merges)`.

Ids 0-255 are the bytes; merge k (a pair of ids) makes id 256 + k. `train_bpe` pre-tokenizes with GPT-2's regex
(`gptcourse.GPT2_PATTERN`) and breaks ties between equally frequent pairs towards the lexicographically greatest
pair of byte strings, as `gptcourse.BPETokenizer` does. The references are that class (and its module's
`merge_pair`) behind the student's interface: the student's merges are pairs of ids, the class's pairs of byte
strings. A wrong result is compared with what the usual mistakes give (ties broken the other way, overlapping
pairs merged twice, no pre-tokenization, decoding token by token), and the diagnostic names the first wrong merge
or the first position where the ids differ, in bytes.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from functools import partial
from itertools import pairwise, zip_longest
from typing import Any

import regex
import torch

from ...checks import Mistake, fail, mistake_key
from ...text.bpe import GPT2_PATTERN, BPETokenizer, merge_pair, pretoken_counts
from ...text.corpus import load_text
from ..cases import Inputs, Outputs, given, sizes_rng
from ..piece import Piece, declare
from ..student import as_ids, as_text

# Each piece forbids what computes its own answer: merge_pair the module's merge_pair; train_bpe the class (its
# `train`), the trainer and the pre-token counts it starts from; encode and decode the class, which does both.
# train_bpe and encode call the student's count_pairs and merge_pair, but counting and merging are not their point
# (the pre-tokens, the tie rule and the loop; the merges applied by rank): neither forbids those references. gptcourse
# counts pairs only inside its trainer, so count_pairs forbids nothing: its reference is the one-line Counter.
_MERGE = ("gptcourse.text.bpe.merge_pair",)
_TRAIN = ("gptcourse.BPETokenizer", "gptcourse.text.bpe.train_merges", "gptcourse.text.bpe.pretoken_counts")
_CODEC = ("gptcourse.BPETokenizer",)
Pair = tuple[int, int]
Word = tuple[int, ...]

# ---- the reference's merges and tokenizer in ids (merge k makes id 256 + k)


def vocab_of(merges: list[Pair]) -> dict[int, bytes]:
    """id -> bytes for ids 0 .. 255 + len(merges)."""
    vocab = {i: bytes([i]) for i in range(256)}
    for k, (a, b) in enumerate(merges):
        vocab[256 + k] = vocab[a] + vocab[b]
    return vocab


def tokenizer(merges: list[Pair]) -> BPETokenizer:
    vocab = vocab_of(merges)
    return BPETokenizer([(vocab[a], vocab[b]) for a, b in merges], special_tokens=())


def trained_merges(text: str, vocab_size: int) -> list[Pair]:
    """The reference's merges on `text` as pairs of ids."""
    tok = BPETokenizer.train(text, vocab_size, special_tokens=())
    ids = {tok_bytes: i for i, tok_bytes in tok.vocab.items() if i < 256 + len(tok.merges)}
    return [(ids[a], ids[b]) for a, b in tok.merges]


# ---- what the usual mistakes compute


def merged(word: Sequence[int], a: int, b: int, new: int, *, twice: bool = False, losing_the_last: bool = False
           ) -> list[int]:
    """`word` with each occurrence of the pair (a, b) replaced by `new`, left to right, or with one of the usual
    mistakes: `twice` reuses the right half of a replaced pair (every position that starts the pair becomes `new`),
    `losing_the_last` loops while i < len(word) - 1, so an id after the last pair is lost."""
    out, used = [], False  # used: this id was the right half of the pair just replaced
    for here, after in zip_longest(word, word[1:]):  # each id and the one after it (None after the last)
        if used:
            used = False
        elif (here, after) == (a, b):
            out.append(new)
            used = not twice
        elif after is not None or not losing_the_last:
            out.append(here)
    return out


def words_of(text: str, pretokenize: bool = True) -> Counter[Word]:
    """Each pre-token's bytes (as ids) with its count; without pre-tokenization, the whole text is one."""
    counts = pretoken_counts(text, (), GPT2_PATTERN if pretokenize else r"(?s).+")
    return Counter({tuple(word): n for word, n in counts.items()})


def _pair_counts(words: Mapping[Word, int], weighted: bool = True, overlapping: bool = True) -> Counter[Pair]:
    """How often each adjacent pair occurs; `overlapping=False` is the mistake of counting a run (97, 97, 97) as
    one (97, 97), as many times as merge_pair can replace it."""
    counts: Counter[Pair] = Counter()
    for word, n in words.items():
        skip = None  # a pair (a, a) just counted: the next position's (a, a) overlaps it
        for pair in pairwise(word):
            if pair == skip and not overlapping:
                skip = None
                continue
            counts[pair] += n if weighted else 1
            skip = pair if pair[0] == pair[1] else None
    return counts


def _merged_words(words: Mapping[Word, int], pair: Pair, new: int, twice: bool = False) -> Counter[Word]:
    out: Counter[Word] = Counter()
    for word, n in words.items():
        out[tuple(merged(word, *pair, new, twice=twice))] += n
    return out


MAX_TOKEN_BYTES = 1 << 20  # a mistake's token longer than this is followed no further (`slow_merges`)
TIE_RULES: dict[str, Callable[[list[Pair], dict[int, bytes]], Pair]] = {
    "greatest": lambda tied, vocab: max(tied, key=lambda p: (vocab[p[0]], vocab[p[1]])),
    "least": lambda tied, vocab: min(tied, key=lambda p: (vocab[p[0]], vocab[p[1]])),
    "first": lambda tied, vocab: tied[0],
    "ids": lambda tied, vocab: max(tied),
    "joined": lambda tied, vocab: max(tied, key=lambda p: vocab[p[0]] + vocab[p[1]]),
}


def slow_merges(text: str, vocab_size: int, tie: str = "greatest", pretokenize: bool = True, weighted: bool = True,
                overlap: bool = False, overlapping: bool = True) -> Iterator[Pair | None]:
    """A plain trainer's merges, one at a time, right or with one of the usual mistakes, for the diagnostics.

    Lazy, so that a judge stops at the first merge that is not the student's: a merge's bytes are made only once
    the next merge is asked for. Where a further merge would follow a token longer than `MAX_TOKEN_BYTES` (only
    `overlap` gets there: its words never shrink, and (x, x) merged again and again doubles a token each time),
    it yields None, which is no merge, and stops.
    """
    words, vocab = words_of(text, pretokenize), vocab_of([])
    while len(vocab) < vocab_size and (counts := _pair_counts(words, weighted, overlapping)):
        if len(vocab[len(vocab) - 1]) > MAX_TOKEN_BYTES:  # the newest token
            yield None
            return
        top = max(counts.values())
        a, b = TIE_RULES[tie]([p for p, n in counts.items() if n == top], vocab)
        yield a, b
        vocab[len(vocab)] = vocab[a] + vocab[b]
        words = _merged_words(words, (a, b), len(vocab) - 1, twice=overlap)


def encode_with(text: str, merges: list[Pair], newest_first: bool = False, pretokenize: bool = True,
                overlap: bool = False, code_points: bool = False) -> list[int]:
    """Each merge applied to each pre-token, one merge after the other (oldest first), or with one of the usual
    mistakes."""
    order = range(len(merges) - 1, -1, -1) if newest_first else range(len(merges))
    out: list[int] = []
    for word in regex.findall(GPT2_PATTERN, text) if pretokenize else [text]:
        ids = [ord(c) for c in word] if code_points else list(word.encode("utf-8"))
        for k in order:
            ids = merged(ids, *merges[k], 256 + k, twice=overlap)
        out.extend(ids)
    return out


def longest_match(text: str, merges: list[Pair]) -> list[int]:
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


def leftmost_pair_first(text: str, merges: list[Pair]) -> list[int]:
    """The mistake of merging, in each piece, the first pair from the left that has a merge, whatever its rank."""
    rank = {pair: k for k, pair in enumerate(merges)}
    out: list[int] = []
    for piece in regex.findall(GPT2_PATTERN, text):
        ids = list(piece.encode("utf-8"))
        while (i := next((i for i, pair in enumerate(pairwise(ids)) if pair in rank), None)) is not None:
            ids[i : i + 2] = [256 + rank[(ids[i], ids[i + 1])]]
        out.extend(ids)
    return out


# ---- the student's results as tensors (in the kernel), and the judges' shared steps

CALLS = {"count_pairs": "count_pairs({ids!r:.60})", "merge_pair": "merge_pair({ids!r:.50}, {pair}, {new_id})",
         "train_bpe": "train_bpe({text!r:.40}, vocab_size={vocab_size})", "encode": "encode({text!r:.40}, merges)",
         "decode": "decode({ids!r:.50}, merges)"}


def _what(piece: str, inputs: Inputs) -> str:
    """The call a case makes, as its messages name it: "encode('def div(a, b)', merges)"."""
    return CALLS[piece].format(**inputs)


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


_END = object()  # what `_check_mistakes` pairs with the extra items of the longer of two results


def _check_mistakes(got: list[Any], expected: list[Any], mistakes: Mapping[str, Iterable[Any]], what: str) -> None:
    """Fails naming the first mistake whose result is `got` (and not the expected one); a lazy result is followed
    only as far as it agrees with `got`."""
    if got == expected:
        return
    for why, wrong in mistakes.items():
        if all(w == g for w, g in zip_longest(wrong, got, fillvalue=_END)):
            raise fail(f"{what}: {why}.", mistake_key(why))


def _judge_ids(piece: str, mistakes: Callable[[Inputs], Mapping[str, Sequence[int]]], got: Outputs,
               expected: Outputs, inputs: Inputs) -> None:
    """The judge of a piece that returns ids: a named mistake, else where the ids first differ (in bytes)."""
    g, e, what = got["ids"].tolist(), expected["ids"].tolist(), _what(piece, inputs)
    if g != e:
        _check_mistakes(g, e, mistakes(inputs), what)
        raise fail(first_difference(g, e, vocab_of(inputs["merges"]) if "merges" in inputs else {}, what) + ".")


def _random_ids(seed: int) -> list[int]:
    r = sizes_rng(seed)
    alphabet = r.sample(range(300), r.randint(2, 5))
    return [r.choice(alphabet) for _ in range(r.randint(8, 30))]


def _corpus_slice(seed: int, length: int) -> str:
    corpus = load_text()
    start = sizes_rng(seed).randint(0, len(corpus) - length)
    return corpus[start:start + length]


# ---- count_pairs(ids) -> {(a, b): how often b follows a}


def _count_call(fn: Any, inputs: Inputs) -> Outputs:
    value, what = fn(list(inputs["ids"])), _what("count_pairs", inputs)
    if not isinstance(value, Mapping):
        raise fail(f"{what} returned {type(value).__name__}, expected a dict {{(a, b): count}}")
    rows = []
    for pair, n in value.items():
        if not (isinstance(pair, tuple) and len(pair) == 2 and all(isinstance(i, int) for i in pair)):
            raise fail(f"{what}: key {pair!r:.40} is not a pair of ids; the keys are tuples (a, b) of two ints")
        if not isinstance(n, int) or isinstance(n, bool):
            raise fail(f"{what}: the count of {pair} is {n!r:.40}, expected an int")
        rows.append((pair[0], pair[1], n))
    return {"counts": torch.tensor(sorted(rows), dtype=torch.int64).reshape(-1, 3)}  # (N, 3): a, b, count


def _count_judge(got: Outputs, expected: Outputs, inputs: Inputs) -> None:
    g, e = ({(a, b): n for a, b, n in out["counts"].tolist()} for out in (got, expected))
    if g == e:
        return
    what, ids = _what("count_pairs", inputs), inputs["ids"]
    if set(g) == set(e) and all(n == 1 for n in g.values()):
        raise fail(f"{what}: every pair is counted once: count how *often* each adjacent pair occurs.",
                   mistake="08.count_once_each")
    if g == Counter(zip(ids[::2], ids[1::2], strict=False)):
        raise fail(f"{what}: only the pairs that start at an even position were counted (a stride of 2, "
                   "zip(ids[::2], ids[1::2])): every adjacent pair counts, and pairs overlap: (ids[1], ids[2]) is one "
                   "too, so zip(ids, ids[1:]).", mistake="08.count_stride_two")
    missing = sorted(set(e) - set(g))
    if missing == [(ids[-2], ids[-1])] and e[missing[0]] == 1:
        raise fail(f"{what}: the last pair {missing[0]} is missing: there are len(ids) - 1 adjacent pairs, and "
                   "zip(ids, ids[1:]) gives them all.", mistake="08.count_last_pair_lost")
    if missing:
        raise fail(f"{what}: the pair {missing[0]} occurs {e[missing[0]]} time(s) (as ids[i], ids[i + 1]) but is "
                   "not in your result.")
    extra = sorted(set(g) - set(e))
    if extra:
        raise fail(f"{what}: {extra[0]} is not an adjacent pair of the ids (each key is (ids[i], ids[i + 1])).")
    pair = next(p for p in sorted(e) if g[p] != e[p])
    raise fail(f"{what}: the pair {pair} is counted {g[pair]} times, expected {e[pair]} (overlapping occurrences "
               "count: (1, 1, 1) holds the pair (1, 1) twice).", mistake="08.count_overlaps_once")


# ---- merge_pair(ids, pair, new_id) -> ids with each occurrence of pair replaced, left to right


def _merge_call(fn: Any, inputs: Inputs) -> Outputs:
    out = fn(list(inputs["ids"]), tuple(inputs["pair"]), inputs["new_id"])
    return {"ids": as_ids(out, _what("merge_pair", inputs))}


def _merge_mistakes(inputs: Inputs) -> dict[str, Sequence[int]]:
    ids, (a, b), new = tuple(inputs["ids"]), inputs["pair"], inputs["new_id"]
    mistakes = {
        Mistake("08.merge_reuses_right_half",
              f"the right half of a replaced pair is used again: after replacing ids[i], ids[i + 1] by {new}, continue "
        "at i + 2 (so overlapping occurrences merge once: (97, 97, 97) with (97, 97) gives (256, 97))"):
            merged(ids, a, b, new, twice=True),
        Mistake("08.merge_reversed_pair",
                "the pair was merged the wrong way round: (a, b) means a followed by b"): merged(ids, b, a, new),
        Mistake("08.merge_loses_last",
                "the last id is lost: a loop while i < len(ids) - 1 never keeps an id that follows the last pair; loop "
                "while i < len(ids), and keep ids[i] unless ids[i], ids[i + 1] is the pair"):
            merged(ids, a, b, new, losing_the_last=True),
        Mistake("08.merge_as_text",
                f"the ids were merged as text (str.replace on the joined ids): '{a} {b}' also matches where two other "
        "ids' digits run together ('15 9' holds '5 9'); compare ids, not strings: walk the list and replace each "
        "ids[i], ids[i + 1] equal to the pair"): [int(t) for t in " ".join(map(str, ids)).replace(
            f"{a} {b}", str(new)).split()],
    }
    first = next((i for i in range(len(ids) - 1) if ids[i:i + 2] == (a, b)), None)
    if first is not None:
        mistakes[Mistake("08.merge_first_only",
                         "only the first occurrence was replaced: replace every one, left to right")] = (
            (*ids[:first], new, *ids[first + 2:]))
    return mistakes


def _merge_hidden(seed: int) -> Inputs:
    ids = _random_ids(seed)
    return {"ids": ids, "pair": (ids[1], ids[2]), "new_id": 300 + sizes_rng(seed).randint(0, 50)}


# ---- train_bpe(text, vocab_size) -> merges [(a, b), ...], merge k makes id 256 + k


def _train_call(fn: Any, inputs: Inputs) -> Outputs:
    value, what = fn(inputs["text"], inputs["vocab_size"]), _what("train_bpe", inputs)
    if not isinstance(value, (list, tuple)) or not all(
            isinstance(m, tuple) and len(m) == 2 and all(isinstance(i, int) for i in m) for m in value):
        raise fail(f"{what} returned {value!r:.80}, expected a list of merges, each a tuple (a, b) of two ids")
    return {"merges": torch.tensor(list(value), dtype=torch.int64).reshape(-1, 2)}  # (M, 2)


def _train_mistakes(inputs: Inputs) -> dict[str, Iterator[Pair | None]]:
    def train(**mistake: Any) -> Iterator[Pair | None]:
        return slow_merges(inputs["text"], inputs["vocab_size"], **mistake)

    return {
        Mistake("08.train_ties_least",
            "ties are broken the other way: among equally frequent pairs take the lexicographically *greatest* pair of "
            "byte strings, max(tied, key=lambda p: (vocab[p[0]], vocab[p[1]]))"): train(tie="least"),
        Mistake("08.train_ties_first_counted",
             "ties are broken by which pair was counted first: among equally frequent pairs take the lexicographically "
             "greatest pair of byte strings, (vocab[a], vocab[b])"): train(tie="first"),
        Mistake("08.train_ties_by_ids",
               "ties are broken by the ids, not by the bytes: compare (vocab[a], vocab[b]), the byte strings (a merged "
               "token's id says nothing about its bytes)"): train(tie="ids"),
        Mistake("08.train_overlap_merged_twice",
            "the right half of a merged pair is used again (merge_pair must continue at i + 2 after a replacement), so "
            "overlapping occurrences are merged twice"): train(overlap=True),
        Mistake("08.train_not_pretokenized",
                "the text is not pre-tokenized: split it with regex.findall(GPT2_PATTERN, text) and count pairs only "
                "inside each piece, so that no merge crosses a word boundary"): train(pretokenize=False),
        Mistake("08.train_unweighted",
                "each distinct pre-token is counted once: weight its pairs by how often the pre-token occurs"):
            train(weighted=False),
        Mistake("08.train_ties_joined",
                "ties are compared on the joined bytes vocab[a] + vocab[b]: compare the pair of byte strings "
        "(vocab[a], vocab[b]), left token first (b'a' + b'bc' and b'ab' + b'c' join to the same bytes, and "
        "b'ab' wins as the left token)"): train(tie="joined"),
        Mistake("08.train_overlaps_once",
             "overlapping occurrences were counted once (a run (97, 97, 97) as one (97, 97), as SentencePiece counts): "
             "count every adjacent pair, zip(ids, ids[1:]), so (97, 97, 97) holds (97, 97) twice"):
            train(overlapping=False),
    }


def _pair_bytes(pair: Pair, vocab: Mapping[int, bytes]) -> str:
    return f"({vocab[pair[0]]!r}, {vocab[pair[1]]!r})" if all(i in vocab for i in pair) else "(ids never made)"


def _why_not(got: Pair, want: Pair, text: str, merges: list[Pair]) -> str:
    """The counts of both pairs once the merges that agree are applied."""
    words = words_of(text)
    for k, pair in enumerate(merges):
        words = _merged_words(words, pair, 256 + k)
    counts = _pair_counts(words)
    if counts[got] == counts[want]:
        return f"both occur {counts[want]} times, and a tie goes to the lexicographically greatest pair of byte strings"
    return f"the expected pair occurs {counts[want]} times, yours {counts[got]}"


def _train_judge(got: Outputs, expected: Outputs, inputs: Inputs) -> None:
    g, e = ([tuple(m) for m in out["merges"].tolist()] for out in (got, expected))
    if g == e:
        return
    what = _what("train_bpe", inputs)
    _check_mistakes(g, e, _train_mistakes(inputs), what)
    vocab = vocab_of(e)
    k = next((k for k, (a, b) in enumerate(zip(g, e, strict=False)) if a != b), None)
    if k is None:
        if len(g) < len(e):
            raise fail(f"{what}: {len(g)} merges, expected {len(e)}: keep merging until there are vocab_size tokens "
                       "(256 bytes + one per merge).", mistake="08.train_too_few_merges")
        raise fail(f"{what}: {len(g)} merges, expected {len(e)}: stop at vocab_size - 256 merges, or earlier when no "
                   "pair is left (every pre-token is a single token).", mistake="08.train_too_many_merges")
    raise fail(f"{what}: merge {k} (making id {256 + k}) is {g[k]} = {_pair_bytes(g[k], vocab)}, expected {e[k]} = "
               f"{_pair_bytes(e[k], vocab)}: {_why_not(g[k], e[k], inputs['text'], e[:k])}. The {k} merges before "
               "it agree.")


VISIBLE_TEXT = ("def add(a, b):\n    return a + b\n\n\ndef sub(a, b):\n    return a - b\n\n\n"
                "def mul(a, b):\n    return a * b\n")
TIES_TEXT = "low lower lowest newer wider new wide wider newest widest"  # after Sennrich et al.: many ties


# ---- encode(text, merges) -> ids


def _encode_call(fn: Any, inputs: Inputs) -> Outputs:
    return {"ids": as_ids(fn(inputs["text"], list(inputs["merges"])), _what("encode", inputs))}


NOT_BY_RANK = ("BPE merges by rank: in each piece, the pair learned first among those present, then again (each "
               "merge in the order learned does the same), so 'slower' is s + lo + wer when (we, r) was learned "
               "before (lo, w)")


def _encode_mistakes(inputs: Inputs) -> dict[str, list[int]]:
    merges, text = inputs["merges"], inputs["text"]
    longest, leftmost = longest_match(text, merges), leftmost_pair_first(text, merges)
    # on most text the two agree: one message names both
    greedy = {Mistake("08.encode_greedy",
               f"each piece was cut into the longest tokens of the vocabulary, or merged its first mergeable pair from "
              f"the left again and again: {NOT_BY_RANK}"): longest} if longest == leftmost else {
        Mistake("08.encode_longest",
              "each piece was cut into the longest tokens of the vocabulary, left to right: that is not BPE; apply the "
              "merges one after the other, in the order they were learned"): longest,
        Mistake("08.encode_leftmost",
                f"each piece merged its first mergeable pair from the left, again and again: {NOT_BY_RANK}"): leftmost}
    return {
        Mistake("08.encode_not_pretokenized",
              "the text is not pre-tokenized: split it with regex.findall(GPT2_PATTERN, text) and encode each piece on "
              "its own, as training did"): encode_with(text, merges, pretokenize=False),
        Mistake("08.encode_newest_first",
              "the merges are applied newest first: apply them in the order they were learned (merge 0 first), since a "
              "later merge builds on earlier ones"): encode_with(text, merges, newest_first=True),
        Mistake("08.encode_raw_bytes", "the ids are the raw bytes: apply the merges"): list(text.encode("utf-8")),
        **greedy,
        Mistake("08.encode_overlap_merged_twice",
                "overlapping occurrences of a pair are merged twice: merge_pair must continue at i + 2 after a "
                "replacement, so (97, 97, 97) with the merge (97, 97) gives (256, 97)"):
            encode_with(text, merges, overlap=True),
        Mistake("08.encode_code_points",
                "the ids start as the characters' code points, ord(c): start from the UTF-8 bytes, "
                "list(piece.encode('utf-8')) ('é' is the 2 bytes 195, 169; every id below 256 is a byte)"):
            encode_with(text, merges, code_points=True),
    }


# 'slower' is where the order of the merges shows: (we, r) was learned before (lo, w), so BPE gives s + lo + wer,
# where merging the first pair from the left, or the longest tokens, give s + low + e + r
ENCODE_TEXT = "def slower(a, b):\n    return a / b\n"
ENCODE_MERGES = (VISIBLE_TEXT + TIES_TEXT, 288)  # trained on both of train_bpe's texts

# ---- decode(ids, merges) -> text


def _decode_call(fn: Any, inputs: Inputs) -> Outputs:
    try:
        text = fn(list(inputs["ids"]), list(inputs["merges"]))
    except UnicodeDecodeError as err:  # the mistake this piece teaches: the judge explains it
        return {"text": "", "error": f"UnicodeDecodeError: {err}"[:300]}
    return {"text": as_text(text, _what("decode", inputs)), "error": ""}


SPLIT_HINT = ("a character's UTF-8 bytes can be spread over several tokens (😀 is 4 bytes), so join the bytes of "
              "all the tokens first and decode once: b''.join(vocab[i] for i in ids).decode('utf-8', "
              "errors='replace')")


def _decode_judge(got: Outputs, expected: Outputs, inputs: Inputs) -> None:
    what = _what("decode", inputs)
    if got["error"]:
        raise fail(f"{what} raised {got['error']}: {SPLIT_HINT}; errors='replace' turns bytes that are not UTF-8 "
                   "into U+FFFD instead of raising.", mistake="08.decode_raises")
    g, e = got["text"], expected["text"]
    if g == e:
        return
    vocab = vocab_of(inputs["merges"])
    if g == "".join(vocab[i].decode("utf-8", "replace") for i in inputs["ids"]):
        raise fail(f"{what} returned {g!r:.60}, expected {e!r:.60}: each token was decoded on its own; {SPLIT_HINT}.",
                   mistake="08.decode_per_token")
    data = b"".join(vocab[i] for i in inputs["ids"])
    for why, wrong in {
        Mistake("08.decode_ignore_errors",
               "the bytes that are not UTF-8 were dropped (errors='ignore'): decode with errors='replace', which shows "
               "each as U+FFFD, as GPT tokenizers do"): data.decode("utf-8", "ignore"),
        Mistake("08.decode_latin1",
            "the bytes were decoded as Latin-1, one character per byte: they are UTF-8, where 'é' is 2 bytes and '😀' "
        "4, .decode('utf-8', errors='replace')"): data.decode("latin-1"),
    }.items():
        if g == wrong:
            raise fail(f"{what} returned {g!r:.60}, expected {e!r:.60}: {why}.", mistake_key(why))
    k = next((k for k, (a, b) in enumerate(zip(g, e, strict=False)) if a != b), min(len(g), len(e)))
    raise fail(f"{what} returned {g!r:.80}, expected {e!r:.80}: they differ first at character {k}.")


def _decode_inputs(merges: list[Pair], text: str) -> Inputs:
    return {"merges": merges, "ids": tokenizer(merges).encode(text)}


PIECES = declare(
    # gptcourse counts pairs only inside its trainer: this reference is the one-line count
    Piece("08", "count_pairs", lambda ids: Counter(pairwise(ids)), _count_call, judge=_count_judge,
          visible=[("visible", "count_pairs of the bytes of 'aaabdaaabac'",
                    lambda seed: {"ids": list(b"aaabdaaabac")})],
          hidden=[("hidden_short", "count_pairs of a single id (no pairs)", lambda seed: {"ids": [7]}),
                  ("hidden_random", "count_pairs of other ids", lambda seed: {"ids": _random_ids(seed)})]),
    Piece("08", "merge_pair", lambda ids, pair, new_id: merge_pair(ids, *pair, new_id), _merge_call,
          judge=partial(_judge_ids, "merge_pair", _merge_mistakes), forbidden=_MERGE,
          visible=[("visible", "merge_pair of 'aaabdaaabac' with (97, 98) 'ab' -> 256",
                    given(ids=list(b"aaabdaaabac"), pair=(97, 98), new_id=256)),
                   ("overlap", "merge_pair of 'aaaaa' with (97, 97) 'aa' -> 256 (overlapping occurrences)",
                    given(ids=list(b"aaaaa"), pair=(97, 97), new_id=256))],
          # 15, 9 and 5, 95 hold the pair's digits "5 9" across two ids: only ids compared as numbers are right
          hidden=[("hidden_end", "merge_pair with the pair at the very end, among ids whose digits run into it",
                   given(ids=[15, 9, 5, 95, 9, 5, 5, 9, 1, 5, 9], pair=(5, 9), new_id=300)),
                  ("hidden_random", "merge_pair of other ids", _merge_hidden)]),
    Piece("08", "train_bpe", trained_merges, _train_call, judge=_train_judge, forbidden=_TRAIN,
          visible=[("visible", "train_bpe on three small Python functions, vocab_size=276",
                    given(text=VISIBLE_TEXT, vocab_size=276)),
                   ("ties", f"train_bpe({TIES_TEXT!r}, vocab_size=270): many ties",
                    given(text=TIES_TEXT, vocab_size=270))],
          hidden=[("hidden_corpus", "train_bpe on 3,000 characters of the course corpus, vocab_size=320",
                   lambda seed: {"text": _corpus_slice(seed, 3000), "vocab_size": 320}),
                  ("hidden_unicode", "train_bpe on text with accents, CJK and emoji (multi-byte UTF-8)",
                   given(text="café crème, 日本語と日本, 😀😀 😀! " * 3 + "naïve café", vocab_size=290)),
                  ("hidden_exhausted", "train_bpe asked for more tokens than the text has pairs to merge",
                   given(text="ab ab abc", vocab_size=300))]),
    Piece("08", "encode", lambda text, merges: tokenizer(merges).encode(text), _encode_call,
          judge=partial(_judge_ids, "encode", _encode_mistakes), forbidden=_CODEC,
          visible=[("visible", f"encode({ENCODE_TEXT!r}) with merges learned from both texts of 08.train_bpe "
                    "(vocab_size=288): the merges' order decides 'slower'",
                    lambda seed: {"merges": trained_merges(*ENCODE_MERGES), "text": ENCODE_TEXT})],
          hidden=[("hidden_unicode", "encode a text with characters the training text never had",
                   lambda seed: {"merges": trained_merges(VISIBLE_TEXT, 290),
                                 "text": "def café(a, b):  # 日本 😀\n\treturn  a+b\n"}),
                  ("hidden_rank", "encode('abc abcd') with the merges (b'b', b'c') then (b'a', b'b'): the rank "
                   "decides, not the length",
                   given(merges=[(98, 99), (97, 98), (32, 97), (257, 99)], text="abc abcd")),
                  ("hidden_corpus", "encode 1,000 characters of the corpus with merges learned on 3,000",
                   lambda seed: {"merges": trained_merges(_corpus_slice(seed, 3000), 330),
                                 "text": _corpus_slice(seed + 1, 1000)})]),
    Piece("08", "decode", lambda ids, merges: tokenizer(merges).decode(ids), _decode_call, judge=_decode_judge,
          forbidden=_CODEC,
          visible=[("visible", "decode the ids of 'def café(a, b):' with the merges of 08.train_bpe.visible (no merge "
                               "joins the two bytes of 'é': two tokens)",
                    lambda seed: _decode_inputs(trained_merges(VISIBLE_TEXT, 276), "def café(a, b):")),
                   ("split", "decode ids whose tokens split characters: 'é' and '😀' as single bytes, then a stray "
                             "continuation byte (not UTF-8: U+FFFD)",
                    lambda seed: {"merges": trained_merges(VISIBLE_TEXT, 276),
                                  "ids": [*b"caf", *"é".encode(), 32, *"😀".encode(), 0x80]})],
          hidden=[("hidden_invalid", "decode ids holding bytes that are not UTF-8 (half an emoji, a stray continuation "
                                     "byte): each becomes U+FFFD",
                   lambda seed: {"merges": trained_merges(VISIBLE_TEXT, 276), "ids": [97, 0xF0, 0x9F, 32, 0x80, 98]}),
                  ("hidden_corpus", "decode 1,000 characters of the corpus",
                   lambda seed: _decode_inputs(trained_merges(_corpus_slice(seed, 3000), 330),
                                               _corpus_slice(seed + 1, 1000)))]),
)
