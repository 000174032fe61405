import pytest

from gptcourse import CharTokenizer


def test_round_trip_and_sorted_vocabulary():
    text = "hello, world!\nthe quick brown fox"
    tok = CharTokenizer.from_text(text)
    assert tok.chars == sorted(set(text))
    assert tok.vocab_size == len(set(text))
    assert tok.decode(tok.encode(text)) == text
    assert tok.encode("eh") == [tok.chars.index("e"), tok.chars.index("h")]


def test_unknown_character_is_named_with_its_position():
    tok = CharTokenizer.from_text("abc")
    with pytest.raises(ValueError, match=r"character 'z' at position 2 is not in the vocabulary \(3 characters"):
        tok.encode("abz")


def test_out_of_range_id():
    tok = CharTokenizer.from_text("abc")
    with pytest.raises(ValueError, match=r"token id 3 is out of range: expected 0 <= id < 3"):
        tok.decode([0, 3])


def test_empty_vocabulary():
    with pytest.raises(ValueError, match="empty vocabulary"):
        CharTokenizer.from_text("")
