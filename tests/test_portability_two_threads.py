"""Every lesson reproduces with two torch threads (see tests/portability.py)."""

import pytest
from portability import check_lessons_reproduce

pytestmark = pytest.mark.slow


def test_lessons_reproduce_with_two_threads() -> None:
    check_lessons_reproduce("two_threads")
