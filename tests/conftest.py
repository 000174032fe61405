"""Shared fixtures: copies of the repo's nbgrader course (see nbgrader_course.py)."""

from __future__ import annotations

from pathlib import Path

import pytest
from nbgrader_course import Course


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", "slow: runs real nbgrader and Jupyter kernels (part of the plain `pytest`)")


@pytest.fixture(scope="session")
def course(tmp_path_factory: pytest.TempPathFactory) -> Course:
    """One course copy per test session (per xdist worker), shared by the lab round trips."""
    return Course(tmp_path_factory.mktemp("course"))


@pytest.fixture
def fresh_course(tmp_path: Path) -> Course:
    return Course(tmp_path / "course")

