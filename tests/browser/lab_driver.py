"""Drive JupyterLab like a person: open a notebook, use the menus, type into a cell, read what is on screen.

JupyterLab's and ipywidgets' selectors live here, so an upgrade that renames a class breaks one file; nbgrader's
(the Validate button, the formgrader) are in the test file, next to the scenarios that use them.
"""

from __future__ import annotations

import http.server
import re
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING
from urllib.parse import quote

if TYPE_CHECKING:  # the module imports without Playwright, so the tests can skip instead of failing to import
    from playwright.sync_api import Locator, Page

NOTEBOOK = ".jp-NotebookPanel:not(.lm-mod-hidden)"
CELL = f"{NOTEBOOK} .jp-Notebook .jp-Cell"
# JupyterLab shows "idle" before a kernel exists (with the kernel name "No Kernel"): ready means both are settled.
KERNEL_READY_JS = """nb => {
    const status = document.querySelector(nb + ' .jp-Notebook-ExecutionIndicator')?.getAttribute('data-status');
    const name = document.querySelector(nb + ' .jp-Toolbar-kernelName')?.textContent.trim();
    return status === 'idle' && !!name && name !== 'No Kernel';
}"""
WIDGET_CONTROL = ".widget-slider, .widget-dropdown, .widget-toggle-buttons, .widget-text, .widget-checkbox"
# JupyterLab renders error outputs and stderr alike; an error is stderr that holds a traceback or "SomeError: ...".
# Read outputs with textContent, not innerText: JupyterLab skips rendering off-screen cells (content-visibility), and
# their innerText is empty.
STDERR_OUTPUT = '.jp-OutputArea-output[data-mime-type="application/vnd.jupyter.stderr"]'
TRACEBACK = re.compile(r"Traceback \(most recent call last\)|^\w*(Error|Exception|Failed)\b", re.MULTILINE)

# Everything a widget cell shows besides its controls: text, HTML, images (their data URLs change with the plot).
OUTPUT_FINGERPRINT_JS = """cell => {
    const parts = [];
    for (const el of cell.querySelectorAll('.jp-OutputArea-output img')) parts.push(el.src);
    for (const el of cell.querySelectorAll('.jp-RenderedText, .jp-RenderedHTMLCommon, .widget-html-content'))
        parts.push(el.textContent);
    return parts.join('\\n');
}"""


@contextmanager
def step(name: str) -> Iterator[None]:
    """Name the step a scenario is on, so a failure reads "step 'run all cells' failed: ..." and not a bare timeout."""
    try:
        yield
    except Exception as exc:
        raise AssertionError(f"step {name!r} failed: {type(exc).__name__}: {exc}") from exc


class RequestRecorder(http.server.ThreadingHTTPServer):
    """A loopback HTTP server that answers every GET with a 1-pixel GIF and records its path: what a page fetched
    from it (a student's CSS that reached an image-taking property would)."""

    GIF = bytes.fromhex("47494638396101000100800000000000ffffff21f90401000000002c00000000010001000002024401003b")

    def __init__(self) -> None:
        recorder = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                recorder.paths.append(self.path)
                self.send_response(200)
                self.send_header("Content-Type", "image/gif")
                self.send_header("Access-Control-Allow-Origin", "*")
                self.end_headers()
                self.wfile.write(recorder.GIF)

            def log_message(self, *args: object) -> None:
                pass

        self.paths: list[str] = []
        super().__init__(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server_address[1]}"
        threading.Thread(target=self.serve_forever, daemon=True).start()


@dataclass(frozen=True)
class JupyterServer:
    """A running JupyterLab: where it listens, its token, the folder it serves (and runs from), its environment."""

    base_url: str
    token: str
    root: Path
    env: dict[str, str]


@dataclass
class LabPage:
    """One browser tab on the JupyterLab server, with the handful of gestures the scenarios need."""

    page: Page
    base_url: str
    token: str
    screenshot_path: Path

    def url(self, path: str) -> str:
        sep = "&" if "?" in path else "?"
        return f"{self.base_url}/{path.lstrip('/')}{sep}token={self.token}"

    def open_lab(self, workspace: str, notebook: str | None = None) -> None:
        """Open JupyterLab in a fresh named workspace (no tabs restored from another scenario)."""
        path = f"lab/workspaces/{workspace}"
        if notebook is not None:
            path += f"/tree/{quote(notebook)}"
        self.page.goto(self.url(path))
        self.page.locator(".lm-MenuBar-itemLabel").first.wait_for(timeout=60_000)

    def open_notebook(self, workspace: str, notebook: str) -> None:
        """Open a notebook and wait until its kernel has started and is idle."""
        self.open_lab(workspace, notebook)
        self.page.locator(CELL).first.wait_for(timeout=60_000)
        self.wait_for_idle_kernel(timeout_ms=60_000)

    def wait_for_idle_kernel(self, timeout_ms: float) -> None:
        self.page.wait_for_function(KERNEL_READY_JS, arg=NOTEBOOK, timeout=timeout_ms)

    def menu(self, top: str, item: str) -> None:
        """Click a menu bar entry, then one of its items (exact labels, as a person reads them), once it is enabled
        (JupyterLab greys out notebook commands until the notebook is the current widget)."""
        self.page.locator(f'.lm-MenuBar-itemLabel:text-is("{top}")').click()
        self.page.locator(f'.lm-Menu-item:not(.lm-mod-disabled) .lm-Menu-itemLabel:text-is("{item}")').click()

    def notebook(self) -> Locator:
        return self.page.locator(NOTEBOOK)

    def cells(self) -> Locator:
        return self.page.locator(CELL)

    def output_images(self) -> Locator:
        return self.page.locator(f"{NOTEBOOK} .jp-OutputArea-output img")

    def run_all_cells(self, timeout_ms: float) -> None:
        """Run > Run All Cells; wait until the run ends (no prompt shows "[*]", the kernel is idle); then every code
        cell must show an execution count and no error (a run stops at the first error, leaving later cells "[ ]")."""
        self.menu("Run", "Run All Cells")
        prompts = self.notebook().locator(".jp-CodeCell .jp-InputPrompt")
        try:
            prompts.filter(has_text=re.compile(r"\[(\*|\d+)\]")).first.wait_for(timeout=30_000)
        except Exception as exc:
            raise AssertionError("no cell started running (no prompt shows [*] or a count)") from exc
        self.page.wait_for_function(
            "sel => ![...document.querySelectorAll(sel)].some(p => p.textContent.includes('[*]'))",
            arg=f"{NOTEBOOK} .jp-CodeCell .jp-InputPrompt",
            timeout=timeout_ms,
        )
        self.wait_for_idle_kernel(timeout_ms)
        self.assert_no_error_output("after Run All Cells")
        not_run = [i for i, prompt in enumerate(prompts.all_text_contents()) if not re.search(r"\[\d+\]", prompt)]
        assert not not_run, f"the run stopped early: code cells {not_run} (counting code cells only) did not run"

    def save(self) -> None:
        """Press the notebook's Save button, then wait until its tab no longer shows unsaved changes."""
        self.notebook().locator('jp-button[data-command="docmanager:save"]').click()
        self.page.locator(".lm-TabBar-tab.jp-mod-current.jp-mod-dirty").wait_for(state="detached")

    def assert_no_error_output(self, when: str) -> None:
        """No error or traceback on screen in the open notebook (stderr without one, e.g. a warning, is fine)."""
        texts = self.notebook().locator(STDERR_OUTPUT).all_text_contents()
        errors = [t for t in texts if TRACEBACK.search(t)]
        assert not errors, f"error output {when}:\n" + "\n---\n".join(errors)

    def set_cell_source(self, index: int, source: str) -> None:
        """Replace the text of cell `index` as a student would: click into it, select all, type."""
        editor = self.cells().nth(index).locator(".cm-content")
        editor.scroll_into_view_if_needed()
        editor.click()
        self.page.keyboard.press("Control+a")
        self.page.keyboard.press("Delete")
        self.page.keyboard.insert_text(source)
        shown = editor.evaluate("e => [...e.querySelectorAll('.cm-line')].map(line => line.textContent).join('\\n')")
        if shown.strip() != source.strip():
            raise AssertionError(f"the editor shows\n{shown}\ninstead of the typed text\n{source}")


def output_fingerprint(cell: Locator) -> str:
    return cell.evaluate(OUTPUT_FINGERPRINT_JS)


def wait_for_new_output(cell: Locator, before: str, timeout_ms: float) -> None:
    """Wait until the cell's output (see OUTPUT_FINGERPRINT_JS) differs from `before`."""
    cell.page.wait_for_function(
        f"([cell, before]) => ({OUTPUT_FINGERPRINT_JS})(cell) !== before",
        arg=[cell.element_handle(), before],
        timeout=timeout_ms,
    )


def nudge_widget(cell: Locator) -> str:
    """Change the first ipywidgets control in a cell's output the way a person would; return what was done."""
    slider = cell.locator(".widget-slider .noUi-handle").first
    if slider.count():
        now, high = (float(slider.get_attribute(a) or 0) for a in ("aria-valuenow", "aria-valuemax"))
        key = "ArrowRight" if now < high else "ArrowLeft"
        slider.scroll_into_view_if_needed()
        slider.focus()
        slider.press(key)
        return f"pressed {key} on a slider at {now:g}"
    dropdown = cell.locator(".widget-dropdown select").first
    if dropdown.count():
        options = dropdown.locator("option").all_inner_texts()
        current = dropdown.evaluate("s => s.options[s.selectedIndex]?.text ?? ''")
        choice = next(o for o in options if o != current)
        dropdown.select_option(label=choice)
        return f"chose {choice!r} instead of {current!r} in a dropdown"
    toggle = cell.locator(".widget-toggle-buttons button:not(.mod-active)").first
    if toggle.count():
        label = toggle.inner_text()
        toggle.click()
        return f"clicked the toggle button {label!r}"
    text = cell.locator(".widget-text input").first
    if text.count():
        before = text.input_value()
        text.click()
        text.press("End")
        text.press("Backspace")
        text.press("Enter")
        return f"deleted the last character of {before!r} in a text box"
    checkbox = cell.locator(".widget-checkbox input").first
    if checkbox.count():
        checkbox.click()
        return "clicked a checkbox"
    raise AssertionError("the cell has no slider, dropdown, toggle buttons, text box or checkbox to change")

