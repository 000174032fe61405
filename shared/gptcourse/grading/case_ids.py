"""A test case's id, "NN.piece.variant", and its one parser; no torch, so that the class report can read ids too."""

from __future__ import annotations

import re
from dataclasses import dataclass

_CASE_ID = re.compile(r"(\d\d)\.([A-Za-z_][A-Za-z0-9_]*)\.([A-Za-z0-9_]+)")


@dataclass(frozen=True)
class CaseId:
    """A test id, "NN.piece.variant": the lab, the piece (its student-facing name) and the variant; a hidden
    case's variant starts with "hidden"."""

    lab: str
    piece: str
    variant: str

    @classmethod
    def parse(cls, text: str) -> CaseId:
        """The id `text` names; ValueError saying what a test id looks like (it may come from a payload)."""
        match = _CASE_ID.fullmatch(text) if isinstance(text, str) else None
        if match is None:
            raise ValueError(f"{str(text)[:80]!r} is not a test id: expected 'NN.piece.variant', e.g. "
                             "'10.padding_mask.visible'")
        return cls(*match.groups())

    @property
    def hidden(self) -> bool:
        return self.variant.startswith("hidden")

    def __str__(self) -> str:
        return f"{self.lab}.{self.piece}.{self.variant}"
