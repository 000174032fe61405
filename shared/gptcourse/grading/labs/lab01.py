"""Lab 01, tokens and embeddings: `CharTokenizer(text)`, `one_hot_embed(ids, table)` and
`TokenAndPositionEmbedding`.

The student's `CharTokenizer(text)` has `vocab_size`, `encode(str) -> list[int]` and `decode(ids) -> str`, with the
vocabulary sorted(set(text)), and raises ValueError naming a character that is not in the vocabulary.

The student's `TokenAndPositionEmbedding(vocab_size, context_length, d_model)` has `tok_emb` (V, C) and
`pos_emb` (T_max, C) parameter tables (nn.Embedding or a (T_max, C) `.weight`); the cases load reference
weights into both. The references are gptcourse's, except where gptcourse has no such piece (each says why).
"""

from __future__ import annotations

import math
import random
from functools import partial
from typing import Any

import torch
from torch import nn

from ...checks import Mistake, check_close, check_shape, fail, mistake_key
from ...model.positions import LearnedPositions
from ...text.char_tokenizer import CharTokenizer
from ..cases import Inputs, Outputs, random_weights, sized, tensor_rng
from ..piece import Piece, declare
from ..student import TensorsMade, as_ids, as_text, describe_error, module_returns, returns

_WHOLE = ("gptcourse.GPT",)

# ---- CharTokenizer(text): sorted distinct characters <-> ids 0 .. V-1


def _tokenizer_inputs(text: str, sample: str, unknown: str) -> Inputs:
    """A training text, a string to encode (its characters are in the text) and one holding an unknown character."""
    reference = CharTokenizer(text)
    return {"text": text, "sample": sample, "unknown": unknown, "ids": reference.encode(sample[::-1]),
            "unknown_char": next(ch for ch in unknown if ch not in reference.stoi)}


def _tokenizer_call(cls: Any, inputs: Inputs) -> Outputs:
    tok = cls(inputs["text"])
    sample, ids = inputs["sample"], inputs["ids"]
    vocab_size = tok.vocab_size
    if not isinstance(vocab_size, int):
        raise fail(f"CharTokenizer.vocab_size is {type(vocab_size).__name__} {vocab_size!r:.60}, expected an int "
                   "(a property or an attribute)")
    outputs = {
        "vocab_size": vocab_size,
        "ids": as_ids(tok.encode(sample), f"encode({sample!r})"),
        "decoded": as_text(tok.decode(list(ids)), f"decode({ids})"),
        "roundtrip": as_text(tok.decode(tok.encode(sample)), f"decode(encode({sample!r}))"),
        "unknown_error": "",
        "unknown_returned": "",
    }
    try:
        outputs["unknown_returned"] = f"{tok.encode(inputs['unknown'])!r:.80}"
    except Exception as err:  # which exception, and what it says, is what the case grades
        outputs["unknown_error"] = f"{type(err).__name__}: {err}"[:300]
    return outputs


def _encode_mistakes(ids: torch.Tensor, want: torch.Tensor, text: str, sample: str) -> dict[str, torch.Tensor]:
    """What encode(sample) gives with the usual mistakes ({why: ids}), for ids that are wrong."""
    first_seen = {ch: i for i, ch in enumerate(dict.fromkeys(text))}
    mistakes = {
        Mistake("01.ids_first_seen_order",
                "the ids follow the order in which characters first appear in the text: the vocabulary is sorted, "
                "sorted(set(text)), so ids follow character order"): torch.tensor([first_seen[ch] for ch in sample]),
        Mistake("01.ids_from_one",
                "the ids start at 1: the first character of the vocabulary has id 0"): want + 1,
    }
    if _same_partition(ids, want):  # one id per character, numbered in another order
        mistakes[Mistake("01.vocab_unsorted_set",
                         "each character has an id of its own, but not its place among the sorted characters: the "
                 "vocabulary is sorted(set(text)). list(set(text)) has no fixed order (it changes from one Python "
                 "process to the next, with PYTHONHASHSEED), so a saved model would decode nonsense")] = ids
    return mistakes


def _tokenizer_judge(got: Outputs, expected: Outputs, inputs: Inputs) -> None:
    text, sample = inputs["text"], inputs["sample"]
    if got["vocab_size"] != expected["vocab_size"]:
        why = (Mistake("01.vocab_per_character", "one id per *distinct* character: the vocabulary is sorted(set(text))")
               if got["vocab_size"] == len(text) else "the vocabulary is the distinct characters of the text")
        raise fail(f"vocab_size is {got['vocab_size']}, expected {expected['vocab_size']} for a text with "
                   f"{len(set(text))} distinct character{'s' * (len(set(text)) != 1)}: {why}.",
                   mistake_key(why))
    if got["ids"].numel() != len(sample):
        raise fail(f"encode({sample!r}) returned {got['ids'].numel()} ids for {len(sample)} characters: one id per "
                   "character.", mistake="01.encode_not_per_character")
    check_close(got["ids"], expected["ids"], f"encode({sample!r})",
                mistakes=partial(_encode_mistakes, got["ids"], expected["ids"], text, sample))
    for name, call in (("decoded", f"decode({inputs['ids']})"), ("roundtrip", f"decode(encode({sample!r}))")):
        if got[name] != expected[name]:
            hint = (": join the characters with ''.join(...), not with a separator"
                    if got[name].replace(" ", "") == expected[name].replace(" ", "") else "")
            raise fail(f"{call} returned {got[name]!r}, expected {expected[name]!r}{hint}.",
                       mistake="01.decode_separator" if hint else None)
    unknown, ch, error = inputs["unknown"], inputs["unknown_char"], got["unknown_error"]
    if not error:
        raise fail(f"encode({unknown!r}) returned {got['unknown_returned']} without an error, but {ch!r} is not in "
                   "the vocabulary: raise a ValueError that names the character instead of inventing an id.",
                   mistake="01.unknown_char_no_error")
    if not error.startswith("ValueError"):
        raise fail(f"encode({unknown!r}) raised {error}; expected a ValueError whose message names the unknown "
                   f"character {ch!r} (catch the KeyError and raise ValueError(...) from None).",
                   mistake="01.unknown_char_not_value_error")
    if ch not in error and repr(ch) not in error:
        raise fail(f"encode({unknown!r}) raised {error}, which does not name the unknown character {ch!r}: say which "
                   "character is not in the vocabulary.", mistake="01.unknown_char_unnamed")


def _same_partition(ids: torch.Tensor, expected: torch.Tensor) -> bool:
    """Whether `ids` give two characters the same id exactly where `expected` does (each (L,))."""
    return torch.equal(ids[:, None] == ids[None, :], expected[:, None] == expected[None, :])


def _tokenizer_hidden(r: random.Random, seed: int) -> Inputs:
    pool = list("abcdefghijklmnopqrstuvwxyzABCDEFGH .,;:'\n\té-")
    chars = r.sample(pool, r.randint(8, 20))
    text = "".join(r.choice(chars) for _ in range(r.randint(30, 60))) + "".join(chars)
    sample = "".join(r.choice(chars) for _ in range(r.randint(5, 15)))
    return _tokenizer_inputs(text, sample, sample[:3] + r.choice("!#~€9@") + sample[3:])


# ---- one_hot_embed(ids, table): the embedding lookup written as one-hot @ E


def _one_hot_inputs(b: int, t: int, v: int, c: int, seed: int, top_id_unused: bool = False,
                    dtype: torch.dtype = torch.float32) -> Inputs:
    gen = tensor_rng(seed)
    high = v - 1 if top_id_unused else v
    ids = torch.randint(0, high, (b, t), generator=gen)
    if not top_id_unused:
        ids.view(-1)[-1] = v - 1  # the last token id appears
    return {"ids": ids, "table": torch.randn(v, c, generator=gen, dtype=dtype),
            "sizes": {"B": b, "T": t, "V": v, "C": c}}


_one_hot_returns = returns("embedded", lambda i: f"one_hot_embed(ids {tuple(i['ids'].shape)}, table "
                           f"{tuple(i['table'].shape)})", "ids", "table")


def _one_hot_call(fn: Any, inputs: Inputs) -> Outputs:
    """The student's one_hot_embed, and whether it made the (B, T, V) one-hot matrix on the way (a lookup of the
    table's rows gives the same embeddings without it). A shape error when the batch lacks the vocabulary's top ids
    is named (one_hot without num_classes sizes its rows by the largest id present), and so is a product of two
    dtypes (the one-hot matrix cast to float32 whatever the table's)."""
    (b, t), v, dtype = inputs["ids"].shape, inputs["table"].size(0), inputs["table"].dtype
    try:
        with TensorsMade() as made:
            outputs = _one_hot_returns(fn, inputs)
    except RuntimeError as err:
        width = int(inputs["ids"].max()) + 1
        if width < v and ("shape" in str(err) or "size" in str(err)):
            raise fail(f"one_hot_embed raised RuntimeError: {str(err)[:120]}. Here the largest id is {width - 1} and "
                       f"V = {v}: one_hot(ids) without num_classes makes max(ids) + 1 = {width} columns, not V, "
                       "whenever the top ids of the vocabulary are missing from a batch. Pass num_classes=V, "
                       "one_hot(ids, table.size(0))", mistake="01.one_hot_no_num_classes") from None
        if "dtype" in str(err):
            raise fail(f"one_hot_embed raised RuntimeError: {str(err)[:120]}. The table is {dtype}: cast the one-hot "
                       "matrix to the table's dtype, one_hot(ids, V).to(table.dtype), not to a fixed one such as "
                       ".float()", mistake="01.one_hot_fixed_dtype") from None
        raise
    one_hot = any(shape[-1:] == (v,) and math.prod(shape) == b * t * v for shape in made.shapes)
    return outputs | {"one_hot_made": one_hot}


def _one_hot_judge(got: Outputs, expected: Outputs, inputs: Inputs) -> None:
    """The embeddings are the table's rows of the ids, and they came from a one-hot matrix times the table."""
    label = "one_hot_embed output"
    check_shape(got["embedded"], "B T C", inputs["sizes"], label,
                causes={("C", "V"): Mistake("01.one_hot_not_multiplied",
                                            "the one-hot rows are not multiplied by the table (one_hot(ids, V) @ E)")})
    ids, table = inputs["ids"], inputs["table"]
    check_close(got["embedded"], expected["embedded"], label, mistakes={
        Mistake("01.rows_by_position",
                "row t of the table was taken for position t, not for the token id at position t"):
            lambda: table[torch.arange(ids.size(1))].expand(ids.size(0), -1, -1)})
    if not got["one_hot_made"]:
        b, t, v = *ids.shape, table.size(0)
        raise fail(f"the embeddings are right, but no ({b}, {t}, {v}) one-hot matrix was made: the rows were looked "
                   "up (table[ids], F.embedding or nn.Embedding), which this piece is here to show is a matrix "
                   "product. Compute one_hot(ids, V) (B, T, V), as the table's dtype, @ table",
                   mistake="01.rows_looked_up")


# ---- TokenAndPositionEmbedding: token vectors plus learned position vectors


def _embedding_inputs(b: int, t: int, v: int, t_max: int, c: int, seed: int) -> Inputs:
    gen = tensor_rng(seed)
    reference = nn.ModuleDict({"tok_emb": nn.Embedding(v, c), "pos_emb": LearnedPositions(t_max, c)})
    return {
        "init": {"vocab_size": v, "context_length": t_max, "d_model": c},
        "weights": random_weights(reference, gen, scale=1.0),
        "idx": torch.randint(0, v, (b, t), generator=gen),
        "sizes": {"B": b, "T": t, "V": v, "C": c, "T_max": t_max},
    }


_embedding_returns = module_returns("x", lambda i: "TokenAndPositionEmbedding({vocab_size}, {context_length}, "
                                                   "{d_model})".format(**i["init"]), arg="idx")


def _embedding_call(cls: Any, inputs: Inputs) -> Outputs:
    """The student's embedding of the case's ids; an index past the position table's end, or the whole (T_max, C)
    table added to T < T_max tokens, is named: the raw errors do not say which positions were used."""
    t, t_max, top = inputs["sizes"]["T"], inputs["sizes"]["T_max"], int(inputs["idx"].max())
    try:
        return _embedding_returns(cls, inputs)
    except IndexError as err:
        if top < t_max and t < t_max:
            raise
        causes = ([f"the token ids (up to {top}) used as positions"] if top >= t_max else []) + \
                 ([f"positions 1..T, whose last, {t}, is one past the table"] if t == t_max else [])
        raise fail(f"{describe_error(err)}. pos_emb has T_max = {t_max} rows, positions 0..{t_max - 1}: "
                   f"{' or '.join(causes)}? Look up positions 0..T-1, torch.arange(T), whatever the tokens",
                   mistake="01.positions_out_of_table") from None
    except RuntimeError as err:
        if t == t_max or "must match" not in str(err) or f"({t_max})" not in str(err):
            raise
        raise fail(f"{describe_error(err)}. The whole position table, {t_max} rows (context_length), was added to "
                   f"T = {t} tokens: add the positions of the sequence only, pos_emb(torch.arange(T)) with "
                   "T = idx.size(1)", mistake="01.whole_position_table") from None


def _embedding_expected(inputs: Inputs) -> Outputs:
    """The GPT's embedding, as gptcourse.GPT.forward_hidden computes it (nn.Embedding plus LearnedPositions):
    gptcourse has no layer of its own for this piece."""
    init, w = inputs["init"], inputs["weights"]
    positions = LearnedPositions(init["context_length"], init["d_model"])
    positions.load_state_dict({"weight": w["pos_emb.weight"]})
    idx = inputs["idx"]
    with torch.no_grad():
        return {"x": w["tok_emb.weight"][idx] + positions(torch.arange(idx.size(1)))}  # (B, T, C) + (T, C)


def _embedding_mistakes(inputs: Inputs) -> dict[str, torch.Tensor]:
    tok, pos, idx = inputs["weights"]["tok_emb.weight"], inputs["weights"]["pos_emb.weight"], inputs["idx"]
    (b, t), c = idx.shape, tok.size(1)
    mistakes = {
        Mistake("01.no_positions",
                "the positions are missing: add pos_emb of positions 0..T-1 to the token embeddings"): tok[idx],
        Mistake("01.tokens_scaled",
                "the token vectors are multiplied by sqrt(d_model) (the original Transformer's scaling, which GPT does "
                "not have): add them unscaled, tok_emb(idx) + pos_emb(positions)"): tok[idx] * math.sqrt(c) + pos[:t],
    }
    if b <= pos.size(0) and b > 1:
        mistakes[Mistake("01.positions_by_batch",
                         "sequence b of the batch got position b's vector at every token: the positions run along the "
                         "sequence, axis 1, 0..T-1 = torch.arange(idx.size(1)), the same for every sequence")] = \
            tok[idx] + pos[:b, None]
    if int(idx.max()) < pos.size(0):
        mistakes[Mistake("01.positions_by_token_id",
                      "the position table was indexed by the token ids: positions are 0..T-1, whatever the tokens")] = \
            tok[idx] + pos[idx]
    if t < pos.size(0):
        mistakes[Mistake("01.positions_from_one",
                         "the positions start at 1: the first token is at position 0")] = tok[idx] + pos[1:t + 1]
    return mistakes


def _embedding_hidden(r: random.Random, seed: int) -> Inputs:
    t_max = r.randint(8, 16)
    return _embedding_inputs(r.randint(2, 4), r.randint(2, t_max - 1), r.randint(20, 40), t_max, r.randint(5, 7),
                             seed)


PIECES = declare(
    Piece("01", "CharTokenizer", CharTokenizer, _tokenizer_call, judge=_tokenizer_judge,
          forbidden=("gptcourse.CharTokenizer",),
          visible=[("visible", "CharTokenizer('hello world'): encode, decode, an unknown character",
                    lambda seed: _tokenizer_inputs("hello world", "world hello", "hello!"))],
          hidden=[("hidden_single", "CharTokenizer with a one-character vocabulary",
                   lambda seed: _tokenizer_inputs("aaaa", "a", "a#")),
                  ("hidden_empty", "CharTokenizer encoding and decoding the empty string",
                   lambda seed: _tokenizer_inputs("to be or not", "", "Z")),
                  ("hidden_sizes", "CharTokenizer on another text (newlines, tabs, accents)",
                   sized(_tokenizer_hidden))]),
    # gptcourse has no one-hot lookup: the lookup it teaches is torch's, the one nn.Embedding (and the GPT) runs
    Piece("01", "one_hot_embed", nn.functional.embedding, _one_hot_call, judge=_one_hot_judge, forbidden=_WHOLE,
          visible=[("visible", "one_hot_embed with B=2, T=4, V=6, C=3, the last id unused",
                    lambda seed: _one_hot_inputs(2, 4, 6, 3, seed, top_id_unused=True))],
          hidden=[("hidden_single", "one_hot_embed of a single token (B=1, T=1), a float64 table",
                   lambda seed: _one_hot_inputs(1, 1, 7, 4, seed, dtype=torch.float64)),
                  ("hidden_sizes", "one_hot_embed with other sizes, the last id unused",
                   sized(lambda r, seed: _one_hot_inputs(r.randint(2, 4), r.randint(6, 12), r.randint(20, 40),
                                                         r.randint(5, 9), seed, top_id_unused=True)))]),
    Piece("01", "TokenAndPositionEmbedding", LearnedPositions, _embedding_call, expected=_embedding_expected,
          label="embedding output", shape="B T C", mistakes=_embedding_mistakes,
          forbidden=("gptcourse.LearnedPositions", *_WHOLE),
          visible=[("visible", "TokenAndPositionEmbedding with B=2, T=5, V=11, T_max=8, C=4",
                    lambda seed: _embedding_inputs(2, 5, 11, 8, 4, seed))],
          hidden=[("hidden_single", "TokenAndPositionEmbedding on one token (B=1, T=1)",
                   lambda seed: _embedding_inputs(1, 1, 9, 6, 3, seed)),
                  ("hidden_full", "TokenAndPositionEmbedding on a full context (T = T_max)",
                   lambda seed: _embedding_inputs(3, 7, 10, 7, 5, seed)),
                  ("hidden_sizes", "TokenAndPositionEmbedding with other sizes", sized(_embedding_hidden))]),
)
