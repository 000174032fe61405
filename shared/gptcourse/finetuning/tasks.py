"""Small supervised tasks cut from a text (by default the shipped corpus, Python source), deterministically, so
that lesson 10 finetunes on the same examples on every machine and nothing is downloaded.

- `line_kind_task`: classify a line of code: a comment, a definition, a return, or control flow (`LINE_KINDS`);
- `keywordless_line_kind_task`: the same lines with the keyword that decides their kind cut off, so the kind must
  be read from the rest of the line;
- `signature_task`: instruction tuning pairs, prompt "signature of NAME:" -> response "def NAME(ARGS):";
- `preference_task`: pairs (chosen, rejected) of a real line and the same line with its words after the first
  shuffled, for a reward model that should prefer the real one.
Each returns a list in a seeded random order; slice it into training and validation parts.
"""

from __future__ import annotations

import random
import re

LINE_KINDS = ("comment", "definition", "return", "control flow")
_KIND_PREFIXES = (("#",), ("def ", "class "), ("return",), ("if ", "elif ", "for ", "while "))
_SIGNATURE = re.compile(r"\s*def (\w+)\(([^()]*)\):\s*$")
SIGNATURE_PROMPT = "signature of {name}:\n"
SIGNATURE_RESPONSE = "def {name}({args}):\n"


def _lines(text: str, shortest: int, longest: int) -> list[str]:
    """The distinct stripped lines of `text` with shortest..longest characters, in order of first appearance."""
    return list(dict.fromkeys(s for line in text.splitlines() if shortest <= len(s := line.strip()) <= longest))


def line_kind_task(text: str, per_class: int = 300, longest: int = 48, seed: int = 0) -> list[tuple[str, int]]:
    """(line, label) pairs, `per_class` of each kind in `LINE_KINDS` (label = its index), shuffled."""
    by_kind: list[list[str]] = [[] for _ in LINE_KINDS]
    for line in _lines(text, 8, longest):
        kind = next((k for k, prefixes in enumerate(_KIND_PREFIXES) if line.startswith(prefixes)), None)
        if kind is not None:
            by_kind[kind].append(line)
    rng = random.Random(seed)
    short = [LINE_KINDS[k] for k, lines in enumerate(by_kind) if len(lines) < per_class]
    if short:
        raise ValueError(f"the text has fewer than per_class={per_class} lines of kind {short}")
    examples = [(line, k) for k, lines in enumerate(by_kind) for line in rng.sample(lines, per_class)]
    rng.shuffle(examples)
    return examples


def keywordless_line_kind_task(text: str, per_class: int = 300, longest: int = 48,
                               seed: int = 0) -> list[tuple[str, int]]:
    """`line_kind_task`'s (line, label) pairs, in its order, each line without the keyword that decides its kind
    ("#", "def ", "return", ...) and the spaces after it (never empty: a line has at least 8 characters)."""
    pairs = []
    for line, kind in line_kind_task(text, per_class, longest, seed):
        keyword = next(prefix for prefix in _KIND_PREFIXES[kind] if line.startswith(prefix))
        pairs.append((line.removeprefix(keyword).lstrip(), kind))
    return pairs


def signature_task(text: str, longest: int = 64, seed: int = 0) -> list[tuple[str, str]]:
    """(prompt, response) pairs from the one-line `def` statements of `text`, prompt + response at most `longest`
    characters, one per distinct signature, shuffled."""
    pairs = []
    for line in text.splitlines():
        match = _SIGNATURE.match(line)
        if match:
            name, args = match.groups()
            pair = (SIGNATURE_PROMPT.format(name=name), SIGNATURE_RESPONSE.format(name=name, args=args))
            if len(pair[0]) + len(pair[1]) <= longest:
                pairs.append(pair)
    pairs = list(dict.fromkeys(pairs))
    random.Random(seed).shuffle(pairs)
    return pairs


def preference_task(text: str, n: int = 1000, longest: int = 48, seed: int = 0) -> list[tuple[str, str]]:
    """(chosen, rejected) pairs: a line of code with at least four words, and the same line with the words after
    the first in a shuffled order (never the original order)."""
    rng = random.Random(seed)
    pairs = []
    for line in _lines(text, 16, longest):
        words = line.split(" ")
        if len(words) < 4 or line.startswith("#"):
            continue
        rest = words[1:]
        shuffled = rng.sample(rest, len(rest))
        if shuffled != rest:
            pairs.append((line, " ".join(words[:1] + shuffled)))
    if len(pairs) < n:
        raise ValueError(f"the text gives only {len(pairs)} preference pairs, fewer than n={n}")
    return rng.sample(pairs, n)
