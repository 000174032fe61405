"""The course as a static website: `gptcourse site` builds `_site/` from the committed notebooks, without running them.

Sphinx with myst-nb reads the lessons as they are saved (prose, code, outputs, figures) and the sphinx-book-theme
gives the sidebar, previous/next links and the search page. Everything is generated from the repository each time:
the landing page's course map comes from the README's table and the notebooks found in `lessons/` (a new lesson
appears without editing anything here), each lab gets a page with the markdown cells of `labs/NN/NN.ipynb` (never
`solutions/`) and a link to download that notebook, and the instructor guide and the seed-defect notes are README
sections. Nothing is fetched at build or view time: MathJax, fonts and scripts are copied into the site, and widget
outputs fall back to the static summary saved with the notebook. Links are relative, so the folder works anywhere
and over `python -m http.server`.

Needs the `site` extra: `pip install -e ".[site]"`.
"""

from __future__ import annotations

import argparse
import copy
import html
import io
import json
import re
import shutil
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

SITE_PACKAGES = ("sphinx", "myst_nb", "sphinx_book_theme")
INSTALL_HINT = 'the website needs the `site` extra: pip install -e ".[site]"'
TITLE = "Build a GPT from scratch"
COURSE_MAP = "Course map"
LANDING_SECTIONS = ("Quick start", "Working through a lab")  # shown after the course map when the README has them
SEED_DEFECTS = "What the seed documents got wrong"
INSTRUCTOR_GUIDE = "Instructor workflow"
NOTEBOOK_NAME = re.compile(r"^(\d\d)_\w+$")
FENCE = re.compile(r"^\s*(```|~~~)")
HEADING = re.compile(r"^(#{1,6})\s+(.*?)\s*#*\s*$")
NBVAL_COMMENT = re.compile(r"\A# NBVAL_\w+[ \t]*\n?")  # nbval's marker on a cell's first line
LAB_LINK = re.compile(r"\]\(\.\./labs/(\w+)/\1\.ipynb\)")  # a lesson's link to its lab notebook -> the lab's page
# The site's icon, so that browsers do not ask the server for a /favicon.ico it does not have.
FAVICON = ('<svg xmlns="http://www.w3.org/2000/svg" viewBox="0 0 32 32"><rect width="32" height="32" rx="6" '
           'fill="#1f5f8b"/><text x="16" y="22" font-size="14" font-family="sans-serif" text-anchor="middle" '
           'fill="#fff">GPT</text></svg>\n')
FENCED_BLOCK = re.compile(r"^[ \t]*(`{3,}|~{3,}).*?^[ \t]*\1[ \t]*$", re.MULTILINE | re.DOTALL)
DISPLAY_MATH = re.compile(r"\$\$(.+?)\$\$", re.DOTALL)
WIDGET_VIEW = "application/vnd.jupyter.widget-view+json"
# What a browser can show without a kernel; other mimetypes (widget models, the grader's payloads) are left out.
STATIC_MIMETYPES = ("text/html", "image/svg+xml", "image/png", "image/jpeg", "text/markdown", "text/latex",
                    "text/plain")


@dataclass(frozen=True)
class CourseRow:
    """One row of the course map: the lesson's number and name, its lab's number (or None), what it builds, how
    long the lesson takes to run top to bottom."""

    number: str
    lesson: str
    lab: str | None
    builds: str
    run_time: str = ""


@dataclass(frozen=True)
class Notebook:
    """A lesson or lab notebook of the repository: its number, file and first heading."""

    number: str
    path: Path
    title: str

    @property
    def name(self) -> str:
        return self.path.stem


# --- reading the README ---------------------------------------------------------------------------------------


def markdown_sections(text: str) -> dict[str, tuple[int, str]]:
    """Every heading of a markdown text -> (its level, its body up to the next heading of the same or a higher
    level). Lines in fenced code blocks are never headings (the README's shell comments start with `#`)."""
    lines = text.splitlines()
    headings: list[tuple[int, int, str]] = []  # (line index, level, title)
    in_fence = False
    for index, line in enumerate(lines):
        if FENCE.match(line):
            in_fence = not in_fence
        elif not in_fence and (match := HEADING.match(line)):
            headings.append((index, len(match.group(1)), match.group(2)))
    sections = {}
    for position, (index, level, title) in enumerate(headings):
        end = next((i for i, lvl, _ in headings[position + 1:] if lvl <= level), len(lines))
        sections[title] = (level, "\n".join(lines[index + 1:end]).strip("\n"))
    return sections


def promote_headings(body: str, by: int) -> str:
    """Raise every heading outside code blocks by `by` levels (a README `###` section becomes a page's `##`)."""
    out, in_fence = [], False
    for line in body.splitlines():
        if FENCE.match(line):
            in_fence = not in_fence
        elif not in_fence and (match := HEADING.match(line)):
            line = "#" * max(1, len(match.group(1)) - by) + " " + match.group(2)
        out.append(line)
    return "\n".join(out)


def _table_cells(line: str) -> list[str]:
    return [cell.strip() for cell in line.strip().strip("|").split("|")]


def course_map(readme: str) -> list[CourseRow]:
    """The README's course map table: | # | lesson | lab | what you build | run time |, one row per lesson."""
    sections = markdown_sections(readme)
    if COURSE_MAP not in sections:
        raise ValueError(f"README.md has no '## {COURSE_MAP}' section: the website's landing page is built from it")
    rows = []
    for line in sections[COURSE_MAP][1].splitlines():
        cells = _table_cells(line) if line.lstrip().startswith("|") else []
        if len(cells) >= 4 and re.fullmatch(r"\d\d", cells[0]):
            lab = cells[2] if re.fullmatch(r"\d\d", cells[2]) else None
            rows.append(CourseRow(number=cells[0], lesson=cells[1], lab=lab, builds=cells[3],
                                  run_time=cells[4] if len(cells) > 4 else ""))
    if not rows:
        raise ValueError(f"README.md's '{COURSE_MAP}' section has no table rows like | 01 | lesson | 01 | what |")
    return rows


def readme_section(readme: str, title: str) -> str:
    """A README section as a page of its own: its heading becomes the page title (`# title`)."""
    sections = markdown_sections(readme)
    if title not in sections:
        raise ValueError(f"README.md has no section headed '{title}': the website has a page made from it")
    level, body = sections[title]
    return f"# {title}\n\n{promote_headings(body, level - 1)}\n"


_MARKDOWN_IMAGE = re.compile(r"!\[[^\]]*\]\(([^)\s]+)\)")  # ![alt](path)
_IMAGE_SUFFIXES = (".png", ".svg", ".jpg", ".jpeg")


def page_images(repo: Path, page: str) -> list[str]:
    """The images a README page shows from the repo (`![alt](docs/x.png)`): relative paths of image files inside
    it, which the site copies beside the page; links elsewhere (http, ..) are left to the page's own check."""
    found = []
    for link in _MARKDOWN_IMAGE.findall(page):
        path = (repo / link).resolve()
        if (link.lower().endswith(_IMAGE_SUFFIXES) and path.is_relative_to(repo.resolve()) and path.is_file()
                and ":" not in link):
            found.append(link)
    return found


def readme_intro(readme: str) -> str:
    """The README's text between its title and its first section."""
    lines = readme.splitlines()
    start = next((i + 1 for i, line in enumerate(lines) if line.startswith("# ")), 0)
    end = next((i for i in range(start, len(lines)) if lines[i].startswith("## ")), len(lines))
    return "\n".join(lines[start:end]).strip()


# --- reading the notebooks ------------------------------------------------------------------------------------


def _first_heading(notebook: dict, fallback: str) -> str:
    for cell in notebook.get("cells", []):
        if cell.get("cell_type") == "markdown":
            for line in _source(cell).splitlines():
                if line.startswith("# "):
                    return line[2:].strip()
    return fallback


def _source(cell: dict) -> str:
    source = cell.get("source", "")
    return "".join(source) if isinstance(source, list) else source


def _read_notebook(path: Path) -> dict:
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except ValueError as err:
        raise ValueError(f"{path} is not a readable notebook (invalid JSON: {err})") from err


def find_lessons(repo: Path) -> list[Notebook]:
    """lessons/NN_topic.ipynb, in order."""
    found = []
    for path in sorted((repo / "lessons").glob("*.ipynb")):
        if match := NOTEBOOK_NAME.match(path.stem):
            found.append(Notebook(match.group(1), path, _first_heading(_read_notebook(path), path.stem)))
    return found


def find_labs(repo: Path) -> list[Notebook]:
    """labs/NN_topic/NN_topic.ipynb (nbgrader's release: the student version), in order."""
    found = []
    for path in sorted((repo / "labs").glob("*/*.ipynb")):
        if path.stem == path.parent.name and (match := NOTEBOOK_NAME.match(path.stem)):
            found.append(Notebook(match.group(1), path, _first_heading(_read_notebook(path), path.stem)))
    return found


# --- what the site shows of a notebook ------------------------------------------------------------------------


def _widget_fallback(output: dict) -> dict:
    """A live widget's output -> a note and the one-line summary saved with it (what a static viewer can show)."""
    summary = "".join(output.get("data", {}).get("text/plain", ""))
    note = '<p class="widget-fallback"><em>An interactive control: it runs when you open this notebook in JupyterLab.'
    if summary:
        note += f" Its saved summary:</em></p>\n<pre>{html.escape(summary)}</pre>"
    else:
        note += "</em></p>"
    return {"output_type": "display_data", "metadata": {}, "data": {"text/html": note}}


def static_outputs(outputs: list[dict]) -> list[dict]:
    """The outputs a browser can show: widget views become their saved summary, data only a kernel or the grader
    reads is dropped (with the output, when nothing else is left in it)."""
    kept = []
    for output in outputs:
        if output.get("output_type") not in ("display_data", "execute_result"):
            kept.append(output)
        elif WIDGET_VIEW in output.get("data", {}):
            kept.append(_widget_fallback(output))
        else:
            data = {k: v for k, v in output.get("data", {}).items() if k in STATIC_MIMETYPES and "".join(v).strip()}
            if data:
                kept.append({**output, "data": data})
    return kept


def math_on_one_line(markdown: str) -> str:
    """Each `$$...$$` outside code blocks on one line. Jupyter finds math before it parses markdown, so a notebook
    may break a display formula across the lines of a paragraph, even before a line starting with `+`; MyST parses
    the markdown first, and would read that `+` as a list item."""
    out, start = [], 0
    for block in FENCED_BLOCK.finditer(markdown):
        out += [_join_display_math(markdown[start:block.start()]), block.group(0)]
        start = block.end()
    return "".join([*out, _join_display_math(markdown[start:])])


def _join_display_math(text: str) -> str:
    return DISPLAY_MATH.sub(lambda m: "$$" + " ".join(m.group(1).splitlines()) + "$$", text)


def lesson_for_site(notebook: dict) -> dict:
    """A copy of a lesson as the site shows it: nbval's markers out of the code, static outputs, links to labs
    pointing to the lab's page (which offers the notebook for download)."""
    page = copy.deepcopy(notebook)
    page.get("metadata", {}).pop("widgets", None)  # saved widget state would make myst-nb load widget scripts
    for cell in page.get("cells", []):
        if cell.get("cell_type") == "code":
            cell["source"] = NBVAL_COMMENT.sub("", _source(cell))
            cell["outputs"] = static_outputs(cell.get("outputs", []))
        elif cell.get("cell_type") == "markdown":
            cell["source"] = math_on_one_line(LAB_LINK.sub(r"](../labs/\1.md)", _source(cell)))
    return page


def lab_page(lab: Notebook, lesson: Notebook | None) -> str:
    """A lab's page: the instructions (its markdown cells) and a link to download the notebook."""
    notebook = _read_notebook(lab.path)
    cells = [math_on_one_line(_source(c)).strip() for c in notebook.get("cells", []) if c["cell_type"] == "markdown"]
    if not cells:
        cells = [f"# {lab.title}"]
    download = (f"**Get the notebook:** {{download}}`{lab.name}.ipynb <{lab.name}/{lab.name}.ipynb>` "
                f"(the student version, `labs/{lab.name}/{lab.name}.ipynb` in the course folder). Open it in "
                "JupyterLab and fill in the cells marked `# YOUR CODE HERE`; the cells that call `check(...)` "
                "test your code as you go.")
    if lesson is not None:
        download += f" Its lesson: [{lesson.title}](../lessons/{lesson.name}.ipynb)."
    return "\n\n".join([cells[0], download, *cells[1:]]) + "\n"


# --- the landing page -------------------------------------------------------------------------------------------


def _course_map_table(rows: list[CourseRow], lessons: list[Notebook], labs: list[Notebook]) -> str:
    lesson_by_number = {n.number: n for n in lessons}
    lab_by_number = {n.number: n for n in labs}
    listed = {row.number for row in rows}
    rows = rows + [CourseRow(n.number, re.sub(r"^Lesson \d+\W*", "", n.title), n.number if n.number in lab_by_number
                             else None, "") for n in lessons if n.number not in listed]
    table = ["| # | lesson | lab | what you build | run time |", "|---|---|---|---|---|"]
    for row in sorted(rows, key=lambda r: r.number):
        lesson = lesson_by_number.get(row.number)
        lab = lab_by_number.get(row.lab) if row.lab else None
        lesson_cell = f"[{row.lesson}](lessons/{lesson.name}.ipynb)" if lesson else row.lesson
        lab_cell = f"[{lab.number}](labs/{lab.name}.md)" if lab else (row.lab or "—")
        table.append(f"| {row.number} | {lesson_cell} | {lab_cell} | {row.builds} | {row.run_time} |")
    return "\n".join(table)


def _toctree(caption: str, entries: list[str]) -> str:
    lines = "\n".join(entries)
    return f"```{{toctree}}\n:hidden:\n:caption: {caption}\n\n{lines}\n```"


def landing_page(readme: str, lessons: list[Notebook], labs: list[Notebook]) -> str:
    sections = markdown_sections(readme)
    parts = [f"# {TITLE}", readme_intro(readme), f"## {COURSE_MAP}",
             _course_map_table(course_map(readme), lessons, labs),
             "Each lesson page shows the notebook as it is saved in the repository, outputs and figures included; "
             "each lab page shows the lab's instructions and offers its notebook for download.",
             "For instructors: [the instructor guide](instructor-guide.md) (grading with nbgrader) and "
             "[what the seed documents got wrong](seed-defects.md)."]
    for title in LANDING_SECTIONS:
        if title in sections:
            level, body = sections[title]
            parts += [f"## {title}", promote_headings(body, level - 2)]
    parts += [_toctree("Lessons", [f"lessons/{n.name}" for n in lessons]),
              _toctree("Labs", [f"labs/{n.name}" for n in labs]),
              _toctree("For instructors", ["instructor-guide", "seed-defects"])]
    return "\n\n".join(parts) + "\n"


# --- building ---------------------------------------------------------------------------------------------------


def stage_sources(repo: Path, source: Path) -> list[Notebook]:
    """Write the site's source folder: landing page, lessons (as the site shows them), lab pages and notebooks,
    README pages. Returns the lessons."""
    readme = (repo / "README.md").read_text(encoding="utf-8")
    lessons, labs = find_lessons(repo), find_labs(repo)
    if not lessons:
        raise ValueError(f"no lessons/NN_topic.ipynb under {repo}: run from the course's root folder or pass --repo")
    (source / "lessons").mkdir(parents=True)
    (source / "labs").mkdir()
    for lesson in lessons:
        page = lesson_for_site(_read_notebook(lesson.path))
        (source / "lessons" / lesson.path.name).write_text(json.dumps(page, indent=1), encoding="utf-8")
    lesson_by_number = {n.number: n for n in lessons}
    for lab in labs:
        (source / "labs" / lab.name).mkdir()
        shutil.copyfile(lab.path, source / "labs" / lab.name / lab.path.name)
        (source / "labs" / f"{lab.name}.md").write_text(lab_page(lab, lesson_by_number.get(lab.number)), "utf-8")
    (source / "favicon.svg").write_text(FAVICON, encoding="utf-8")
    (source / "index.md").write_text(landing_page(readme, lessons, labs), encoding="utf-8")
    for name, title in (("instructor-guide", INSTRUCTOR_GUIDE), ("seed-defects", SEED_DEFECTS)):
        page = readme_section(readme, title)
        (source / f"{name}.md").write_text(page, encoding="utf-8")
        for image in page_images(repo, page):
            (source / image).parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(repo / image, source / image)
    return lessons


def sphinx_config() -> dict[str, object]:
    """Sphinx settings (no conf.py: the whole configuration is here)."""
    return {
        "project": TITLE,
        "html_title": TITLE,
        "extensions": ["myst_nb", "sphinx.ext.mathjax", "sphinx-mathjax-offline"],
        "exclude_patterns": ["labs/*/*.ipynb"],  # the lab notebooks are downloads, their pages are labs/NN.md
        "nb_execution_mode": "off",
        "nb_merge_streams": True,
        "nb_ipywidgets_js": {},  # no widget scripts from a CDN: widgets show their saved static output
        "myst_enable_extensions": ["dollarmath", "amsmath"],
        "myst_dmath_double_inline": True,  # `$$...$$` inside a paragraph is display math, as in Jupyter
        "myst_heading_anchors": 3,
        "smartquotes": False,  # a page shows the notebook's text as written: `layer's`, not `layer’s`
        "html_theme": "sphinx_book_theme",
        "html_theme_options": {
            "use_download_button": True,  # a lesson page offers its notebook (.ipynb) for download
            "use_repository_button": False,
            "use_fullscreen_button": False,
            "launch_buttons": {},
            "show_toc_level": 2,
            "navigation_with_keys": False,
        },
        "html_context": {"default_mode": "auto"},  # light or dark as the reader's system is set
        "html_favicon": "favicon.svg",
        "html_show_sourcelink": False,
        "html_last_updated_fmt": None,
        "html_permalinks_icon": "#",
    }


@dataclass(frozen=True)
class BuiltSite:
    """Where the website went, and the warnings Sphinx gave (a broken link, a notebook it could not read...)."""

    index: Path
    warnings: list[str]


def build_site(repo: Path, out: Path, verbose: bool = False) -> BuiltSite:
    """Build the website of the course at `repo` into `out` (replaced)."""
    try:
        from sphinx.application import Sphinx
    except ImportError as err:
        raise RuntimeError(INSTALL_HINT) from err
    repo, out = repo.resolve(), out.resolve()
    warnings = io.StringIO()
    with tempfile.TemporaryDirectory(prefix="gptcourse-site-") as work:
        source = Path(work) / "source"
        lessons = stage_sources(repo, source)
        html_dir = Path(work) / "html"
        app = Sphinx(str(source), None, str(html_dir), str(Path(work) / "doctrees"), "html",
                     confoverrides=sphinx_config(), status=sys.stdout if verbose else None, warning=warnings,
                     freshenv=True)
        app.build()
        if app.statuscode:
            raise RuntimeError(f"Sphinx failed (status {app.statuscode})")
        for lesson in lessons:  # the page's download button offers the notebook exactly as the repository has it
            shutil.copyfile(lesson.path, html_dir / "_sources" / "lessons" / lesson.path.name)
        if out.exists():
            shutil.rmtree(out)
        shutil.copytree(html_dir, out)
    return BuiltSite(out / "index.html", [line for line in warnings.getvalue().splitlines() if line.strip()])


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--repo", default=".", help="the course's root folder (default: the current folder)")
    parser.add_argument("--out", default="_site", help="where the website goes (default: _site; it is replaced)")
    parser.add_argument("--verbose", action="store_true", help="show Sphinx's progress")


def command(args: argparse.Namespace) -> int:
    try:
        site = build_site(Path(args.repo), Path(args.out), verbose=args.verbose)
    except (RuntimeError, ValueError) as err:
        print(f"gptcourse site: {err}")
        return 1
    for line in site.warnings:
        print(f"warning: {line}")
    print(f"website built: {site.index} ({len(site.warnings)} warnings)\n"
          f"browse it: python -m http.server --directory {site.index.parent}, then open http://127.0.0.1:8000")
    return 0
