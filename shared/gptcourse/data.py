"""Offline text for training: the Python standard library's own source by default, or any text file.

Nothing is ever downloaded. Every Python install ships its standard library, so the default corpus is there
on every student's machine (its exact text depends on the Python version).
"""

from __future__ import annotations

import sysconfig
from pathlib import Path

import torch

STDLIB_MODULES = (
    "argparse.py", "bisect.py", "calendar.py", "dataclasses.py", "difflib.py", "fractions.py",
    "functools.py", "heapq.py", "json/decoder.py", "json/encoder.py", "random.py", "shlex.py",
    "statistics.py", "string.py", "textwrap.py",
)


def load_text(path: str | Path | None = None) -> str:
    """The text of `path`, or without one the default corpus (about 0.5 MB of standard-library source)."""
    if path is not None:
        path = Path(path)
        if not path.is_file():
            raise FileNotFoundError(f"no text file at {path}")
        return path.read_text(encoding="utf-8")
    stdlib = Path(sysconfig.get_paths()["stdlib"])
    parts = [(stdlib / name).read_text(encoding="utf-8") for name in STDLIB_MODULES if (stdlib / name).is_file()]
    if not parts:
        raise FileNotFoundError(f"no standard-library sources found under {stdlib}; pass a text file instead")
    return "\n".join(parts)


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
