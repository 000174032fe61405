"""A CSV cell that a spreadsheet reads as data, not as a formula (`csv_export` says why); apart from nbgrader's
export plugin, so that a tool writing a CSV need not import nbgrader (seconds)."""

from __future__ import annotations

FORMULA_SIGNS = ("=", "+", "-", "@", "\t", "\r", "\n")


def spreadsheet_safe(text: str) -> str:
    """A cell no spreadsheet reads as a formula."""
    return "'" + text if text[:1] in FORMULA_SIGNS else text
