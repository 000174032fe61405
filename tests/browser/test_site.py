"""The course website (`gptcourse site`): built once per test session from the repository's notebooks, served by
`python -m http.server` on loopback from a folder above it (so any absolute link would break), and read in Debian's
Chromium. Every expectation is computed from the repository itself (README, lessons/, labs/, solutions/), not from
the code that builds the site. Screenshots of the landing page and a lesson go to artifacts/site/.

The build checks (no browser) and the browser checks share one build, so they live in this one file: pytest-xdist's
--dist loadfile runs them in a single worker.
"""

from __future__ import annotations

import html
import importlib.util
import json
import re
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING
from urllib.parse import urljoin, urlparse

import pytest

from gptcourse import website

if TYPE_CHECKING:
    from playwright.sync_api import Browser, Page, Route

ROOT = Path(__file__).resolve().parents[2]
ARTIFACTS = ROOT / "artifacts" / "site"
BROWSER_ARTIFACTS = ROOT / "artifacts" / "browser"  # where conftest.py's failure report looks for a screenshot
SITE_IN_SERVED_FOLDER = Path("course") / "_site"  # the site is served from two folders below the server's root
LOOPBACK = "127.0.0.1"
NOTEBOOK_NAME = re.compile(r"^\d\d_\w+$")
WIDGET_VIEW = "application/vnd.jupyter.widget-view+json"
FIGURE_MIMETYPES = ("image/png", "image/jpeg", "image/svg+xml")
# Text that MathJax leaves behind when it did not typeset: TeX delimiters and commands in the prose.
RAW_MATH = re.compile(r"\$[^$\s][^$]*\$|\\frac|\\\(|\\\[|\\begin\{|\\mathcal|\\sqrt|\\operatorname")
SEARCHES = [("RoPE", "03_multi_head_attention_and_rope"), ("causal mask", "02_causal_attention")]
# Sphinx extensions' deprecation notices about Sphinx 11 are theirs to fix, not this course's.
pytestmark = pytest.mark.filterwarnings("ignore:.*Check CHANGES for Sphinx API modifications")
GRADER_ONLY = ("BEGIN SOLUTION", "END SOLUTION", "BEGIN HIDDEN TESTS")


def _notebooks(folder: Path, pattern: str) -> list[Path]:
    return sorted(p for p in folder.glob(pattern) if NOTEBOOK_NAME.match(p.stem))


LESSONS = _notebooks(ROOT / "lessons", "*.ipynb")
LABS = [p for p in _notebooks(ROOT / "labs", "*/*.ipynb") if p.stem == p.parent.name]


def _cells(path: Path, cell_type: str) -> list[dict]:
    return [c for c in json.loads(path.read_text())["cells"] if c["cell_type"] == cell_type]


def _text(cell: dict) -> str:
    return "".join(cell["source"]) if isinstance(cell["source"], list) else cell["source"]


def _figures_saved_in(lesson: Path) -> int:
    return sum(any(m in out.get("data", {}) for m in FIGURE_MIMETYPES)
               for cell in _cells(lesson, "code") for out in cell.get("outputs", []))


def _squeezed(text: str) -> str:
    """Text without markdown's code and emphasis marks or any whitespace (HTML tags split words differently)."""
    return re.sub(r"[`*\s]", "", text)


def _page_text(html_text: str) -> str:
    return " ".join(html.unescape(re.sub(r"<[^>]+>", " ", html_text)).split())


def _readme_course_map() -> list[tuple[str, str]]:
    """(lesson number, lab number or '') for each row of the README's course map table."""
    section = ROOT.joinpath("README.md").read_text().split("## Course map", 1)[1].split("\n## ", 1)[0]
    rows = re.findall(r"^\|\s*(\d\d)\s*\|[^|]*\|\s*([^|]*?)\s*\|", section, re.MULTILINE)
    return [(number, lab if re.fullmatch(r"\d\d", lab) else "") for number, lab in rows]


# --- the build, once per session --------------------------------------------------------------------------------


@dataclass
class Built:
    served_root: Path
    site: Path
    warnings: list[str]

    def pages(self) -> list[Path]:
        """The site's pages (the theme's templates in _static/ are not pages)."""
        return sorted(p for p in self.site.rglob("*.html") if "_static" not in p.relative_to(self.site).parts)


@pytest.fixture(scope="session")
def built(tmp_path_factory: pytest.TempPathFactory) -> Built:
    missing = [name for name in website.SITE_PACKAGES if importlib.util.find_spec(name) is None]
    if missing:
        pytest.skip(f"{', '.join(missing)} not installed: {website.INSTALL_HINT}")
    served_root = tmp_path_factory.mktemp("served")
    site = served_root / SITE_IN_SERVED_FOLDER
    result = website.build_site(ROOT, site)
    return Built(served_root, site, result.warnings)


def test_site_builds_without_warnings(built: Built) -> None:
    assert (built.site / "index.html").is_file()
    assert built.warnings == [], "Sphinx warned while building the site:\n" + "\n".join(built.warnings)


def test_every_lesson_and_lab_of_the_readme_has_a_page(built: Built) -> None:
    rows = _readme_course_map()
    assert rows, "the README's course map has no rows"
    landing = (built.site / "index.html").read_text()
    for number, lab in rows:
        lessons = [p for p in LESSONS if p.stem.startswith(number)]
        assert lessons, f"the README lists lesson {number}, but lessons/ has no {number}_*.ipynb"
        assert (built.site / "lessons" / f"{lessons[0].stem}.html").is_file(), f"no page for lesson {number}"
        assert f'href="lessons/{lessons[0].stem}.html"' in landing, f"the course map does not link lesson {number}"
        if lab:
            labs = [p for p in LABS if p.stem.startswith(lab)]
            assert labs, f"the README lists lab {lab}, but labs/ has no {lab}_*/{lab}_*.ipynb"
            assert (built.site / "labs" / f"{labs[0].stem}.html").is_file(), f"no page for lab {lab}"
            assert f'href="labs/{labs[0].stem}.html"' in landing, f"the course map does not link lab {lab}"
    for lesson in LESSONS:  # a lesson the README does not list yet still gets its page
        assert (built.site / "lessons" / f"{lesson.stem}.html").is_file(), f"no page for {lesson.name}"


def test_lab_pages_show_instructions_and_offer_the_student_notebook(built: Built) -> None:
    for lab in LABS:
        page = (built.site / "labs" / f"{lab.stem}.html").read_text()
        shown = _squeezed(_page_text(page))
        for cell in _cells(lab, "markdown"):
            for heading in re.findall(r"^#+\s+(.+)$", _text(cell), re.MULTILINE):
                assert _squeezed(heading) in shown, f"lab page {lab.stem}: heading {heading!r} of the lab is missing"
        links = re.findall(r'href="([^"]*\.ipynb)"', page)
        downloads = [built.site / "labs" / link for link in links if Path(link).name == lab.name]
        assert downloads, f"lab page {lab.stem} has no link to download {lab.name}"
        assert downloads[0].read_bytes() == lab.read_bytes(), f"{lab.stem}: the download is not labs/{lab.name}"


def test_lesson_pages_offer_their_notebook_as_committed(built: Built) -> None:
    for lesson in LESSONS:
        page = (built.site / "lessons" / f"{lesson.stem}.html").read_text()
        links = [link for link in re.findall(r'href="([^"]*\.ipynb)"', page) if Path(link).name == lesson.name]
        assert links, f"lesson page {lesson.stem} has no link to download {lesson.name}"
        download = (built.site / "lessons" / links[0]).resolve()
        assert download.read_bytes() == lesson.read_bytes(), f"{lesson.stem}: the download is not lessons/{lesson.name}"


def test_widgets_fall_back_to_their_saved_summary(built: Built) -> None:
    """A live widget cannot run on a static page: its saved one-line summary is shown, and no widget script (which
    would come from a CDN) is loaded."""
    summaries = {lesson: ["".join(out["data"]["text/plain"]) for cell in _cells(lesson, "code")
                          for out in cell.get("outputs", []) if WIDGET_VIEW in out.get("data", {})]
                 for lesson in LESSONS}
    assert any(summaries.values()), "no lesson has a widget: nothing to check"
    for lesson, texts in summaries.items():
        page = (built.site / "lessons" / f"{lesson.stem}.html").read_text()
        assert "jupyter-widgets" not in page and "require.js" not in page, f"{lesson.stem} loads widget scripts"
        for text in texts:
            assert text in html.unescape(page), f"{lesson.stem}: the widget summary {text!r} is not shown"


def test_site_holds_no_solutions(built: Built) -> None:
    """Neither nbgrader's solution or hidden-test markers nor a solution notebook anywhere in the site."""
    solutions = {p.read_bytes() for p in (ROOT / "solutions").glob("*/*.ipynb")}
    for path in built.site.rglob("*"):
        if path.suffix in (".html", ".ipynb", ".js", ".txt", ".md") and "mathjax" not in path.parts:
            text = path.read_text(errors="replace")
            leaked = [marker for marker in GRADER_ONLY if marker in text]
            assert not leaked, f"{path.relative_to(built.site)} contains {leaked}"
            assert path.suffix != ".ipynb" or path.read_bytes() not in solutions, f"{path} is a solution notebook"


def test_links_and_assets_are_relative_and_local(built: Built) -> None:
    """No page or stylesheet names an absolute path or an off-machine asset (links to other sites are fine)."""
    asset = re.compile(r'<(?:script|img|link|iframe|source)\b[^>]*\b(?:src|href)="(?:https?:)?//', re.IGNORECASE)
    for page in built.pages():
        text = page.read_text()
        assert not re.search(r'\b(?:href|src)="/', text), f"{page.name} has an absolute link"
        assert not asset.search(text), f"{page.name} loads an off-machine asset: {asset.search(text).group(0)}"
    for css in built.site.rglob("*.css"):
        assert not re.search(r"url\(\s*['\"]?(https?:)?//", css.read_text()), f"{css.name} loads an off-machine url"


def test_a_new_lesson_appears_without_editing_the_site(tmp_path: Path) -> None:
    """A lesson and lab numbered 98 that no code knows about: the landing page lists and links them, the sidebar
    includes them, and a README row for them is used."""
    repo = tmp_path / "repo"
    for part in ("lessons", "labs"):
        (repo / part).mkdir(parents=True)
    lesson = {"cells": [{"cell_type": "markdown", "metadata": {}, "source": "# Lesson 98 · Speculation\n\nText."}],
              "metadata": {}, "nbformat": 4, "nbformat_minor": 5}
    (repo / "lessons" / "98_speculation.ipynb").write_text(json.dumps(lesson))
    (repo / "labs" / "98_speculation").mkdir()
    (repo / "labs" / "98_speculation" / "98_speculation.ipynb").write_text(json.dumps(lesson))
    readme = ROOT.joinpath("README.md").read_text()
    readme = readme.replace("\n| 00 |", "\n| 98 | speculative decoding | 98 | a draft model |\n| 00 |", 1)
    (repo / "README.md").write_text(readme)
    source = tmp_path / "source"
    website.stage_sources(repo, source)
    landing = (source / "index.md").read_text()
    assert "| 98 | [speculative decoding](lessons/98_speculation.ipynb) | [98](labs/98_speculation.md) |" in landing
    assert "\nlessons/98_speculation\n" in landing and "\nlabs/98_speculation\n" in landing
    assert (source / "labs" / "98_speculation.md").is_file()


def test_readme_pages_keep_code_comments_out_of_the_headings(built: Built) -> None:
    """The instructor guide's shell comments (`# 1. After editing ...`) stay in their code block."""
    guide = (built.site / "instructor-guide.html").read_text()
    assert "1. After editing" in guide
    assert not re.search(r"<h\d[^>]*>\s*1\. After editing", guide)


def test_readme_images_are_copied_beside_their_page_and_only_the_repos(built: Built, tmp_path: Path) -> None:
    """The instructor guide's screenshot (README: `![...](docs/class_report.png)`) is in the site; an image path
    outside the repo, a URL or a missing file is not copied."""
    assert 'src="_images/class_report.png"' in (built.site / "instructor-guide.html").read_text()
    copied = built.site / "_images" / "class_report.png"
    assert copied.read_bytes() == (ROOT / "docs" / "class_report.png").read_bytes()
    (tmp_path / "repo" / "docs").mkdir(parents=True)
    (tmp_path / "repo" / "docs" / "a.png").write_bytes(b"png")
    (tmp_path / "outside.png").write_bytes(b"png")
    page = "![a](docs/a.png) ![b](../outside.png) ![c](https://example.org/c.png) ![d](docs/missing.png)"
    assert website.page_images(tmp_path / "repo", page) == ["docs/a.png"]


# --- in the browser -----------------------------------------------------------------------------------------


def _free_port() -> int:
    with socket.socket() as s:
        s.bind((LOOPBACK, 0))
        return s.getsockname()[1]


@pytest.fixture(scope="session")
def site_url(built: Built, chromium_path: str) -> Iterator[str]:
    """The site's URL, served as a reader would: `python -m http.server` on loopback."""
    port = _free_port()
    command = [sys.executable, "-m", "http.server", str(port), "--bind", LOOPBACK, "--directory",
               str(built.served_root)]
    server = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    url = f"http://{LOOPBACK}:{port}/{SITE_IN_SERVED_FOLDER.as_posix()}/"
    try:
        deadline = time.monotonic() + 20
        while True:
            try:
                urllib.request.urlopen(url + "index.html", timeout=2).close()
                break
            except (urllib.error.URLError, ConnectionError):
                if time.monotonic() > deadline or server.poll() is not None:
                    raise RuntimeError("python -m http.server did not start serving the site") from None
                time.sleep(0.2)
        yield url
    finally:
        server.terminate()
        server.wait(timeout=10)


@dataclass
class Traffic:
    """What a tab asked for that it should not have: requests off this machine (blocked), failed requests,
    error responses and script errors."""

    off_machine: list[str] = field(default_factory=list)
    failed: list[str] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)

    def clear(self) -> None:
        for found in (self.off_machine, self.failed, self.errors):
            found.clear()

    def problems(self) -> list[str]:
        return ([f"off-machine request: {u}" for u in self.off_machine] + [f"failed: {u}" for u in self.failed]
                + self.errors)


@dataclass
class SiteTab:
    page: Page
    base: str
    traffic: Traffic

    def open(self, path: str) -> None:
        self.page.goto(urljoin(self.base, path), wait_until="load")
        self.settle()

    def follow(self, link: str) -> None:
        """Click a link and wait until the new page has settled."""
        self.page.locator(link).click()
        self.page.wait_for_load_state("load")
        self.settle()

    def settle(self) -> None:
        """Wait until the page has asked for everything (MathJax loads its fonts late): leaving a page earlier
        aborts its last requests, which the traffic record would report as failures."""
        self.page.wait_for_load_state("networkidle")
        self.page.evaluate("() => window.MathJax?.startup?.promise")  # typesetting finished (pages with math)
        self.page.wait_for_load_state("networkidle")


@contextmanager
def _site_tab(browser: Browser, site_url: str, screenshot: Path | None = None) -> Iterator[SiteTab]:
    """A browser tab on the site that blocks and records any request off this machine."""
    context = browser.new_context(viewport={"width": 1440, "height": 900})
    context.set_default_timeout(60_000)  # a loaded 2-core machine can take that long to typeset a lesson
    traffic = Traffic()

    def only_loopback(route: Route) -> None:
        url = urlparse(route.request.url)
        if url.hostname == LOOPBACK or url.scheme in ("data", "blob", "file"):
            route.continue_()
        else:
            traffic.off_machine.append(route.request.url)
            route.abort()

    context.route("**/*", only_loopback)
    page = context.new_page()
    page.on("requestfailed", lambda r: traffic.failed.append(f"{r.url} ({r.failure})")
            if r.url not in traffic.off_machine else None)
    page.on("response", lambda r: traffic.errors.append(f"HTTP {r.status}: {r.url}") if r.status >= 400 else None)
    page.on("pageerror", lambda err: traffic.errors.append(f"script error: {err}"))
    page.on("console", lambda m: traffic.errors.append(f"console error: {m.text}") if m.type == "error" else None)
    try:
        yield SiteTab(page, site_url, traffic)
    finally:
        try:
            if screenshot is not None:
                page.screenshot(path=str(screenshot))
        finally:
            context.close()


@pytest.fixture
def tab(browser: Browser, site_url: str, request: pytest.FixtureRequest) -> Iterator[SiteTab]:
    """A tab for one test; its last state is kept where the browser tests' failure reports point to."""
    with _site_tab(browser, site_url, BROWSER_ARTIFACTS / f"{request.node.name}.png") as tab:
        yield tab


def _relative(built: Built, page: Path) -> str:
    return page.relative_to(built.site).as_posix()


def _site_path(base: str, url: str | None) -> str | None:
    """A link's address as a path in the site (as `visits` names pages), None for no link or one off the site."""
    if url is None or not url.startswith(base):
        return None
    return url.removeprefix(base).split("#")[0]


def _lesson_page(lesson: Path) -> str:
    return f"lessons/{lesson.stem}.html"


@dataclass(frozen=True)
class Visit:
    """What one page showed: the problems of its traffic, its typeset formulas, MathJax's errors, TeX source left in
    its prose, the natural widths of its figures, and where its `next` and `previous` links go (None: no link)."""

    page: str
    problems: list[str]
    formulas: int
    tex_errors: int
    raw_math: list[str]
    figure_widths: list[int]
    next: str | None
    previous: str | None


PAGE_FACTS = """async () => {
    const article = document.querySelector('article');
    const link = selector => document.querySelector(selector)?.href ?? null;
    const links = {next: link('a.right-next'), previous: link('a.left-prev')};
    if (!article) return {formulas: 0, texErrors: 0, prose: '', widths: [], ...links};
    const prose = article.cloneNode(true);
    prose.querySelectorAll('pre, code, .highlight, mjx-container, script').forEach(e => e.remove());
    const figures = [...article.querySelectorAll('img')].filter(img => img.getAttribute('src').includes('_images/'));
    return {
        formulas: article.querySelectorAll('mjx-container').length,
        texErrors: article.querySelectorAll('mjx-merror').length,
        prose: prose.innerText,
        widths: await Promise.all(figures.map(img => img.decode().then(() => img.naturalWidth, () => 0))),
        ...links,
    };
}"""


@pytest.fixture(scope="session")
def visits(built: Built, browser: Browser, site_url: str) -> dict[str, Visit]:
    """Every page of the site, opened once in Chromium (a screenshot of the landing page and of lesson 03 kept)."""
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    screenshots = {"index.html": "landing.png",
                   **{_lesson_page(p): "lesson.png" for p in LESSONS if p.stem.startswith("03")}}
    found = {}
    with _site_tab(browser, site_url) as tab:
        site_path = partial(_site_path, tab.base)
        for path in map(partial(_relative, built), built.pages()):
            tab.traffic.clear()
            tab.open(path)
            facts = tab.page.evaluate(PAGE_FACTS)
            found[path] = Visit(path, tab.traffic.problems(), facts["formulas"], facts["texErrors"],
                                RAW_MATH.findall(facts["prose"]), facts["widths"], site_path(facts["next"]),
                                site_path(facts["previous"]))
            if path in screenshots:
                tab.page.screenshot(path=str(ARTIFACTS / screenshots[path]))
                if facts["widths"]:  # and the lesson's first figure
                    tab.page.locator("article img").first.scroll_into_view_if_needed()
                    tab.page.screenshot(path=str(ARTIFACTS / screenshots[path].replace(".png", "-figure.png")))
    return found


@pytest.mark.browser
def test_every_page_loads_with_only_local_requests(visits: dict[str, Visit]) -> None:
    assert len(visits) >= len(LESSONS) + len(LABS) + 3
    problems = {page: visit.problems for page, visit in visits.items() if visit.problems}
    assert problems == {}


@pytest.mark.browser
def test_math_is_typeset_everywhere(visits: dict[str, Visit]) -> None:
    """Lessons with math in their prose show MathJax's output; no page has a TeX error or TeX source in its prose."""
    for visit in visits.values():
        assert visit.tex_errors == 0, f"{visit.page}: MathJax reports {visit.tex_errors} TeX errors"
        assert visit.raw_math == [], f"{visit.page}: TeX source left in the text: {visit.raw_math[:5]}"
    for lesson in LESSONS:
        if any("$" in _text(cell) for cell in _cells(lesson, "markdown")):
            assert visits[_lesson_page(lesson)].formulas > 0, f"{lesson.stem}: no typeset math"


@pytest.mark.browser
def test_every_figure_of_every_lesson_is_shown(visits: dict[str, Visit]) -> None:
    for lesson in LESSONS:
        widths = visits[_lesson_page(lesson)].figure_widths
        assert len(widths) == _figures_saved_in(lesson), f"{lesson.stem}: {len(widths)} figures shown, " \
            f"{_figures_saved_in(lesson)} saved in the notebook"
        assert all(w > 0 for w in widths), f"{lesson.stem}: a figure did not decode (natural widths {widths})"


@pytest.mark.browser
@pytest.mark.parametrize(("query", "lesson"), SEARCHES)
def test_search_finds_the_lesson_that_teaches_it(built: Built, tab: SiteTab, query: str, lesson: str) -> None:
    """Typed into the search box of another page: the lesson is among the first results, and really contains
    the words."""
    tab.open(_lesson_page(LESSONS[0]))
    tab.page.keyboard.press("Control+k")
    search_box = tab.page.locator("#pst-search-dialog input[name=q]")
    search_box.fill(query)
    search_box.press("Enter")
    tab.page.wait_for_url(re.compile(r"search\.html"))
    tab.page.get_by_text("Search finished").wait_for()
    hrefs = tab.page.locator("#search-results a").evaluate_all("links => links.map(a => a.href)")
    pages = list(dict.fromkeys(urlparse(h).path.rsplit("/", 1)[-1] for h in hrefs))
    assert f"{lesson}.html" in pages[:3], f"search for {query!r}: {lesson} is not among the first results {pages}"
    # Sphinx ranks by title and stemmed terms, so a later result may hold only some of the words; the lesson
    # that teaches it holds them all.
    text = _page_text(next(built.site.rglob(f"{lesson}.html")).read_text()).lower()
    missing = [w for w in query.lower().split() if w not in text]
    assert not missing, f"search for {query!r} lists {lesson}, which does not contain {missing}"
    assert tab.traffic.problems() == []


@pytest.mark.browser
def test_next_and_previous_walk_through_the_lessons(visits: dict[str, Visit], tab: SiteTab) -> None:
    """From lesson 00, the `next` links visit every lesson in order; `previous` walks back; the sidebar lists them;
    and clicking `next` goes there."""
    expected = [_lesson_page(p) for p in LESSONS]
    forward = [expected[0]]
    while len(forward) < len(expected) and visits[forward[-1]].next in visits:
        forward.append(visits[forward[-1]].next)
    assert forward == expected
    backward = [expected[-1]]
    while len(backward) < len(expected) and visits[backward[-1]].previous in visits:
        backward.append(visits[backward[-1]].previous)
    assert backward == expected[::-1]
    tab.open("index.html")
    sidebar = tab.page.locator("nav.bd-links a").evaluate_all("links => links.map(a => a.getAttribute('href'))")
    for lesson in expected:
        assert lesson in sidebar, f"the sidebar does not list {lesson}"
    tab.open(expected[0])
    tab.follow("a.right-next")
    assert tab.page.url.removeprefix(tab.base) == expected[1]
    assert tab.traffic.problems() == []


@pytest.mark.browser
def test_landing_page_course_map_links_lessons_and_labs(tab: SiteTab) -> None:
    tab.open("index.html")
    rows = tab.page.locator("article table").first.evaluate("""table => [...table.tBodies[0].rows].map(tr => ({
        number: tr.cells[0].innerText.trim(),
        links: [...tr.querySelectorAll('a')].map(a => a.getAttribute('href'))}))""")
    links = {row["number"]: row["links"] for row in rows}
    for number, lab in _readme_course_map():
        assert number in links, f"the course map has no row for lesson {number}"
        assert [link.split("/")[0] for link in links[number]] == ["lessons", "labs"] if lab else ["lessons"]
    tab.page.locator("article table a[href^='labs/']").first.click()
    tab.page.wait_for_load_state("load")
    assert tab.page.locator("article a.download").count() >= 1, "the lab page has no download link"
    assert tab.traffic.problems() == []


@pytest.mark.browser
def test_pages_open_straight_from_the_folder(built: Built, browser: Browser) -> None:
    """Opened as files (no server): lessons load everything and show their math and figures. (Search works too, but
    Chromium lets a file:// page fetch no other file, so its results come without their summaries.)"""
    with _site_tab(browser, built.site.as_uri() + "/") as tab:
        for path in ["index.html", *map(_lesson_page, LESSONS[:2])]:
            tab.open(path)
            assert tab.traffic.problems() == [], f"{path} from a folder: {tab.traffic.problems()}"
        formulas = tab.page.locator("article mjx-container").count()
        assert formulas > 0 or not any("$" in _text(c) for c in _cells(LESSONS[1], "markdown"))
