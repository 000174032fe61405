"""Lab 08 graded by real nbgrader: full marks for the solution, 0 for the untouched release, and each known
mistake loses exactly the points of the tests it should fail."""

from __future__ import annotations

from lab_roundtrip import RoundTrip, Validation

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
DECODE = '''
def decode(ids, merges):
    vocab = {i: bytes([i]) for i in range(256)}
    for k, (a, b) in enumerate(merges):
        vocab[256 + k] = vocab[a] + vocab[b]
    return "".join(vocab[i].decode("utf-8") for i in ids)
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
    "decode-token-by-token-strict": ({"decode": DECODE}, {"test_decode_split", "test_decode_hidden"}),
}


class TestLab08(RoundTrip):
    LAB = LAB
    WRONG = WRONG
    TOTAL = 25
    VALIDATE = Validation("decode-token-by-token-strict", 1, (
        'check("08.decode.split", decode)',
        "join the bytes of all the tokens first and decode once",
    ))
