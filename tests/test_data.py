"""The shipped corpus and the batches drawn from it."""

from __future__ import annotations

import platform
import sysconfig
from pathlib import Path

import pytest
import torch

from gptcourse.text.corpus import CORPUS, STDLIB_MODULES, get_batch, load_text, train_val_split


def test_default_corpus_is_the_shipped_file():
    assert load_text() == CORPUS.read_text(encoding="utf-8")
    assert (CORPUS.parent / "LICENSE-PSF.txt").is_file()


@pytest.mark.skipif(platform.python_version() != "3.11.7", reason="the corpus was cut from Python 3.11.7's sources")
def test_corpus_is_python_3_11_7_standard_library_source():
    stdlib = Path(sysconfig.get_paths()["stdlib"])
    expected = "\n".join((stdlib / name).read_text(encoding="utf-8") for name in STDLIB_MODULES)
    assert load_text() == expected


def test_missing_file_is_named(tmp_path):
    with pytest.raises(FileNotFoundError, match=r"no text file at .*absent\.txt"):
        load_text(tmp_path / "absent.txt")


def test_batches_are_windows_shifted_by_one():
    ids = torch.arange(100)
    train, val = train_val_split(ids, 0.1)
    assert torch.equal(torch.cat([train, val]), ids) and len(val) == 10
    x, y = get_batch(train, 4, 8, torch.Generator().manual_seed(0))
    assert x.shape == y.shape == (4, 8)
    assert torch.equal(y, x + 1)  # ids are positions here, so the next token is the next number
