"""Fixtures for the browser tests: a temporary copy of the course, JupyterLab serving it, and Debian's Chromium.

Nothing here writes into the repository except screenshots and the server log under artifacts/browser/ (ignored).
Without Chromium or Playwright the tests skip and say how to enable them.
"""

from __future__ import annotations

import json
import os
import secrets
import shutil
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Generator, Iterator
from pathlib import Path
from typing import TYPE_CHECKING

import pytest
from lab_driver import JupyterServer, LabPage, RequestRecorder

if TYPE_CHECKING:
    from playwright.sync_api import Browser

ROOT = Path(__file__).resolve().parents[2]
ARTIFACTS = ROOT / "artifacts" / "browser"
SERVER_LOG = ARTIFACTS / "jupyter-server.log"
HOW_TO_ENABLE = "enable them with: apt-get install chromium && pip install playwright"
CHROMIUM_ARGS = [
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--no-first-run",
]
# The course copy leaves out what is not course material: version control, tests, tools' outputs, environments, caches.
NOT_COURSE_TOP = {".git", "artifacts", "grading", "build", "tests"}
NOT_COURSE_ANYWHERE = {"__pycache__", ".pytest_cache", ".ruff_cache", ".ipynb_checkpoints"}
# JupyterLab settings for an offline, quiet test session (no news feed, no update check).
LAB_SETTINGS = {
    "@jupyterlab/apputils-extension/notification": {"fetchNews": "false", "checkForUpdates": False},
}


@pytest.fixture(scope="session")
def chromium_path() -> str:
    """Debian's Chromium and the Playwright package, or a skip that says how to get them."""
    path = shutil.which("chromium")
    if path is None:
        pytest.skip(f"browser tests need Chromium, which is not on PATH; {HOW_TO_ENABLE}")
    try:
        import playwright.sync_api  # noqa: F401
    except ImportError:
        pytest.skip(f"browser tests need the playwright package, which is not installed; {HOW_TO_ENABLE}")
    return path


@pytest.fixture(scope="session")
def course_copy(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A throwaway copy of the course (lessons, labs, solutions, nbgrader_config.py, ...) that tests may change."""

    def ignore(folder: str, names: list[str]) -> set[str]:
        skipped = {n for n in names if n in NOT_COURSE_ANYWHERE or n.endswith(".egg-info")}
        if Path(folder) == ROOT:
            skipped |= {n for n in names if n in NOT_COURSE_TOP or n.startswith(".venv")}
        return skipped

    dest = tmp_path_factory.mktemp("browser") / "course"
    shutil.copytree(ROOT, dest, ignore=ignore)
    return dest


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _jupyter_env(home: Path) -> dict[str, str]:
    """Config, data and runtime folders of our own; the environment's share/jupyter (kernels, lab extensions) and
    etc/jupyter (nbgrader's server extensions) stay on Jupyter's search paths, because they come from sys.prefix."""
    env = dict(os.environ)
    for name in ("config", "data", "runtime", "ipython"):
        (home / name).mkdir(parents=True, exist_ok=True)
    env.update(
        JUPYTER_CONFIG_DIR=str(home / "config"),
        JUPYTER_DATA_DIR=str(home / "data"),
        JUPYTER_RUNTIME_DIR=str(home / "runtime"),
        IPYTHONDIR=str(home / "ipython"),
    )
    env.pop("JUPYTER_TOKEN", None)
    env.pop("MPLBACKEND", None)  # let the kernel pick the inline backend a student gets
    for plugin, settings in LAB_SETTINGS.items():
        package, name = plugin.rsplit("/", 1)
        target = home / "config" / "lab" / "user-settings" / package / f"{name}.jupyterlab-settings"
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_text(json.dumps(settings))
    return env


def _log_tail(lines: int = 40) -> str:
    return "\n".join(SERVER_LOG.read_text(errors="replace").splitlines()[-lines:]) if SERVER_LOG.exists() else ""


def _wait_until_serving(proc: subprocess.Popen, base_url: str, token: str, timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    request = urllib.request.Request(f"{base_url}/api/status", headers={"Authorization": f"token {token}"})
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"JupyterLab exited with code {proc.returncode}; its log:\n{_log_tail()}")
        try:
            with urllib.request.urlopen(request, timeout=2) as response:
                if response.status == 200:
                    return
        except (urllib.error.URLError, ConnectionError, TimeoutError):
            time.sleep(0.25)
    raise RuntimeError(f"JupyterLab did not answer within {timeout_s:.0f} s; its log:\n{_log_tail()}")


def _stop(proc: subprocess.Popen, base_url: str, token: str) -> None:
    """Ask the server to shut down (it stops its kernels first); terminate, then kill, only if it does not."""
    request = urllib.request.Request(
        f"{base_url}/api/shutdown", method="POST", headers={"Authorization": f"token {token}"}
    )
    try:
        urllib.request.urlopen(request, timeout=5).close()
    except (urllib.error.URLError, ConnectionError, TimeoutError):
        proc.terminate()
    try:
        proc.wait(timeout=20)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


@pytest.fixture(scope="session")
def jupyter_server(
    chromium_path: str, course_copy: Path, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[JupyterServer]:
    """JupyterLab on 127.0.0.1 with a token, serving the course copy, started from it (nbgrader's Validate button
    and formgrader read nbgrader_config.py from the server's working directory)."""
    env = _jupyter_env(tmp_path_factory.mktemp("jupyter-home"))
    port, token = _free_port(), secrets.token_hex(16)
    base_url = f"http://127.0.0.1:{port}"
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    command = [
        sys.executable, "-m", "jupyterlab", "--no-browser",
        "--ServerApp.ip=127.0.0.1", f"--ServerApp.port={port}", "--ServerApp.port_retries=0",
        f"--IdentityProvider.token={token}", f"--ServerApp.root_dir={course_copy}",
    ]  # fmt: skip
    if hasattr(os, "geteuid") and os.geteuid() == 0:
        command.append("--allow-root")
    with SERVER_LOG.open("w") as log_file:
        proc = subprocess.Popen(command, cwd=course_copy, env=env, stdout=log_file, stderr=subprocess.STDOUT)
    try:
        _wait_until_serving(proc, base_url, token, timeout_s=90)
        yield JupyterServer(base_url=base_url, token=token, root=course_copy, env=env)
    finally:
        _stop(proc, base_url, token)


@pytest.fixture(scope="session")
def request_recorder() -> Iterator[RequestRecorder]:
    recorder = RequestRecorder()
    yield recorder
    recorder.shutdown()
    recorder.server_close()


@pytest.fixture(scope="session")
def browser(chromium_path: str) -> Iterator[Browser]:
    """Headless Chromium from the system (Playwright drives it; it never downloads a browser)."""
    from playwright.sync_api import sync_playwright

    with sync_playwright() as playwright:
        chromium = playwright.chromium.launch(executable_path=chromium_path, headless=True, args=CHROMIUM_ARGS)
        yield chromium
        chromium.close()


@pytest.fixture
def tab(browser: Browser, jupyter_server: JupyterServer, request: pytest.FixtureRequest) -> Iterator[LabPage]:
    """A fresh browser tab on JupyterLab; a screenshot of its last state goes to artifacts/browser/<test>.png."""
    context = browser.new_context(viewport={"width": 1440, "height": 900})
    context.set_default_timeout(30_000)
    page = context.new_page()
    tab = LabPage(page, jupyter_server.base_url, jupyter_server.token, ARTIFACTS / f"{request.node.name}.png")
    try:
        yield tab
    finally:
        try:
            page.screenshot(path=str(tab.screenshot_path))
        finally:
            context.close()


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(
    item: pytest.Item, call: pytest.CallInfo
) -> Generator[None, pytest.TestReport, pytest.TestReport]:
    """A failed scenario's report points to its screenshot and ends with the server log (for CI, where nobody
    can look at the browser)."""
    report = yield
    if report.failed and report.when == "call":
        report.sections.append(("screenshot", str(ARTIFACTS / f"{item.name}.png")))
        report.sections.append(("JupyterLab server log (last 40 lines)", _log_tail()))
    return report
