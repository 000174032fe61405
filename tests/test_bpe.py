"""BPETokenizer against independent references: a slow, obviously-correct trainer written here (the documented
tie rule), Hugging Face `tokenizers` (its Rust BPE model encodes, its BpeTrainer trains), and plain round trips."""

from __future__ import annotations

import json
import random
import re
from collections import Counter
from itertools import pairwise

import pytest
import regex
from tokenizers import AddedToken, Regex, Tokenizer, decoders, models, pre_tokenizers, processors, trainers

from gptcourse import GPT2_PATTERN, BPETokenizer, load_text

# openai/gpt-2 src/encoder.py, written out here rather than taken from the package
GPT2_REGEX = r"""'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+"""
EOT = "<|endoftext|>"
ADVERSARIAL = [
    "日本語のテキスト、中文字符と한국어", "👩‍👩‍👧‍👦 family 🇫🇷 flag 🏳️‍🌈", "e\u0301\u0302 combining a\u0308 \u0301alone",
    "\x00\x01\x1c\x1d\x1e\x1f controls", "nbsp\u00a0here\u2028line\u3000ideo\u0085nel", "١٢٣ ٤٥ digits ²³ ½ 12345678",
    "don't I'm we'll they've 'S 'LL ''s", "a   b\t\t c\r\n\r\n  \n", "  leading", "trailing   ", "\ufeffbom \U0010ffff",
    "ǅ titlecase ﬁ ligature", "x<|endoftext|>y<|endoftext|><|endoftext|>", "<|endo <|endoftext", "",
]


@pytest.fixture(scope="module")
def corpus() -> str:
    return load_text()


@pytest.fixture(scope="module")
def trained(corpus) -> BPETokenizer:
    return BPETokenizer.train(corpus, 1024)


def slow_train(text: str, vocab_size: int, specials: tuple[str, ...] = (EOT,)) -> tuple[list, list[bool]]:
    """Merges by recounting every pair of every pre-token at every step, on byte strings; and whether each merge
    was chosen among tied counts."""
    pieces = re.split("|".join(map(re.escape, specials)), text) if specials else [text]
    counts = Counter(w.encode("utf-8", "surrogatepass") for p in pieces for w in regex.findall(GPT2_REGEX, p))
    words = {tuple(bytes([b]) for b in w): n for w, n in counts.items()}
    tokens = {bytes([b]) for b in range(256)}
    merges, tied = [], []
    while len(tokens) + len(specials) < vocab_size:
        pairs: Counter = Counter()
        for word, n in words.items():
            for pair in pairwise(word):
                pairs[pair] += n
        if not pairs:
            break
        best = max(pairs, key=lambda p: (pairs[p], p))  # most frequent; ties: greatest (left bytes, right bytes)
        tied.append(list(pairs.values()).count(pairs[best]) > 1)
        merges.append(best)
        tokens.add(best[0] + best[1])
        merged_words = {}
        for word, n in words.items():
            out, i = [], 0
            while i < len(word):
                if word[i:i + 2] == best:
                    out.append(best[0] + best[1])
                    i += 2
                else:
                    out.append(word[i])
                    i += 1
            merged_words[tuple(out)] = n
        words = merged_words
    return merges, tied


def test_the_pattern_is_gpt2s():
    assert GPT2_PATTERN == GPT2_REGEX


@pytest.mark.parametrize(("start", "length", "vocab_size"), [(0, 3000, 300), (100_000, 20_000, 420),
                                                             (300_000, 6000, 700)])
def test_training_equals_the_slow_trainer(corpus, start, length, vocab_size):
    text = corpus[start:start + length]
    merges, tied = slow_train(text, vocab_size)
    assert any(tied)  # the tie rule is exercised
    tok = BPETokenizer.train(text, vocab_size)
    first = next((k for k, (a, b) in enumerate(zip(tok.merges, merges, strict=False)) if a != b), None)
    assert first is None, f"merge {first}: got {tok.merges[first]}, the slow trainer {merges[first]}"
    assert tok.merges == merges


def test_training_on_unicode_and_repeated_letters_equals_the_slow_trainer():
    text = "aaaa aaa aa a " * 5 + "日本語 日本 😀😀😀 é é e\u0301 " * 3 + f"ab{EOT}ab abab{EOT}" * 4
    merges, _ = slow_train(text, 300)
    tok = BPETokenizer.train(text, 300)
    assert tok.merges == merges
    assert tok.vocab_size < 300  # the text ran out of pairs before 300 tokens
    assert not any(EOT.encode() in a + b for a, b in tok.merges)  # nothing merges across or into a special token


def test_encoding_equals_the_rust_bpe_model(trained, corpus):
    hf = trained.to_hf()
    ids = trained.encode(corpus)
    assert ids == hf.encode(corpus).ids
    for text in ADVERSARIAL:
        assert trained.encode(text, allowed_special="all") == hf.encode(text).ids, repr(text)


def test_decode_inverts_encode_on_any_unicode(trained, corpus):
    assert trained.decode(trained.encode(corpus)) == corpus
    for text in ADVERSARIAL:
        assert trained.decode(trained.encode(text, allowed_special="all")) == text
        assert trained.decode(trained.encode(text, allowed_special="none")) == text
    lone = "a\ud800b \udfff"  # lone surrogates: not characters; their 3 bytes each are kept and are invalid UTF-8
    ids = trained.encode(lone)
    assert trained.decode_bytes(ids) == lone.encode("utf-8", "surrogatepass")
    assert trained.decode(ids, errors="surrogatepass") == lone
    assert trained.decode(ids) == lone.encode("utf-8", "surrogatepass").decode("utf-8", "replace")


def test_a_character_split_across_tokens_decodes_whole(trained):
    ids = list("😀".encode())  # four byte tokens
    assert trained.decode(ids) == "😀"
    assert trained.decode(ids[:2]) == "\ufffd"


def test_special_tokens_are_one_id_only_when_allowed(trained):
    eot = trained.special_tokens[EOT]
    assert eot == trained.vocab_size - 1 and trained.vocab[eot] == EOT.encode()
    text = f"x = 1{EOT}y = 2"
    ids = trained.encode(text, allowed_special="all")
    assert ids.count(eot) == 1 and ids == [*trained.encode("x = 1"), eot, *trained.encode("y = 2")]
    plain = trained.encode(text, allowed_special="none")
    assert eot not in plain and trained.decode(plain) == text
    assert trained.encode(text, allowed_special={EOT}) == ids
    with pytest.raises(ValueError, match="allowed_special must be"):
        trained.encode(text, allowed_special={"<|unknown|>"})


def test_a_special_tokens_text_is_refused_unless_allowed(trained):
    text = f"x = 1{EOT}y = 2"
    refusal = rf"contains the special token '<\|endoftext\|>': pass allowed_special={{'<\|endoftext\|>'}} " \
              rf"\(or 'all'\) to encode it as its id {trained.special_tokens[EOT]}, or allowed_special='none'"
    for allowed in ((), set()):
        with pytest.raises(ValueError, match=refusal):
            trained.encode(text, allowed_special=allowed)
    with pytest.raises(ValueError, match=refusal):
        trained.encode(text)  # the default is the safe choice, as in tiktoken
    assert trained.encode("x <|endo ftext|>") == trained.encode("x <|endo ftext|>", allowed_special="none")


def test_two_special_tokens_one_inside_the_other():
    tok = BPETokenizer.train("some text " * 20, 300, special_tokens=("<|a|>", "<|a|><|b|>"))
    a, ab = tok.special_tokens["<|a|>"], tok.special_tokens["<|a|><|b|>"]
    assert tok.encode("x<|a|><|b|>y<|a|>", allowed_special="all") == [*tok.encode("x"), ab, *tok.encode("y"), a]
    assert tok.encode("x<|a|><|b|>y", allowed_special={"<|a|><|b|>"}) == [*tok.encode("x"), ab, *tok.encode("y")]
    with pytest.raises(ValueError, match=r"special token '<\|a\|>'"):
        tok.encode("x<|a|><|b|>y<|a|>", allowed_special={"<|a|><|b|>"})


def test_bad_input_is_refused_with_what_was_expected():
    with pytest.raises(ValueError, match=r"vocab_size must be an int >= 256 \+ 1"):
        BPETokenizer.train("hello", 256)
    with pytest.raises(TypeError, match="must be a str, got bytes"):
        BPETokenizer.train(b"hello", 300)
    tok = BPETokenizer.train("hello hello", 260)
    with pytest.raises(TypeError, match="must be a str, got list"):
        tok.encode(["hello"])
    with pytest.raises(ValueError, match=r"token id 999 is out of range: expected 0 <= id < 260"):
        tok.decode([104, 999])
    with pytest.raises(ValueError, match="no earlier merge made"):
        BPETokenizer([(b"he", b"l")])
    with pytest.raises(ValueError, match=r"special tokens \['he'\] are spelled like merged tokens"):
        BPETokenizer([(b"h", b"e")], special_tokens=["he"]).to_hf()


def test_from_hf_of_to_hf_is_the_same_tokenizer(trained):
    back = BPETokenizer.from_hf(trained.to_hf())
    assert back.merges == trained.merges and back.vocab == trained.vocab
    assert back.special_tokens == trained.special_tokens


def test_save_and_load_round_trip(trained, tmp_path):
    path = tmp_path / "bpe.json"
    trained.save(path)
    assert '"Ġ t"' in path.read_text(encoding="utf-8") or '"Ġ a"' in path.read_text(encoding="utf-8")
    back = BPETokenizer.load(path)
    assert back.merges == trained.merges and back.vocab == trained.vocab
    assert back.special_tokens == trained.special_tokens and back.pattern == trained.pattern
    (tmp_path / "other.json").write_text("{}")
    with pytest.raises(ValueError, match=r"not a file written by BPETokenizer\.save"):
        BPETokenizer.load(tmp_path / "other.json")


def _rust_trained(text: str, vocab_size: int) -> Tokenizer:
    hf = Tokenizer(models.BPE())
    hf.pre_tokenizer = pre_tokenizers.Sequence([pre_tokenizers.Split(Regex(GPT2_REGEX), behavior="isolated"),
                                                pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)])
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=[EOT], show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    hf.train_from_iterator([text], trainer)
    return hf


def test_the_rust_trainer_learns_the_same_vocabulary_where_no_ties_occur(corpus):
    _, tied = slow_train(corpus, 256 + 1 + 60)
    untied = tied.index(True)  # the merges before the first tie are fully defined by the counts alone
    assert untied > 20
    size = 256 + untied + 1
    ours = BPETokenizer.train(corpus, size)
    rust = BPETokenizer.from_hf(_rust_trained(corpus, size))
    assert set(ours.vocab.values()) == set(rust.vocab.values())



# ---- a pretrained vocabulary keeps its own ids

def _gpt2_bytes_to_unicode() -> dict[int, str]:
    """openai/gpt-2 encoder.py's bytes_to_unicode, written out here: printable bytes stand for themselves, the others
    get chr(256), chr(257), ...; the dict's order (printable first) is the order of ids 0-255 in encoder.json."""
    printable = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1), *range(ord("®"), ord("ÿ") + 1)]
    others = [b for b in range(256) if b not in printable]
    return {b: chr(b) for b in printable} | {b: chr(256 + n) for n, b in enumerate(others)}


def _byte_level(model: models.BPE) -> Tokenizer:
    """A tokenizer laid out as GPT-2's tokenizer.json: a plain ByteLevel pre-tokenizer (GPT-2's regex) and decoder."""
    hf = Tokenizer(model)
    hf.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    hf.decoder = decoders.ByteLevel()
    return hf


@pytest.fixture(scope="module")
def pretrained() -> dict[str, Tokenizer]:
    """A byte-level BPE trained by `tokenizers` on generated text, numbered as its trainer numbers it (the special
    token first, then the bytes by character, then the merges), and the same merges numbered as GPT-2's
    vocabulary is (the bytes in bytes_to_unicode's order, each merge's new token in merge order, the special token
    last)."""
    words = ["def", "return", "self", "naïve", "日本語", "😀", "x", "  ", "1234", "café", "\n", "don't", "\t"]
    rng = random.Random(0)
    text = " ".join(rng.choice(words) + rng.choice(["", " ", "\n", "   "]) for _ in range(20_000))
    trained = _byte_level(models.BPE())
    trainer = trainers.BpeTrainer(vocab_size=600, special_tokens=[EOT], show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    trained.train_from_iterator([text], trainer)
    merges = [tuple(m) for m in json.loads(trained.to_str())["model"]["merges"]]
    vocab = {ch: i for i, ch in enumerate(_gpt2_bytes_to_unicode().values())}
    for a, b in merges:
        vocab.setdefault(a + b, len(vocab))
    vocab[EOT] = len(vocab)
    gpt2 = _byte_level(models.BPE(vocab=vocab, merges=merges))
    gpt2.add_special_tokens([AddedToken(EOT, special=True, normalized=False)])
    return {"trainer": trained, "gpt2": gpt2}


VARIED = [*ADVERSARIAL, "    def f(self):\n        return 1234\n\n\n", "naïve café 日本語😀 don't\t\tx", " \n \n  ",
          f"{EOT}def{EOT} x\n{EOT}"]


@pytest.mark.parametrize("layout", ["trainer", "gpt2"])
def test_from_hf_keeps_the_tokenizers_own_ids(pretrained, layout, corpus):
    hf = pretrained[layout]
    ours = BPETokenizer.from_hf(hf)
    assert ours.vocab_size == hf.get_vocab_size() == 600
    assert ours.special_tokens == {EOT: hf.token_to_id(EOT)} == {EOT: 0 if layout == "trainer" else 599}
    for text in [*VARIED, corpus[:20_000]]:
        ids = ours.encode(text, allowed_special="all")
        assert ids == hf.encode(text).ids, repr(text[:40])
        assert ours.decode(ids) == text == hf.decode(ids, skip_special_tokens=False)
    assert ours.to_hf().encode(corpus[:5000]).ids == hf.encode(corpus[:5000]).ids


def test_a_pretrained_vocabulary_saves_and_loads_with_its_ids(pretrained, tmp_path):
    ours = BPETokenizer.from_hf(pretrained["trainer"])
    ours.save(tmp_path / "bpe.json")
    back = BPETokenizer.load(tmp_path / "bpe.json")
    assert back.vocab == ours.vocab and back.special_tokens == ours.special_tokens
    assert back.encode(VARIED[-2]) == ours.encode(VARIED[-2])


def test_from_hf_refuses_what_it_would_encode_differently(pretrained):
    spec = json.loads(pretrained["trainer"].to_str())
    spec["pre_tokenizer"]["add_prefix_space"] = True
    with pytest.raises(ValueError, match="expected a ByteLevel pre-tokenizer without a prefix space"):
        BPETokenizer.from_hf(Tokenizer.from_str(json.dumps(spec)))
    with_bos = Tokenizer.from_str(pretrained["trainer"].to_str())
    with_bos.post_processor = processors.TemplateProcessing(single=f"{EOT} $A", special_tokens=[(EOT, 0)])
    assert with_bos.encode("x").ids[0] == 0  # EOT before every text, as Llama's post-processor puts a BOS
    with pytest.raises(ValueError, match="TemplateProcessing post-processor would encode differently"):
        BPETokenizer.from_hf(with_bos)
    no_alphabet = _byte_level(models.BPE())  # trained without the 256 bytes: most bytes have no token
    no_alphabet.train_from_iterator(["some text " * 50], trainers.BpeTrainer(vocab_size=280, show_progress=False))
    with pytest.raises(ValueError, match="ids must number exactly the 256 bytes"):
        BPETokenizer.from_hf(no_alphabet)
    wordpiece = Tokenizer(models.WordPiece({"[UNK]": 0}, unk_token="[UNK]"))
    with pytest.raises(ValueError, match="expected a byte-level BPE tokenizer, got a WordPiece model"):
        BPETokenizer.from_hf(wordpiece)
