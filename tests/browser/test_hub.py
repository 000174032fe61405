"""A class on JupyterHub, end to end in Chromium: the instructor and three students in their own Unix accounts,
nbgrader's exchange, the formgrader, the gradebook on PostgreSQL, the sandboxed grader (issue 31).

One Hub for the module (`gptcourse hub setup` + `gptcourse hub start`, deploy/jupyterhub/jupyterhub_config.py) on
127.0.0.1, logging in through PAM with the passwords `hub setup` gives the new accounts, as a class does, and a
throwaway PostgreSQL server reachable only over its Unix socket; the accounts, the exchange and the database are made
for the test and removed after it.
Screenshots of each step go to artifacts/hub/ (ignored), with the Hub's log.

Skips (and so fails CI, which sets GPTCOURSE_REQUIRE_ALL=1) only where the machine lacks what it needs: root on
Linux, Chromium and Playwright, configurable-http-proxy, PostgreSQL, JupyterHub, the bubblewrap sandbox. The
students' servers run the test's own packages from an environment under /srv (`students_environment`).
"""

from __future__ import annotations

import csv
import glob
import json
import os
import pwd
import re
import secrets
import shutil
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

import nbformat
import pytest
from lab_driver import LabPage, step
from test_course_in_browser import PWN_JS, ScriptWatch

if TYPE_CHECKING:
    from playwright.sync_api import Browser, Page

    from gptcourse.hub import HubSettings

pytestmark = pytest.mark.browser

ROOT = Path(__file__).resolve().parents[2]
ARTIFACTS = ROOT / "artifacts" / "hub"
LAB = "02_causal_attention"
COURSE = "gptcourse"
SOLUTION_MARKER = re.compile(r"^[ \t]*### (BEGIN|END) SOLUTION[ \t]*(\n|$)", re.MULTILINE)
SCORE = re.compile(r"Score: ([\d.]+) / ([\d.]+)")
ROLES = ("solver", "blank", "hostile")  # the three students, by what they hand in


@dataclass
class Hub:
    """The running Hub and what the test made for it."""

    url: str
    passwords: dict[str, str]  # account -> the password `hub setup` set (PAM checks it)
    settings: HubSettings
    folder: Path  # everything the test made under /srv (removed afterwards)
    pg_socket: str
    pg_port: int
    database: str
    psql: str
    students: dict[str, str]  # role -> Unix account
    state: dict[str, object] = field(default_factory=dict)  # what one step leaves for the next

    @property
    def instructor(self) -> str:
        return self.settings.instructor


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _needs() -> dict[str, str]:
    """What the Hub needs from the machine, or a skip that says what is missing and how to get it."""
    if sys.platform != "linux" or os.geteuid() != 0:
        pytest.skip("the Hub test creates Unix accounts and runs JupyterHub's LocalProcessSpawner: run it as root "
                    "on Linux (CI does)")
    pytest.importorskip("jupyterhub", reason="JupyterHub: pip install -e '.[dev]' (CI does)")
    pytest.importorskip("psycopg", reason="the PostgreSQL driver: pip install -e '.[dev]'")
    from nbgrader_course import sandbox_problem

    from gptcourse.grading.classroom.throwaway_postgres import postgres_bin

    found = {"proxy": shutil.which("configurable-http-proxy") or "",
             "pg": str(postgres_bin() or "")}
    from gptcourse.hub import mathjax_folder

    found["mathjax"] = mathjax_folder()
    if not found["mathjax"]:
        pytest.skip('MathJax for the formgrader comes with the site extra: pip install -e ".[site]" (CI does)')
    if not found["proxy"]:
        pytest.skip("configurable-http-proxy is not on PATH: `npm install -g configurable-http-proxy` (CI does)")
    if not found["pg"]:
        pytest.skip("PostgreSQL is not installed (initdb not found): `apt-get install postgresql` (CI does)")
    problem = sandbox_problem()
    if problem is not None:
        pytest.skip(f"the grading sandbox cannot start here: {problem}")
    return found


def students_environment(folder: Path) -> str:
    """The class's environment for the test: a virtual environment under /srv made from the test's interpreter
    (`class_interpreter`), that sees the test's installed packages (site-packages, with their .pth files) and Jupyter
    folders, and their console scripts (jupyterhub-singleuser, alembic, ...) pointing at its own interpreter. A real
    class makes one with `gptcourse hub setup --create-env`."""
    from accounts import class_interpreter

    system_python = class_interpreter(folder)
    venv = folder / "venv"
    subprocess.run([system_python, "-m", "venv", "--without-pip", str(venv)], check=True)
    site_packages = [p for p in sys.path if p.endswith("site-packages") and p.startswith(sys.prefix)]
    version = f"python{sys.version_info.major}.{sys.version_info.minor}"
    (venv / "lib" / version / "site-packages" / "gptcourse_test_env.pth").write_text(
        "".join(f"import site; site.addsitedir({p!r})\n" for p in site_packages))
    (venv / "etc").symlink_to(Path(sys.prefix) / "etc")  # Jupyter's config: the server extensions enabled
    (venv / "share").mkdir(exist_ok=True)
    (venv / "share" / "jupyter").symlink_to(Path(sys.prefix) / "share" / "jupyter")  # kernels, lab extensions
    shebang = f"#!{sys.prefix}/bin/python".encode()
    for script in Path(sys.prefix, "bin").iterdir():  # console scripts (jupyterhub-singleuser, alembic, ...)
        text = script.read_bytes() if script.is_file() and not script.is_symlink() else b""
        target = venv / "bin" / script.name
        if text.startswith(shebang) and not target.exists():
            target.write_bytes(f"#!{venv}/bin/python\n".encode() + text.split(b"\n", 1)[1])
            target.chmod(0o755)
    return str(venv)


def _run(*command: str, user: str | None = None, check: bool = True) -> subprocess.CompletedProcess:
    prefix = ["runuser", "-u", user, "--"] if user else []
    proc = subprocess.run([*prefix, *command], capture_output=True, text=True, timeout=300)
    if check and proc.returncode != 0:
        raise AssertionError(f"{' '.join(command)} exited {proc.returncode}:\n{proc.stdout}\n{proc.stderr}")
    return proc


def start_postgres(bindir: Path, folder: Path, instructor: str, database: str) -> int:
    """A throwaway server on a Unix socket only (no TCP): `postgres` and the instructor by peer authentication,
    the instructor only to the gradebook; the socket's folder is open to all, so a student's attempt reaches the
    server and is refused by it."""
    folder.mkdir()
    shutil.chown(folder, "postgres")
    folder.chmod(0o755)
    data, port = folder / "data", _free_port()
    _run(str(bindir / "initdb"), "-D", str(data), "-U", "postgres", "-A", "peer", "--no-sync", user="postgres")
    (data / "pg_hba.conf").write_text(f"local all postgres peer\nlocal {database} {instructor} peer\n")
    _run(str(bindir / "pg_ctl"), "-D", str(data), "-l", str(folder / "server.log"), "-w", "-o",
         f"-c listen_addresses='' -p {port} -k {folder} -c fsync=off", "start", user="postgres")
    return port


def _wait_for_hub(proc: subprocess.Popen, url: str, log: Path, timeout_s: float = 90) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"JupyterHub exited with code {proc.returncode}:\n{log.read_text()[-4000:]}")
        try:
            with urllib.request.urlopen(f"{url}/hub/health", timeout=2) as response:
                if response.status == 200:
                    return
        except (urllib.error.URLError, ConnectionError, TimeoutError):
            time.sleep(0.3)
    raise RuntimeError(f"JupyterHub did not answer within {timeout_s:.0f} s:\n{log.read_text()[-4000:]}")


@pytest.fixture(scope="module")
def hub(chromium_path: str) -> Iterator[Hub]:
    found = _needs()
    from gptcourse import hub as hub_setup

    tag = secrets.token_hex(3)
    instructor = f"gci{tag}"
    students = {role: f"gc{role[:3]}{tag}" for role in ROLES}
    folder = Path(f"/srv/gptcourse-hub-test-{tag}")
    folder.mkdir(mode=0o755)
    database, bindir = f"gradebook_{tag}", Path(found["pg"])
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    for old in ARTIFACTS.glob("*.png"):
        old.unlink()
    pg_folder, hub_proc, pg_port = folder / "pg", None, None
    try:
        pg_port = start_postgres(bindir, pg_folder, instructor, database)
        ports = [_free_port() for _ in range(4)]
        settings = hub_setup.HubSettings(
            course_id=COURSE, instructor=instructor, students=list(students.values()),
            python=students_environment(folder), state=str(folder / "hub"),
            exchange=str(folder / "exchange"), course_dir=f"/home/{instructor}/{COURSE}",
            jupyter_config=str(folder / "hub" / "jupyter-config"),
            gradebook_url=hub_setup.gradebook_url(instructor, database, str(pg_folder), pg_port),
            proxy=found["proxy"], port=ports[0], hub_port=ports[1],
            proxy_api_port=ports[2], mathjax=found["mathjax"], mathjax_port=ports[3],
            jupyter_data=str(folder / "hub" / "jupyter-data"),
        )
        passwords = hub_setup.setup(settings, str(bindir / "psql"), str(pg_folder), pg_port, database)
        argv, env = hub_setup.hub_command(settings.settings_file)
        log = ARTIFACTS / "jupyterhub.log"
        with log.open("w") as log_file:
            hub_proc = subprocess.Popen(argv, env=env, cwd=settings.settings_file.parent, stdout=log_file,
                                        stderr=subprocess.STDOUT)
        url = f"http://127.0.0.1:{settings.port}"
        _wait_for_hub(hub_proc, url, log)
        yield Hub(url=url, passwords=passwords, settings=settings, folder=folder, pg_socket=str(pg_folder),
                  pg_port=pg_port, database=database, psql=str(bindir / "psql"), students=students)
    finally:
        for name in (instructor, *students.values()):  # servers and kernels first: the Hub need not wait on them
            subprocess.run(["pkill", "-KILL", "-u", name], capture_output=True)
        if hub_proc is not None:
            hub_proc.terminate()
            try:
                hub_proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                hub_proc.kill()
        for name in (instructor, *students.values()):
            hub_setup.remove_user(name)
        if pg_port is not None:
            _run(str(bindir / "pg_ctl"), "-D", str(pg_folder / "data"), "-m", "immediate", "stop", user="postgres",
                 check=False)
        shutil.rmtree(folder, ignore_errors=True)


# --- the browser side -----------------------------------------------------------------------------------------


def _shot(page: Page, name: str) -> None:
    page.screenshot(path=str(ARTIFACTS / f"{name}.png"), full_page=True)


def _context_page(browser: Browser) -> Page:
    context = browser.new_context(viewport={"width": 1440, "height": 900})
    context.set_default_timeout(60_000)
    page = context.new_page()
    page.route(re.compile(r"^https?://(?!127\.0\.0\.1[:/])"), lambda route: route.abort())  # offline, as a class
    return page


def log_in(page: Page, hub: Hub, user: str, password: str | None = None) -> None:
    """Hub's login form, with the user's password unless another is given; a right one starts the user's server
    (waited for in `wait_for_lab`)."""
    page.goto(f"{hub.url}/hub/login")
    page.fill("#username_input", user)
    page.fill("#password_input", hub.passwords[user] if password is None else password)
    page.click("#login_submit", no_wait_after=True)


def server_uids(users: list[str]) -> dict[str, set[int]]:
    """The uids (real and effective) of each user's jupyterhub-singleuser process, found in /proc by the
    JUPYTERHUB_USER the Hub gave it."""
    uids: dict[str, set[int]] = {}
    for proc in Path("/proc").iterdir():
        try:
            if b"jupyterhub-singleuser" not in (proc / "cmdline").read_bytes():
                continue
            environ = dict(item.split(b"=", 1) for item in (proc / "environ").read_bytes().split(b"\0") if b"=" in item)
            status = (proc / "status").read_text()
        except OSError:  # not a process, or one that ended meanwhile
            continue
        user = environ.get(b"JUPYTERHUB_USER", b"").decode()
        if user in users:
            real, effective = re.search(r"^Uid:\s+(\d+)\s+(\d+)", status, re.MULTILINE).groups()
            uids.setdefault(user, set()).update({int(real), int(effective)})
    return uids


def wait_for_lab(page: Page, hub: Hub, user: str) -> None:
    """Until the user's JupyterLab shows its menu bar (four servers start at once: minutes on a loaded machine)."""
    page.wait_for_url(re.compile(rf"/user/{user}/lab"), timeout=240_000)
    page.locator(".lm-MenuBar-itemLabel").first.wait_for(timeout=240_000)


def _formgrader_action(page: Page, row_text: str, cell_class: str, timeout_ms: float = 300_000) -> str:
    """Click the link in column `cell_class` of the formgrader's row mentioning `row_text`; return the success
    dialog's text (an error dialog fails the step with its text)."""
    row = page.locator("table tbody tr", has_text=row_text).first
    row.locator(f"td.{cell_class} a").click()
    dialog = page.locator("#success-modal, #error-modal").first
    dialog.wait_for(state="visible", timeout=timeout_ms)
    text = dialog.inner_text()
    kind = dialog.get_attribute("id")
    page.evaluate("() => document.querySelectorAll('.modal, .modal-backdrop').forEach(e => e.remove())")
    if kind != "success-modal":
        raise AssertionError(f"the formgrader's {cell_class} of {row_text} failed:\n{text}")
    return text


def _table_rows(page: Page, rows: int) -> None:
    """Wait until the formgrader's table has loaded (its placeholder row gone) with at least `rows` rows."""
    page.wait_for_function(
        """n => { const body = document.querySelector('table tbody');
                  return !!body && !body.textContent.includes('Loading, please wait') && body.rows.length >= n; }""",
        arg=rows)


def _api(page: Page, user: str, method: str, path: str, body: object = None) -> dict:
    """The student's own Jupyter server's REST API, from their browser session (its cookie and XSRF token)."""
    return page.evaluate(
        """async ([user, method, path, body]) => {
            const xsrf = decodeURIComponent((document.cookie.match(/_xsrf=([^;]+)/) || [])[1] || '');
            const response = await fetch(`/user/${user}/api/${path}`, {method, headers: {'X-XSRFToken': xsrf,
                'Content-Type': 'application/json'}, body: body === null ? undefined : JSON.stringify(body)});
            return {status: response.status, body: await response.text()};
        }""",
        [user, method, path, body],
    )


def open_assignments(page: Page) -> None:
    page.locator('.lm-MenuBar-itemLabel:text-is("Nbgrader")').click()
    page.locator('.lm-Menu-item .lm-Menu-itemLabel:text-is("Assignment List")').click()
    page.locator("#released_assignments_list, #fetched_assignments_list").first.wait_for()


def _assignment_button(page: Page, folder: str, label: str) -> None:
    row = page.locator(f"#{folder} .list_item", has_text=LAB).first
    row.wait_for(timeout=60_000)
    row.locator(f'button:text-is("{label}")').click()


def solved(released: dict) -> dict:
    """The released notebook with every solution cell holding the instructor's solution (markers removed)."""
    source = nbformat.read(ROOT / "solutions" / LAB / f"{LAB}.ipynb", as_version=4)
    answers = {c.metadata.nbgrader.grade_id: SOLUTION_MARKER.sub("", c.source) for c in source.cells
               if c.cell_type == "code" and c.metadata.get("nbgrader", {}).get("solution")}
    notebook = json.loads(json.dumps(released))
    for cell in notebook["cells"]:
        grade_id = cell.get("metadata", {}).get("nbgrader", {}).get("grade_id")
        if cell["cell_type"] == "code" and grade_id in answers:
            cell["source"] = answers[grade_id]
    return notebook


def escape_targets(hub: Hub) -> list[str]:
    """Where the hostile notebook tries to write, from its kernel while it is graded."""
    return [f"{hub.settings.course_dir}/grading/escaped.txt", f"{hub.settings.exchange}/escaped.txt",
            f"/home/{hub.instructor}/escaped.txt", "/tmp/gptcourse-hub-escaped.txt", "../../escaped.txt"]


def hostile(notebook: dict, hub: Hub) -> dict:
    """Solved, plus a cell that writes outside its folder and cells that carry script."""
    writes = ("for target in " + repr(escape_targets(hub)) + ":\n"
              "    try:\n        open(target, 'w').write('escaped')\n        print('wrote', target)\n"
              "    except OSError as error:\n        print('refused', target, type(error).__name__)")
    cells = [nbformat.v4.new_code_cell(writes),
             nbformat.v4.new_code_cell("from IPython.display import HTML, Javascript, display\n"
                                       f"display(HTML({f'<img src=x onerror={PWN_JS!r}>'!r}))\n"
                                       f"display(Javascript({PWN_JS!r}))"),
             nbformat.v4.new_markdown_cell(f"My notes <img src=z onerror={PWN_JS!r}>")]
    result = json.loads(json.dumps(notebook))
    result["cells"] += [json.loads(json.dumps(cell)) for cell in cells]
    return result


def test_a_class_on_jupyterhub(hub: Hub, browser: Browser) -> None:
    """Steps 1-5 of the issue; a failure leaves a screenshot of every person's page (failed-<who>.png)."""
    started = time.monotonic()
    instructor = _context_page(browser)
    students = {role: _context_page(browser) for role in ROLES}
    try:
        class_scenario(hub, instructor, students)
    except BaseException:
        for who, page in {"instructor": instructor, **students}.items():
            for index, tab in enumerate(page.context.pages):
                tab.screenshot(path=str(ARTIFACTS / f"failed-{who}-{index}.png"), full_page=True)
        raise
    hub.state.update(students=students, seconds=time.monotonic() - started)


def class_scenario(hub: Hub, instructor: Page, students: dict[str, Page]) -> None:
    with step("1. PAM refuses a wrong password: the login form again, with its error, and no server"):
        log_in(instructor, hub, hub.instructor, password=hub.passwords[hub.instructor] + "x")
        instructor.locator(".login_error", has_text="Invalid username or password").wait_for()
        assert "/hub/login" in instructor.url and not server_uids([hub.instructor]), instructor.url
        _shot(instructor, "0-wrong-password-refused")
    with step("1. the instructor logs in; the students log in meanwhile (their servers start in parallel)"):
        log_in(instructor, hub, hub.instructor)
        for role, page in students.items():
            log_in(page, hub, hub.students[role])
        wait_for_lab(instructor, hub, hub.instructor)
    formgrader = f"{hub.url}/user/{hub.instructor}/formgrader"
    with step("1. the instructor generates and releases lab 02 from the formgrader"):
        instructor.goto(f"{formgrader}/manage_assignments")
        _table_rows(instructor, 1)
        _formgrader_action(instructor, LAB, "assign")
        _formgrader_action(instructor, LAB, "release")
        instructor.locator("table tbody tr", has_text=LAB).locator("text=released").wait_for()
        _shot(instructor, "1-instructor-released")
    for role, page in students.items():
        user = hub.students[role]
        with step(f"2. {role} ({user}) sees lab 02 in the Assignments tab and fetches it"):
            wait_for_lab(page, hub, user)
            open_assignments(page)
            _assignment_button(page, "released_assignments_list", "Fetch")
            page.locator("#fetched_assignments_list .list_item", has_text=LAB).first.wait_for()
            _shot(page, f"2-{role}-fetched")
    with step("2. each person's server runs as their own Unix user (PAM logged them in)"):
        people = [hub.instructor, *hub.students.values()]
        assert server_uids(people) == {user: {pwd.getpwnam(user).pw_uid} for user in people}
    for role, page in students.items():
        user = hub.students[role]
        path = f"contents/{LAB}/{LAB}.ipynb"
        with step(f"2. {role} writes their answer and submits it from the Assignments tab"):
            released = json.loads(_api(page, user, "GET", path, None)["body"])["content"]
            if role != "blank":
                notebook = solved(released) if role == "solver" else hostile(solved(released), hub)
                answer = _api(page, user, "PUT", path, {"type": "notebook", "format": "json", "content": notebook})
                assert answer["status"] == 200, answer
            _assignment_button(page, "fetched_assignments_list", "Submit")
            page.locator("#submitted_assignments_list .list_item", has_text=LAB).first.wait_for()
            _shot(page, f"2-{role}-submitted")
    with step("3. the instructor collects and autogrades each submission from the formgrader"):
        instructor.goto(f"{formgrader}/manage_assignments")
        _formgrader_action(instructor, LAB, "collect")
        instructor.goto(f"{formgrader}/manage_submissions/{LAB}")
        for user in hub.students.values():
            _formgrader_action(instructor, user, "autograde")
        instructor.reload()
        _table_rows(instructor, len(ROLES))
        _shot(instructor, "3-instructor-autograded")
    with step("3. nothing the hostile notebook wrote left its sandbox"):
        course = Path(hub.settings.course_dir)
        escaped = [t for t in escape_targets(hub) if Path(t).exists() or (course / t).exists()]
        escaped += glob.glob("/escaped.txt")
        assert not escaped, f"the hostile submission wrote {escaped}"
    with step("3. Manual Grading: each submission opens, no student script runs"):
        instructor.goto(f"{formgrader}/gradebook/{LAB}/{LAB}")
        _table_rows(instructor, len(ROLES))
        links = instructor.locator("table tbody tr td a").evaluate_all("as => as.map(a => a.href)")
        submissions = sorted({link for link in links if "/formgrader/submissions/" in link})  # id and name link
        assert len(submissions) == len(ROLES), f"Manual Grading lists {links}"
        for index, link in enumerate(submissions):
            page = instructor.context.new_page()
            watch = ScriptWatch()
            watch.install(page)
            page.goto(link)
            page.locator("text=Grading report").first.wait_for()
            page.locator("mjx-container").first.wait_for()  # MathJax from the Hub: external requests are aborted
            assert "$t+1$" not in page.inner_text("body"), "the lab's math shows as raw TeX in the formgrader"
            watch.assert_no_script_ran(page, f"the formgrader's submission page {link}")
            _shot(page, f"3-manual-grading-{index + 1}")
            page.close()
    with step("3. the instructor releases feedback"):
        instructor.goto(f"{formgrader}/manage_assignments")
        _formgrader_action(instructor, LAB, "generate-feedback")
        _formgrader_action(instructor, LAB, "release-feedback")
        _shot(instructor, "3-instructor-feedback-released")
    expected = {"solver": 15.0, "blank": 0.0, "hostile": 15.0}
    for role, page in students.items():
        user = hub.students[role]
        with step(f"4. {role} fetches feedback in the Assignments tab and sees their score"):
            page.reload()
            page.locator(".lm-MenuBar-itemLabel").first.wait_for()
            open_assignments(page)
            _assignment_button(page, "submitted_assignments_list", "Fetch Feedback")
            page.locator("#submitted_assignments_list a", has_text="view feedback").first.click()
            feedback = glob.glob(f"/home/{user}/{LAB}/feedback/*/{LAB}.html")
            assert len(feedback) == 1, feedback
            relative = Path(feedback[0]).relative_to(f"/home/{user}")
            page.goto(f"{hub.url}/user/{user}/lab/tree/{relative}")
            frame = page.frame_locator(".jp-HTMLViewer iframe, iframe").first
            heading = frame.locator("h4", has_text="Score:").first
            heading.wait_for()
            score, total = map(float, SCORE.search(heading.inner_text()).groups())
            assert (score, total) == (expected[role], 15.0), f"{role} sees {heading.inner_text()!r}"
            body = frame.locator("body").inner_text()
            assert "Grading report" in body, f"{role}'s feedback has no grading report"
            if role == "hostile":
                assert "removed from" in body, "the hostile student's report does not say what was removed"
            page.locator('.jp-Toolbar-item:has-text("Trust HTML") button, button:has-text("Trust HTML")').first.click()
            frame.locator("mjx-container").first.wait_for()  # the math renders, from the Hub's own MathJax
            _shot(page, f"4-{role}-feedback")
    with step("5. the PostgreSQL gradebook holds the three scores; `nbgrader export` writes them"):
        query = ("SELECT s.student_id, SUM(COALESCE(g.manual_score, g.auto_score)) FROM grade g "
                 "JOIN submitted_notebook n ON g.notebook_id = n.id "
                 "JOIN submitted_assignment s ON n.assignment_id = s.id GROUP BY s.student_id")
        rows = _run(hub.psql, "-h", hub.pg_socket, "-p", str(hub.pg_port), "-d", hub.database, "-Atc", query,
                    user="postgres").stdout
        in_db = {line.split("|")[0]: float(line.split("|")[1]) for line in rows.split()}
        assert in_db == {hub.students[r]: s for r, s in expected.items()}, in_db
        course = hub.settings.course_dir
        _run("sh", "-c", f"cd {course} && {hub.settings.python}/bin/python -m nbgrader export", user=hub.instructor)
        with open(f"{course}/grading/grades.csv", newline="") as grades:
            exported = {row["student_id"]: float(row["score"]) for row in csv.DictReader(grades)}
        assert exported == in_db, exported


def probe_code(hub: Hub, other: str) -> str:
    """A cell that tries, as the student who runs it, to reach what is not theirs; it prints one JSON object:
    {attempt: "refused: Error" | "allowed: ..."}."""
    course, exchange = hub.settings.course_dir, f"{hub.settings.exchange}/{COURSE}"
    other_feedback = glob.glob(f"/home/{other}/{LAB}/feedback/*/{LAB}.html")
    attempts = {
        "list the exchange's inbound folder": f"os.listdir({exchange + '/inbound'!r})",
        "find submissions in the inbound folder": f"glob.glob({exchange + '/inbound/*'!r}) or 1 / 0",
        "list the exchange's feedback folder": f"os.listdir({exchange + '/feedback'!r})",
        "read the other student's lab": f"open({f'/home/{other}/{LAB}/{LAB}.ipynb'!r}).read()",
        "read the other student's feedback": f"open({(other_feedback or ['/home/' + other + '/none'])[0]!r}).read()",
        "list the instructor's course": f"os.listdir({course!r})",
        "read the solutions": f"open({f'{course}/solutions/{LAB}/{LAB}.ipynb'!r}).read()",
        "read the hidden tests' secret": f"open({course + '/grading/secret.txt'!r}).read()",
        "list grading/": f"os.listdir({course + '/grading'!r})",
        "connect to the gradebook as the instructor": (
            f"psycopg.connect(host={hub.pg_socket!r}, port={hub.pg_port}, dbname={hub.database!r}, "
            f"user={hub.instructor!r}, connect_timeout=5)"),
        "connect to the gradebook as themselves": (
            f"psycopg.connect(host={hub.pg_socket!r}, port={hub.pg_port}, dbname={hub.database!r}, "
            "connect_timeout=5)"),
    }
    lines = ["import glob, json, os", "import psycopg", "results = {}"]
    for name, action in attempts.items():
        lines += ["try:", f"    results[{name!r}] = 'allowed: ' + repr({action})[:60]",
                  "except Exception as error:", f"    results[{name!r}] = 'refused: ' + type(error).__name__"]
    lines.append("print('PROBE' + json.dumps(results))")
    return "\n".join(lines)


def test_accounts_are_isolated(hub: Hub, browser: Browser) -> None:
    """From a student's own server (a notebook's kernel, run in JupyterLab, as that Unix user): no way into the
    exchange's inbound or feedback listings, another student's lab or feedback, the instructor's course (solutions,
    grading/, the secret) or the gradebook; with the student's cookie, the instructor's server answers 403."""
    if "students" not in hub.state:
        pytest.fail("test_a_class_on_jupyterhub did not finish: there are no submissions to protect")
    pages: dict[str, Page] = hub.state["students"]  # type: ignore[assignment]
    page, user, other = pages["hostile"], hub.students["hostile"], hub.students["solver"]
    with step("the student runs a probe notebook in their own JupyterLab"):
        notebook = nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell(probe_code(hub, other))])
        notebook.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3", "language": "python"}
        saved = _api(page, user, "PUT", "contents/probe.ipynb", {"type": "notebook", "format": "json",
                                                                  "content": json.loads(nbformat.writes(notebook))})
        assert saved["status"] in (200, 201), saved
        page.goto(f"{hub.url}/user/{user}/lab/tree/probe.ipynb")
        tab = LabPage(page, f"{hub.url}/user/{user}", "", ARTIFACTS / "isolation.png")
        tab.cells().first.wait_for(timeout=60_000)
        tab.wait_for_idle_kernel(timeout_ms=60_000)
        tab.run_all_cells(timeout_ms=60_000)
        output = tab.notebook().locator(".jp-OutputArea-output").first.text_content() or ""
        _shot(page, "6-isolation-probe")
    with step("every attempt was refused"):
        results = json.loads(output[output.index("PROBE") + len("PROBE"):])
        allowed = {name: result for name, result in results.items() if not result.startswith("refused")}
        assert len(results) == 11 and not allowed, f"a student reached what is not theirs: {allowed}"
    with step("the student's own server has no formgrader"):
        response = page.request.get(f"{hub.url}/user/{user}/formgrader/api/assignments")
        assert response.status == 404, f"a student's formgrader answered {response.status}"
    with step("the instructor's server refuses the student's session"):
        for path in ("lab", "api/contents", "formgrader/api/assignments"):
            response = page.request.get(f"{hub.url}/user/{hub.instructor}/{path}")
            assert response.status == 403, f"/user/{hub.instructor}/{path} with a student's cookie: {response.status}"
        page.goto(f"{hub.url}/user/{hub.instructor}/formgrader")
        _shot(page, "6-isolation-instructor-server-refused")
