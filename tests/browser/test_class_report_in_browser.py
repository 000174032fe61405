"""The class report (`gptcourse report LAB`) in Chromium: its figures show, it makes no request and runs no script,
even where student ids and the grader's report lines (which quote a student's text) hold markup and formulas. The
same markup outside the report does fetch and run (the probe can fail)."""

from __future__ import annotations

from pathlib import Path

import pytest
from synthetic_class import LAB, PLANTED, course_with

from gptcourse.grading.classroom import class_report

pytestmark = pytest.mark.browser

SCRIPTED_IDS = ["<img src=x onerror=\"document.title='pwned'\">", "<svg onload=\"document.title='pwned'\">",
                "=HYPERLINK(\"x\")", "<b onmouseover=alert(1)>"]


def hostile_line(url: str) -> str:
    return (f"<img src=\"{url}/line.gif\" onerror=\"document.title='pwned'\"><script>document.title='pwned'</script>"
            f"<link rel=stylesheet href=\"{url}/style.css\">")


def opened(browser, path: Path) -> tuple[str, list[str], list[int], list[str]]:
    """(title, requests other than the page, each image's natural width, dialogs) of `path` opened in Chromium."""
    context = browser.new_context(viewport={"width": 1200, "height": 900})
    page = context.new_page()
    requests, dialogs = [], []
    page.on("request", lambda request: requests.append(request.url))
    page.on("dialog", lambda dialog: (dialogs.append(dialog.message), dialog.dismiss()))
    page.goto(path.as_uri())
    page.wait_for_load_state("load")
    widths = page.eval_on_selector_all("img", "images => images.map(i => i.naturalWidth)")
    title = page.title()
    context.close()
    return title, [url for url in requests if url != path.as_uri() and not url.startswith("data:")], widths, dialogs


def test_report_shows_its_figures_fetches_nothing_runs_no_script(browser, request_recorder, tmp_path):
    planted = PLANTED | {student: {"02.causal_mask.visible": ("wrong", "mask.inverted")} for student in SCRIPTED_IDS}
    root = course_with(tmp_path, planted, stopped={"stopped-1": (hostile_line(request_recorder.url),)})
    request_recorder.paths.clear()
    written = class_report.write_report(root, LAB)
    title, requests, widths, dialogs = opened(browser, written.folder / "index.html")
    assert title == f"class report: {LAB}"
    assert len(widths) == 3 and all(width > 100 for width in widths), widths  # the three figures, decoded
    assert not requests and not dialogs and not request_recorder.paths, (requests, dialogs, request_recorder.paths)
    for page in (written.folder / "students").iterdir():
        title, requests, widths, dialogs = opened(browser, page)
        assert title.startswith(f"{LAB}: ") and not requests and not dialogs, page.name  # the id as text
    assert not request_recorder.paths

    control = tmp_path / "control.html"  # the same text as markup, without the report's escaping and policy
    control.write_text(f"<!DOCTYPE html><html><head><title>control</title></head><body>{SCRIPTED_IDS[0]}"
                       f"{hostile_line(request_recorder.url)}</body></html>")
    title, requests, _, _ = opened(browser, control)
    assert title == "pwned" and requests
    request_recorder.paths.clear()
