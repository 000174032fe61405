"""Every lesson and lab is announced where a student looks first: the README's course map and lesson 00's table,
each with a link or a lab number that exists, in order."""

from __future__ import annotations

import re
from pathlib import Path

import nbformat

ROOT = Path(__file__).resolve().parents[1]
LESSONS = sorted(p.stem for p in (ROOT / "lessons").glob("[0-9][0-9]_*.ipynb"))
LABS = sorted(p.name for p in (ROOT / "labs").iterdir() if p.is_dir() and re.match(r"\d\d_", p.name))


def _numbers_in_first_column(markdown: str, header: str) -> list[str]:
    table = markdown.split(header, 1)[1].split("\n\n", 1)[0]
    return [row.split("|")[1].strip() for row in table.splitlines()[2:] if row.startswith("|")]


def test_readme_course_map_lists_every_lesson_and_lab():
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    header = "| # | lesson (`lessons/`) | lab (`labs/`) | what you build | run time |"
    rows = readme.split(header, 1)[1].split("\n\n", 1)[0].splitlines()[2:]
    numbers = [row.split("|")[1].strip() for row in rows]
    assert numbers == [name[:2] for name in LESSONS], f"README course map rows {numbers}, lessons {LESSONS}"
    lab_column = {row.split("|")[1].strip(): row.split("|")[3].strip() for row in rows}
    assert sorted(n for n, lab in lab_column.items() if lab != "—") == [name[:2] for name in LABS]


def test_lesson_00_links_every_later_lesson():
    nb = nbformat.read(ROOT / "lessons" / "00_start_here.ipynb", as_version=4)
    text = "\n".join(c.source for c in nb.cells if c.cell_type == "markdown")
    linked = re.findall(r"\]\((\d\d_[a-z0-9_]+)\.ipynb\)", text)
    assert sorted(set(linked)) == [name for name in LESSONS if not name.startswith("00")], linked


def test_readme_course_map_says_how_long_each_lesson_runs():
    """Every row gives the lesson's run time as `python -m gptcourse.bench_lessons` measures it: alone and, in
    brackets, beside another lesson."""
    from gptcourse.website import course_map

    rows = course_map((ROOT / "README.md").read_text(encoding="utf-8"))
    assert [row.number for row in rows] == [name[:2] for name in LESSONS]
    for row in rows:
        times = re.fullmatch(r"(\d+) s \((\d+) s\)", row.run_time)
        assert times, f"lesson {row.number}: run time {row.run_time!r}, expected 'N s (M s)': alone (beside another)"
