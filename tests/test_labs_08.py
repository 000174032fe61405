"""Lab 08 graded by real nbgrader: full marks for the solution, 0 for the untouched release, and each known
mistake loses exactly the points of the tests it should fail."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from lab_roundtrip import BlindStudents, NamedMistakes, RoundTrip, Validation

from gptcourse.checks import CheckFailed
from gptcourse.grading import get_case
from gptcourse.grading.labs.lab08 import slow_merges, trained_merges

LAB = "08_bpe_tokenizer"
MERGE = '''
def merge_pair(ids, pair, new_id):
    out, i = [], 0
    while i < len(ids):
        if i + 1 < len(ids) and (ids[i], ids[i + 1]) == pair:
            out.append(new_id)
            i += {step}
        else:
            out.append(ids[i])
            i += 1
    return out
'''
TRAIN = '''
def train_bpe(text, vocab_size):
    pieces = {{}}
    for piece in {pieces}:
        pieces[piece] = pieces.get(piece, 0) + 1
    words = [(list(piece.encode("utf-8")), n) for piece, n in pieces.items()]
    vocab = {{i: bytes([i]) for i in range(256)}}
    merges = []
    while 256 + len(merges) < vocab_size:
        counts = {{}}
        for ids, n in words:
            for pair, k in count_pairs(ids).items():
                counts[pair] = counts.get(pair, 0) + k * n
        if not counts:
            break
        a, b = {pick}
        new_id = 256 + len(merges)
        words = [(merge_pair(ids, (a, b), new_id), n) for ids, n in words]
        merges.append((a, b))
        vocab[new_id] = vocab[a] + vocab[b]
    return merges
'''
RIGHT_TRAIN = {"pieces": "regex.findall(GPT2_PATTERN, text)",
               "pick": "max(counts, key=lambda p: (counts[p], vocab[p[0]], vocab[p[1]]))"}
ENCODE = '''
def encode(text, merges):
    out = []
    for piece in regex.findall(GPT2_PATTERN, text):
        ids = [ord(c) for c in piece]
        for k, pair in enumerate(merges):
            ids = merge_pair(ids, pair, 256 + k)
        out.extend(ids)
    return out
'''
# the first mergeable pair from the left, merged again and again: right on text where no two merges compete
LEFTMOST_ENCODE = '''
def encode(text, merges):
    rank = {pair: k for k, pair in enumerate(merges)}
    out = []
    for piece in regex.findall(GPT2_PATTERN, text):
        ids = list(piece.encode("utf-8"))
        i = 0
        while i < len(ids) - 1:
            if (ids[i], ids[i + 1]) in rank:
                ids[i:i + 2] = [256 + rank[(ids[i], ids[i + 1])]]
                i = max(i - 1, 0)
            else:
                i += 1
        out.extend(ids)
    return out
'''
DECODE = '''
def decode(ids, merges):
    vocab = {{i: bytes([i]) for i in range(256)}}
    for k, (a, b) in enumerate(merges):
        vocab[256 + k] = vocab[a] + vocab[b]
    return {text}
'''
JOINED = 'b"".join(vocab[i] for i in ids)'  # the bytes of all the tokens
# overlapping occurrences counted once, as SentencePiece counts (karpathy/minbpe#72): a run a a a holds (a, a) once
NON_OVERLAPPING_COUNT = '''
def count_pairs(ids):
    counts, i = {}, 0
    while i < len(ids) - 1:
        pair = (ids[i], ids[i + 1])
        counts[pair] = counts.get(pair, 0) + 1
        i += 2 if i + 2 < len(ids) and ids[i] == ids[i + 1] == ids[i + 2] else 1
    return counts
'''
# student -> ({solution cell grade_id: what they wrote}, test cells it must fail)
WRONG = {
    # sorted by count, then by bytes, the first taken: the least pair wins the tie
    "ties-least": ({"train_bpe": TRAIN.format(**RIGHT_TRAIN | {
        "pick": "min(counts, key=lambda p: (-counts[p], vocab[p[0]], vocab[p[1]]))"})},
        {"test_train_bpe", "test_train_bpe_ties", "test_train_bpe_hidden"}),
    "ties-first-counted": ({"train_bpe": TRAIN.format(**RIGHT_TRAIN | {"pick": "max(counts, key=counts.get)"})},
                           {"test_train_bpe", "test_train_bpe_ties", "test_train_bpe_hidden"}),
    "no-pretokenize": ({"train_bpe": TRAIN.format(**RIGHT_TRAIN | {"pieces": "[text]"})},
                       {"test_train_bpe", "test_train_bpe_ties", "test_train_bpe_hidden"}),
    # the right half of a replaced pair stays; train_bpe and encode use merge_pair, so they go wrong too
    "overlap-merged-twice": ({"merge_pair": MERGE.format(step=1)},
                             {"test_merge_pair", "test_merge_pair_overlap", "test_merge_pair_hidden", "test_train_bpe",
                              "test_train_bpe_ties", "test_train_bpe_hidden", "test_encode", "test_encode_hidden"}),
    "decode-token-by-token-strict": ({"decode": DECODE.format(text='"".join(vocab[i].decode("utf-8") for i in ids)')},
                                     {"test_decode", "test_decode_split", "test_decode_hidden"}),
    # ties compared on vocab[a] + vocab[b]: (b"a", b"bc") and (b"ab", b"c") join alike
    "ties-joined-bytes": ({"train_bpe": TRAIN.format(**RIGHT_TRAIN | {
        "pick": "max(counts, key=lambda p: (counts[p], vocab[p[0]] + vocab[p[1]]))"})},
        {"test_train_bpe", "test_train_bpe_hidden"}),
    # a set of the pairs, not their counts; train_bpe counts with it, so its first merges go wrong too
    "count-pairs-once": ({"count_pairs": "def count_pairs(ids):\n    return {pair: 1 for pair in zip(ids, ids[1:])}\n"},
                         {"test_count_pairs", "test_count_pairs_hidden", "test_train_bpe", "test_train_bpe_hidden"}),
    "encode-leftmost-pair": ({"encode": LEFTMOST_ENCODE}, {"test_encode", "test_encode_hidden"}),
    "encode-code-points": ({"encode": ENCODE}, {"test_encode_hidden"}),  # ord(c), not the UTF-8 bytes
    "decode-errors-ignore": ({"decode": DECODE.format(text=f'{JOINED}.decode("utf-8", "ignore")')},
                             {"test_decode_split", "test_decode_hidden"}),
    "decode-latin-1": ({"decode": DECODE.format(text=f'{JOINED}.decode("latin-1")')},
                       {"test_decode", "test_decode_split", "test_decode_hidden"}),
    # train_bpe counts with it; the ties text and this student's hidden ids have no run of three equal ids
    "count-pairs-without-overlaps": ({"count_pairs": NON_OVERLAPPING_COUNT},
                                     {"test_count_pairs", "test_train_bpe", "test_train_bpe_hidden"}),
    # a right trainer whose cell checks the student's merge_pair against the course's (a stub in the graded kernel:
    # the check raises after the def): the scan sees gptcourse.text.bpe.merge_pair, merge_pair's reference, which
    # train_bpe does not forbid (merging is not its point), so only merge_pair's cells are lost
    "train-cell-checks-merge-against-the-course": (
        {"train_bpe": TRAIN.format(**RIGHT_TRAIN) + "\n\nfrom gptcourse.text.bpe import merge_pair as course_merge\n\n"
                      "assert merge_pair([1, 2, 1, 2], (1, 2), 9) == course_merge([1, 2, 1, 2], 1, 2, 9)\n"},
        {"test_merge_pair", "test_merge_pair_overlap", "test_merge_pair_hidden"}),
    # decode through the course's BPETokenizer, which is train_bpe's and encode's reference and decode's too (the
    # class decodes): the scan zeroes those three pieces; count_pairs and merge_pair, which it is not, keep theirs
    "decode-with-the-course-class": (
        {"decode": "from gptcourse import BPETokenizer\n" + DECODE.format(
            text="BPETokenizer([(vocab[a], vocab[b]) for a, b in merges], special_tokens=()).decode(ids)")},
        {"test_train_bpe", "test_train_bpe_ties", "test_train_bpe_hidden", "test_encode", "test_encode_hidden",
         "test_decode", "test_decode_split", "test_decode_hidden"}),
}

COUNT_TESTS = {"test_count_pairs", "test_count_pairs_hidden"}
MERGE_TESTS = {"test_merge_pair", "test_merge_pair_overlap", "test_merge_pair_hidden"}
TRAIN_TESTS = {"test_train_bpe", "test_train_bpe_ties", "test_train_bpe_hidden"}
ENCODE_TESTS = {"test_encode", "test_encode_hidden"}
DECODE_TESTS = {"test_decode", "test_decode_split", "test_decode_hidden"}
# Written blind to the tests (issue 42), as written, graded in-process (check_blind_student) and by nbgrader (the
# round trip): student -> the test cells it must fail (train_bpe and encode call the student's count_pairs and
# merge_pair). Before the fix merge-str-replace passed every cell (no case's ids ran their digits into the pair's),
# decode-errors-ignore every visible one (no visible byte was invalid, though the lab asks for errors="replace"), and
# pairs-stride-two's message named a missing pair, not the stride. uses-reference-bpe imports gptcourse.BPETokenizer,
# the reference of train_bpe, encode and decode (its train, encode and decode): the grader's scan zeroes those three;
# its count_pairs and merge_pair are the solution's, and the class is neither's reference.
BLIND_FILE = Path(__file__).with_name("lab08_blind.cells")
BLIND_FAILS = {
    "pairs-stride-two": COUNT_TESTS | TRAIN_TESTS,
    "pairs-no-overlap": COUNT_TESTS | TRAIN_TESTS - {"test_train_bpe_ties"},
    "merge-overlapping": {"test_merge_pair_overlap"} | TRAIN_TESTS - {"test_train_bpe_ties"} | ENCODE_TESTS,
    "merge-drops-last": MERGE_TESTS | TRAIN_TESTS | ENCODE_TESTS,
    "merge-str-replace": {"test_merge_pair_hidden"},
    **dict.fromkeys(("train-no-pretokenize", "train-ties-first-seen", "train-ties-by-id", "train-unweighted-pieces",
                     "train-one-merge-too-many"), TRAIN_TESTS),
    **dict.fromkeys(("encode-no-pretokenize", "encode-most-frequent-first", "encode-reversed-merges"), ENCODE_TESTS),
    **dict.fromkeys(("decode-per-token", "decode-latin1"), DECODE_TESTS),
    "decode-errors-ignore": DECODE_TESTS - {"test_decode"},
    "uses-reference-bpe": TRAIN_TESTS | ENCODE_TESTS | DECODE_TESTS,
}


# case -> {student (of WRONG, or blind): what the case's message says to it}
SAYS = {
    "08.count_pairs.visible": {
        "count-pairs-once": "every pair is counted once: count how *often*",
    },
    "08.train_bpe.ties": {
        "ties-least": "ties are broken the other way",
        "ties-first-counted": "ties are broken by which pair was counted first",
    },
    "08.train_bpe.visible": {
        "no-pretokenize": "the text is not pre-tokenized",
        "ties-joined-bytes": "ties are compared on the joined bytes vocab[a] + vocab[b]",
        "count-pairs-without-overlaps": "overlapping occurrences were counted once",
    },
    "08.encode.visible": {
        "overlap-merged-twice": "overlapping occurrences of a pair are merged twice",
        "encode-leftmost-pair": "or merged its first mergeable pair from the left again and again: BPE merges by rank",
    },
    "08.encode.hidden_unicode": {
        "encode-code-points": "the ids start as the characters' code points, ord(c)",
    },
    "08.decode.split": {
        "decode-token-by-token-strict": "join the bytes of all the tokens first and decode once",
        "decode-errors-ignore": "the bytes that are not UTF-8 were dropped (errors='ignore')",
        "decode-latin-1": "the bytes were decoded as Latin-1",
    },
}

# the lab's points; nbgrader validate on a student: the cells it reports failed, the first failed case, its message
TOTAL, VALIDATE = 25, Validation("decode-token-by-token-strict", 2, "08.decode.split",
                                 "join the bytes of all the tokens first and decode once")


class TestLab08(RoundTrip, NamedMistakes, BlindStudents):
    """Lab 08's round trip and in-process checks, from the tables above."""


def test_a_mistake_that_doubles_a_token_is_followed_only_so_far():
    """Issue 42's finding: with merge_pair's overlap mistake a word never shrinks, so a run of spaces merges (x, x)
    again and again, each token twice the last; the judge built those bytes for every mistake, whatever the
    student's merges, and one student's hidden text took `nbgrader autograde` to 3.5 GB (a class, past 20 GB)."""
    doubling = list(slow_merges(" " * 40, 320, overlap=True))
    assert doubling[:3] == [(32, 32), (256, 256), (257, 257)]
    assert doubling[-1] is None and len(doubling) < 64  # abandoned once a token passes MAX_TOKEN_BYTES
    # a student whose merges follow the doubling as far as any trainer could: judged, not named, no 2 ** 64 bytes built
    inputs = {"text": " " * 40, "vocab_size": 320}
    got = {"merges": torch.tensor(doubling[:-1], dtype=torch.int64)}
    with pytest.raises(CheckFailed, match=r"merge 5 \(making id 261\) is \(260, 260\)") as failed:
        get_case("08.train_bpe.visible").judge(got, {"merges": torch.tensor(trained_merges(**inputs))}, inputs)
    assert "merged twice" not in str(failed.value)
