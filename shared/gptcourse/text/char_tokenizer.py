"""A character-level tokenizer: every distinct character of a text is one token id."""

from __future__ import annotations

from collections.abc import Iterable, Sequence


class CharTokenizer:
    """Maps characters to ids 0..V-1 in sorted order, and back."""

    def __init__(self, chars: Iterable[str]) -> None:
        self.chars: list[str] = sorted(set(chars))
        if not self.chars:
            raise ValueError("a tokenizer needs at least one character, got an empty vocabulary")
        self.stoi = {ch: i for i, ch in enumerate(self.chars)}

    @classmethod
    def from_text(cls, text: str) -> CharTokenizer:
        return cls(text)

    @property
    def vocab_size(self) -> int:
        return len(self.chars)

    def encode(self, text: str) -> list[int]:
        try:
            return [self.stoi[ch] for ch in text]
        except KeyError as err:
            ch = err.args[0]
            raise ValueError(
                f"character {ch!r} at position {text.index(ch)} is not in the vocabulary "
                f"({self.vocab_size} characters built from the training text)"
            ) from None

    def decode(self, ids: Sequence[int] | Iterable[int]) -> str:
        out = []
        for i in ids:
            i = int(i)
            if not 0 <= i < self.vocab_size:
                raise ValueError(f"token id {i} is out of range: expected 0 <= id < {self.vocab_size}")
            out.append(self.chars[i])
        return "".join(out)
