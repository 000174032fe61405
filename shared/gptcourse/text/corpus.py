"""Offline text for training: a corpus shipped with the package by default, or any text file.

Nothing is ever downloaded. The default corpus, `data/python_stdlib.txt` (about 0.5 MB), is the source of a few
modules of Python 3.11.7's standard library (`STDLIB_MODULES`, joined by newlines; PSF license in
`data/LICENSE-PSF.txt`). It is shipped rather than read from the student's own Python because that text changes
from version to version, and lesson 07's vocabulary, losses and samples must be the same on every machine.
"""

from __future__ import annotations

from pathlib import Path

import torch

CORPUS = Path(__file__).parent / "data" / "python_stdlib.txt"
STDLIB_MODULES = (  # what CORPUS holds, in this order
    "argparse.py", "bisect.py", "calendar.py", "dataclasses.py", "difflib.py", "fractions.py",
    "functools.py", "heapq.py", "json/decoder.py", "json/encoder.py", "random.py", "shlex.py",
    "statistics.py", "string.py", "textwrap.py",
)


def load_text(path: str | Path | None = None) -> str:
    """The text of `path`, or without one the default corpus (`CORPUS`)."""
    path = CORPUS if path is None else Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"no text file at {path}")
    return path.read_text(encoding="utf-8")


def train_val_split(ids: torch.Tensor, val_fraction: float = 0.1) -> tuple[torch.Tensor, torch.Tensor]:
    """The first (1 - val_fraction) of the ids for training, the rest for validation."""
    if not 0.0 < val_fraction < 1.0:
        raise ValueError(f"val_fraction must be in (0, 1), got {val_fraction}")
    n = int(len(ids) * (1 - val_fraction))
    return ids[:n], ids[n:]


def get_batch(
    ids: torch.Tensor, batch_size: int, block_size: int, generator: torch.Generator | None = None
) -> tuple[torch.Tensor, torch.Tensor]:
    """Random windows: inputs x (B, T) and targets y (B, T), y shifted one token to the left of x."""
    if len(ids) <= block_size:
        raise ValueError(f"need more than block_size={block_size} tokens to draw a batch, got {len(ids)}")
    starts = torch.randint(len(ids) - block_size, (batch_size,), generator=generator)  # (B,)
    offsets = torch.arange(block_size)  # (T,)
    x = ids[starts[:, None] + offsets]  # (B, T)
    y = ids[starts[:, None] + offsets + 1]  # (B, T)
    return x, y
