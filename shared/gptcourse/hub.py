"""`gptcourse hub setup` and `gptcourse hub start`: one class on JupyterHub, on one Linux machine, as root.

setup creates what the class needs, each only where missing, and writes the Hub's settings (a JSON file):
- a Unix account per person (home folders 0700), the instructor first; with PAM, a random password each, written
  to <state>/private/passwords.txt (root's) for the instructor to hand out;
- the nbgrader exchange (default /srv/nbgrader/exchange): writable by all as nbgrader documents, plus the sticky
  bit, so nobody removes what another made; the course's folder in it belongs to the instructor, made before any
  student could take the name;
- the instructor's course folder (~instructor/<course>, 0700): nbgrader_config.py, solutions/, labs/, a course
  secret in grading/secret.txt (0600), and a block at the end of nbgrader_config.py for this Hub (the gradebook
  on PostgreSQL, the exchange);
- the gradebook: a PostgreSQL role named after the instructor and a database only that role may connect to, over
  the server's Unix socket with peer authentication (no password exists to leak; a student's account is refused);
- the class's Jupyter config folder (<state>/jupyter-config, readable by all): nbgrader's exchange, course id and
  JupyterHub auth plugin for every server; and <state>/jupyter-config-students, first for students: nbgrader's
  formgrader and authoring tools off.
The Python environment the servers run (--python, a virtual environment under /opt or /srv) must exist and be
readable by every account: setup checks it as `nobody` before it makes anything (`--create-env` makes it with pip,
from --base-python, which `nobody` must be able to run: never a pyenv or conda under /root).

start runs `jupyterhub -f deploy/jupyterhub/jupyterhub_config.py` with those settings.
"""

from __future__ import annotations

import argparse
import json
import os
import pwd
import re
import secrets
import shutil
import signal
import subprocess
import sys
from dataclasses import asdict, dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
HUB_CONFIG = REPO / "deploy" / "jupyterhub" / "jupyterhub_config.py"
COURSE_FILES = ("nbgrader_config.py", "solutions", "labs")
SETTINGS_NAME = "hub.json"
ACCOUNT_NAME = re.compile(r"[a-z_][a-z0-9_-]{0,31}")  # what useradd accepts by default, and safe in SQL and paths
# A student's server: nbgrader's instructor tools off (their server extensions and JupyterLab plugins).
STUDENTS_SERVER_CONFIG = {"ServerApp": {"jpserver_extensions": {"nbgrader.server_extensions.formgrader": False,
                                                                "nbgrader.server_extensions.course_list": False}}}
STUDENTS_LAB_CONFIG = {"disabledExtensions": {"@jupyter/nbgrader:create-assignment": True,
                                              "@jupyter/nbgrader:course-list": True}}
MATHJAX_PREFIX = "/services/mathjax/"
# nbconvert's `mathjax` macro, which the formgrader's and the feedback's templates call with no argument (so that
# HTMLExporter.mathjax_url cannot change it): MathJax 3 from the Hub's own service instead of a CDN, with its
# `safe` extension (as nbgrader's MathJax 2 had "Safe"): a student's \href or \style cannot carry script.
MATHJAX_MACRO = """{%- macro mathjax(url="PREFIXtex-chtml.js") -%}
    <script>
    window.MathJax = {
        loader: {load: ["ui/safe"]},
        tex: {inlineMath: [["$", "$"], ["\\\\(", "\\\\)"]], displayMath: [["$$", "$$"], ["\\\\[", "\\\\]"]],
              processEscapes: true, processEnvironments: true},
        options: {menuOptions: {settings: {assistiveMml: false}}}
    };
    </script>
    <script id="MathJax-script" async src="{{ url }}"></script>
{%- endmacro %}
""".replace("PREFIX", MATHJAX_PREFIX)


@dataclass(frozen=True)
class HubSettings:
    """Everything jupyterhub_config.py reads: who, where, which ports."""

    course_id: str
    instructor: str
    students: list[str]
    python: str  # the class's environment (a sys.prefix): bin/jupyterhub-singleuser, gptcourse, nbgrader
    state: str  # the Hub's folder: private/ (root's) and jupyter-config/ (everyone's)
    exchange: str
    course_dir: str
    jupyter_config: str
    gradebook_url: str
    proxy: str
    ip: str = "127.0.0.1"
    port: int = 8000
    hub_port: int = 8081
    proxy_api_port: int = 8001
    threads: int = 1
    mathjax: str = ""  # a folder holding MathJax 3's tex-chtml.js, served at /services/mathjax/ ('' for none)
    mathjax_port: int = 8002
    jupyter_data: str = ""  # on every server's JUPYTER_PATH: nbconvert's MathJax macro pointing at that service

    @property
    def settings_file(self) -> Path:
        return Path(self.state) / "private" / SETTINGS_NAME


class HubSetupError(SystemExit):
    """What setup could not do, and what to do about it."""


def _run(*command: str, what: str) -> str:
    proc = subprocess.run(command, capture_output=True, text=True)
    if proc.returncode != 0:
        raise HubSetupError(f"{what} failed ({' '.join(command)}):\n{proc.stdout}{proc.stderr}")
    return proc.stdout


def require_root() -> None:
    if sys.platform != "linux" or os.geteuid() != 0:
        raise HubSetupError("gptcourse hub creates Unix accounts and runs JupyterHub's LocalProcessSpawner: run it as "
                            "root on Linux")


def create_user(name: str) -> bool:
    """A Unix account with a private home folder; False if it existed already."""
    try:
        pwd.getpwnam(name)
        return False
    except KeyError:
        _run("useradd", "--create-home", "--shell", "/bin/bash", "--user-group", name, what=f"creating user {name}")
        os.chmod(pwd.getpwnam(name).pw_dir, 0o700)
        return True


def set_password(name: str) -> str:
    password = secrets.token_urlsafe(12)
    proc = subprocess.run(["chpasswd"], input=f"{name}:{password}\n", capture_output=True, text=True)
    if proc.returncode != 0:
        raise HubSetupError(f"setting the password of {name} failed: {proc.stderr}")
    return password


def remove_user(name: str) -> None:
    """The account, its home folder and its processes (the test's clean-up)."""
    subprocess.run(["pkill", "-KILL", "-u", name], capture_output=True)
    subprocess.run(["userdel", "--remove", name], capture_output=True)


def _chown_tree(folder: Path, user: str) -> None:
    entry = pwd.getpwnam(user)
    for path in [folder, *folder.rglob("*")]:
        os.lchown(path, entry.pw_uid, entry.pw_gid)


def create_exchange(root: Path, course_id: str, instructor: str) -> None:
    """nbgrader's exchange: the root writable by everyone (nbgrader checks it) with the sticky bit; the course's
    folder made now, owned by the instructor, 0755 (nbgrader makes inbound/ 2733 and feedback/ 0711 in it)."""
    root.mkdir(parents=True, exist_ok=True)
    os.chmod(root, 0o1777)
    course = root / course_id
    course.mkdir(exist_ok=True)
    entry = pwd.getpwnam(instructor)
    os.chown(course, entry.pw_uid, entry.pw_gid)
    os.chmod(course, 0o755)


def hub_block(settings: HubSettings) -> str:
    """What the instructor's nbgrader_config.py gets at its end for this Hub."""
    return (
        "\n# Added by `gptcourse hub setup`: the gradebook on PostgreSQL, nbgrader's exchange on this machine.\n"
        f"c.CourseDirectory.db_url = {settings.gradebook_url!r}\n"
        f"c.Exchange.root = {settings.exchange!r}\n"
        f"c.CourseDirectory.course_id = {settings.course_id!r}\n"
    )


def install_course(settings: HubSettings, repo: Path = REPO) -> None:
    """The course folder in the instructor's home: copied from the repository once (never overwritten), the
    secret made, the Hub's block appended, everything the instructor's and nobody else's."""
    course = Path(settings.course_dir)
    if not (course / "nbgrader_config.py").exists():
        course.mkdir(parents=True, exist_ok=True)
        for name in COURSE_FILES:
            source = repo / name
            if source.is_dir():
                shutil.copytree(source, course / name, ignore=shutil.ignore_patterns(".ipynb_checkpoints"))
            else:
                shutil.copy(source, course / name)
        (course / "grading").mkdir(exist_ok=True)
        secret = course / "grading" / "secret.txt"
        secret.write_text(secrets.token_hex(32) + "\n")
        os.chmod(secret, 0o600)
        with open(course / "nbgrader_config.py", "a", encoding="utf-8") as config:
            config.write(hub_block(settings))
    _chown_tree(course, settings.instructor)
    os.chmod(course, 0o700)
    # nbgrader in the instructor's server (the formgrader) reads ~/.jupyter and the server's working folder (home):
    # point it at the course's own file.
    jupyter = Path(pwd.getpwnam(settings.instructor).pw_dir) / ".jupyter"
    jupyter.mkdir(exist_ok=True)
    (jupyter / "nbgrader_config.py").write_text(
        "# Written by `gptcourse hub setup`: the course this account teaches.\n"
        f"load_subconfig({str(course / 'nbgrader_config.py')!r})  # noqa: F821\n")
    _chown_tree(jupyter, settings.instructor)


def gradebook_url(instructor: str, database: str, socket_dir: str, port: int) -> str:
    """SQLAlchemy's address of the gradebook: psycopg 3 over the server's Unix socket, as the instructor's role."""
    return f"postgresql+psycopg://{instructor}@/{database}?host={socket_dir}&port={port}"


def run_sql(psql: str, socket_dir: str, port: int, statement: str, db: str = "postgres",
            admin: str = "postgres") -> str:
    """One statement as PostgreSQL's administrator (peer authentication over the server's Unix socket)."""
    return _run("runuser", "-u", admin, "--", psql, "-h", socket_dir, "-p", str(port), "-d", db, "-v",
                "ON_ERROR_STOP=1", "-Atc", statement,
                what="PostgreSQL (is its server running? Debian: `pg_lsclusters` shows it, `service postgresql start` "
                     "starts it)")


def create_gradebook(psql: str, instructor: str, database: str, socket_dir: str, port: int,
                     admin: str = "postgres") -> None:
    """The instructor's role and database (if missing); nobody else may connect to it."""
    def sql(statement: str) -> str:
        return run_sql(psql, socket_dir, port, statement, admin=admin)

    if not sql(f"SELECT 1 FROM pg_roles WHERE rolname = '{instructor}'").strip():
        sql(f'CREATE ROLE "{instructor}" LOGIN')
    if not sql(f"SELECT 1 FROM pg_database WHERE datname = '{database}'").strip():
        sql(f'CREATE DATABASE "{database}" OWNER "{instructor}"')
    sql(f'REVOKE ALL ON DATABASE "{database}" FROM PUBLIC')


def write_jupyter_config(settings: HubSettings) -> None:
    """Every server's nbgrader settings: the exchange, the course, JupyterHub's groups deciding who takes it."""
    folder = Path(settings.jupyter_config)
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "nbgrader_config.py").write_text(
        "# Written by `gptcourse hub setup`: nbgrader on this Hub (every server reads it).\n"
        "c = get_config()  # noqa: F821\n"
        f"c.Exchange.root = {settings.exchange!r}\n"
        f"c.CourseDirectory.course_id = {settings.course_id!r}\n"
        "c.Authenticator.plugin_class = 'nbgrader.auth.JupyterHubAuthPlugin'\n"
    )
    students = Path(students_config(settings))
    (students / "labconfig").mkdir(parents=True, exist_ok=True)
    (students / "jupyter_server_config.json").write_text(json.dumps(STUDENTS_SERVER_CONFIG, indent=1))
    (students / "labconfig" / "page_config.json").write_text(json.dumps(STUDENTS_LAB_CONFIG, indent=1))
    for path in (folder, *folder.rglob("*"), students, *students.rglob("*")):
        os.chmod(path, 0o755 if path.is_dir() else 0o644)


def students_config(settings: HubSettings) -> str:
    """The Jupyter config folder that comes first for students: no formgrader, no assignment authoring."""
    return settings.jupyter_config.rstrip("/") + "-students"


def mathjax_folder() -> str:
    """MathJax 3 as the `site` extra installs it (sphinx-mathjax-offline, which the course website uses too)."""
    import importlib.metadata

    try:
        files = importlib.metadata.files("sphinx-mathjax-offline") or []
    except importlib.metadata.PackageNotFoundError:
        return ""
    found = next((f for f in files if str(f).endswith("static/mathjax/tex-chtml.js")), None)
    return str(Path(str(found.locate())).parent) if found is not None else ""


def write_mathjax_template(settings: HubSettings) -> None:
    """nbconvert's `mathjax` macro, overridden for every server (JUPYTER_PATH comes before the environment's)."""
    folder = Path(settings.jupyter_data) / "nbconvert" / "templates" / "base"
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "mathjax.html.j2").write_text(MATHJAX_MACRO)
    for path in [Path(settings.jupyter_data), *Path(settings.jupyter_data).rglob("*")]:
        os.chmod(path, 0o755 if path.is_dir() else 0o644)


def serve_mathjax(folder: str, port: int) -> None:
    """The `mathjax` Hub service: MathJax's files under /services/mathjax/ on 127.0.0.1 (the Hub's proxy forwards
    the whole path), with CORS allowed, so that a feedback page shown from an opaque origin (Jupyter serves HTML
    files sandboxed) may load MathJax's fonts too. Nothing but that folder is served."""
    import http.server

    class MathJaxFiles(http.server.SimpleHTTPRequestHandler):
        def __init__(self, *args: object, **kwargs: object) -> None:
            super().__init__(*args, directory=folder, **kwargs)  # type: ignore[arg-type]

        def translate_path(self, path: str) -> str:
            if not path.startswith(MATHJAX_PREFIX):
                return os.path.join(folder, "missing")
            return super().translate_path("/" + path[len(MATHJAX_PREFIX):])

        def list_directory(self, path: str) -> None:  # type: ignore[override]
            self.send_error(404)

        def end_headers(self) -> None:
            self.send_header("Access-Control-Allow-Origin", "*")
            self.send_header("Cache-Control", "max-age=3600")
            super().end_headers()

    for stop in (signal.SIGINT, signal.SIGTERM):  # the Hub stops its services with SIGINT, which a Hub started in
        signal.signal(stop, lambda *_: sys.exit(0))  # the background passes on ignored: exit at once, not 20 s later
    http.server.ThreadingHTTPServer(("127.0.0.1", port), MathJaxFiles).serve_forever()


def require_environment(python: str) -> None:
    single_user = Path(python) / "bin" / "jupyterhub-singleuser"
    if not single_user.exists():
        raise HubSetupError(f"{single_user} does not exist: --python must be a virtual environment with jupyterhub "
                            "and the course installed (`gptcourse hub setup --create-env` makes one)")


def check_environment(python: str) -> None:
    """The class's environment runs for an account with no rights of its own (`nobody`), as for every student:
    the interpreter, gptcourse, nbgrader, jupyterhub, torch and the gradebook's driver import."""
    require_environment(python)
    probe = "import gptcourse, nbgrader, jupyterhub, torch, psycopg"
    proc = run_as_nobody(Path(python) / "bin" / "python", probe)
    if proc.returncode != 0:
        raise HubSetupError(f"the environment {python} does not run for other accounts ({probe} as nobody):\n"
                            f"{proc.stderr[-2000:]}\nEvery account must be able to read it and its interpreter: put "
                            "it under /opt or /srv, made from a Python outside /root (`--create-env --base-python "
                            "/usr/bin/python3` after removing it), and make it world-readable")


def run_as_nobody(program: str | Path, code: str) -> subprocess.CompletedProcess:
    """`program -c code` for an account with no rights of its own (`nobody`), from /, its output captured."""
    return subprocess.run(["runuser", "-u", "nobody", "--", str(program), "-c", code], capture_output=True,
                          text=True, cwd="/")


def runs_for_everyone(program: str | Path) -> bool:
    """Whether an account with no rights of its own (`nobody`) can run this Python: not one under /root."""
    return run_as_nobody(program, "import sys").returncode == 0


def base_python() -> str:
    """The interpreter this one was made from (a virtual environment's base), which --create-env builds on."""
    return getattr(sys, "_base_executable", sys.executable)


def create_environment(python: str, base: str, repo: Path = REPO) -> None:
    """A virtual environment with the course (not editable: the repository need not be readable), JupyterHub and
    the gradebook's driver, made from `base`, which every account must be able to run (the environment's
    interpreter is a link to it)."""
    if not runs_for_everyone(base):
        raise HubSetupError(
            f"the students' accounts cannot run {base} (it lies in a folder only root may enter, such as /root's "
            "pyenv or conda), so an environment made from it would not run for them: pass --base-python with a "
            "Python 3.10 or newer installed for every account, e.g. /usr/bin/python3 (Debian: apt-get install "
            "python3-venv)")
    interpreter = Path(python) / "bin" / "python"
    if not interpreter.exists():
        _run(base, "-m", "venv", python, what="creating the environment")
    elif not runs_for_everyone(interpreter):
        raise HubSetupError(f"{python} exists, but the students' accounts cannot run its interpreter "
                            f"({interpreter.resolve()}): remove it (rm -r {python}) and run this again")
    pip = [str(Path(python) / "bin" / "python"), "-m", "pip", "install", "-q"]
    torch = next(line.strip() for line in (repo / "requirements.txt").read_text().splitlines()
                 if line.startswith("torch=="))  # the version the course is tested with
    _run(*pip, torch, what="installing torch")
    _run(*pip, f"{repo}[site,hub]", what="installing the course with MathJax, JupyterHub and PostgreSQL's driver")
    for path in [Path(python), *Path(python).rglob("*")]:
        if not path.is_symlink():
            os.chmod(path, path.stat().st_mode | 0o444 | (0o111 if path.is_dir() else 0))


def environment_mathjax(python: str) -> str:
    """Where the class's environment keeps MathJax 3 (its `site` extra), which the Hub serves to the formgrader."""
    require_environment(python)
    probe = "from gptcourse.hub import mathjax_folder; print(mathjax_folder())"
    proc = subprocess.run([str(Path(python) / "bin" / "python"), "-c", probe], capture_output=True, text=True,
                          cwd="/")
    folder = proc.stdout.strip() if proc.returncode == 0 else ""
    if not folder:
        raise HubSetupError(f"the environment {python} has no MathJax for the formgrader's and the feedback's math "
                            "(the course's `site` extra, sphinx-mathjax-offline): install the course there with "
                            "its site extra (`--create-env` does)")
    return folder


def setup(settings: HubSettings, psql: str, socket_dir: str, pg_port: int, database: str,
          admin: str = "postgres") -> dict[str, str]:
    """Everything the Hub needs; returns the passwords set (those of the accounts it created)."""
    require_root()
    bad = [name for name in (settings.instructor, *settings.students, database) if not ACCOUNT_NAME.fullmatch(name)]
    if bad:
        raise HubSetupError(f"not an account or database name: {bad}; expected lowercase letters, digits, _ or -, "
                            "starting with a letter or _, at most 32 characters")
    from .grading.steps.intake import student_id_problem

    not_ids = [name for name in settings.students if student_id_problem(name)]
    if not_ids:  # a student's account is their nbgrader id: it must pass the grader's allowlist too
        raise HubSetupError(f"not a student id: {not_ids}; a student's account name is their id in the gradebook: "
                            "lowercase letters, digits or -, starting with a letter")
    check_environment(settings.python)
    create_gradebook(psql, settings.instructor, database, socket_dir, pg_port, admin)
    private = Path(settings.state) / "private"
    private.mkdir(parents=True, exist_ok=True)
    os.chmod(private, 0o700)
    os.chmod(settings.state, 0o755)
    passwords = {}
    for name in (settings.instructor, *settings.students):
        if create_user(name):
            passwords[name] = set_password(name)
            with open(private / "passwords.txt", "a", encoding="utf-8") as listing:  # at once: never lost
                os.fchmod(listing.fileno(), 0o600)
                listing.write(f"{name} {passwords[name]}\n")
    create_exchange(Path(settings.exchange), settings.course_id, settings.instructor)
    install_course(settings)
    write_jupyter_config(settings)
    if settings.mathjax:
        write_mathjax_template(settings)
    settings.settings_file.write_text(json.dumps(asdict(settings), indent=1))
    return passwords


def hub_command(settings_file: Path) -> tuple[list[str], dict[str, str]]:
    """The command line and environment that start the Hub."""
    env = {**os.environ, "GPTCOURSE_HUB_SETTINGS": str(settings_file)}
    return [sys.executable, "-m", "jupyterhub", "-f", str(HUB_CONFIG)], env


def _settings_from(args: argparse.Namespace, proxy: str) -> HubSettings:
    state = Path(args.state)
    instructor, course = args.instructor, args.course
    home = Path("/home") / instructor
    try:
        home = Path(pwd.getpwnam(instructor).pw_dir)
    except KeyError:
        pass
    return HubSettings(
        course_id=course, instructor=instructor, students=list(args.students), python=args.python,
        state=str(state), exchange=args.exchange, course_dir=str(home / course),
        jupyter_config=str(state / "jupyter-config"), jupyter_data=str(state / "jupyter-data"),
        mathjax=environment_mathjax(args.python),
        gradebook_url=gradebook_url(instructor, args.database, args.pg_socket, args.pg_port), proxy=proxy,
        ip=args.ip, port=args.port,
    )


def _read_students(value: str) -> list[str]:
    """A comma-separated list, or @FILE with one name a line."""
    names = Path(value[1:]).read_text().split() if value.startswith("@") else value.split(",")
    return [name.strip() for name in names if name.strip()]


def add_arguments(parser: argparse.ArgumentParser) -> None:
    sub = parser.add_subparsers(dest="hub_command", required=True)
    setup_parser = sub.add_parser("setup", help="create the accounts, exchange, course folder and gradebook")
    setup_parser.add_argument("--instructor", required=True, help="the instructor's Unix account")
    setup_parser.add_argument("--students", required=True, type=_read_students,
                              help="comma-separated Unix accounts, or @FILE with one a line")
    setup_parser.add_argument("--course", default="gptcourse", help="nbgrader's course id (default gptcourse)")
    setup_parser.add_argument("--python", default="/opt/gptcourse/venv", help="the class's environment")
    setup_parser.add_argument("--create-env", action="store_true",
                              help="make --python with pip (torch, the course, JupyterHub); missing parts only")
    setup_parser.add_argument("--base-python", default=base_python(),
                              help="the Python --create-env builds on, runnable by every account (default: this "
                                   "one's base interpreter)")
    setup_parser.add_argument("--state", default="/srv/gptcourse-hub", help="the Hub's own folder")
    setup_parser.add_argument("--exchange", default="/srv/nbgrader/exchange", help="nbgrader's exchange root")
    setup_parser.add_argument("--database", default="gradebook", help="the gradebook's PostgreSQL database")
    setup_parser.add_argument("--pg-socket", default="/var/run/postgresql", help="PostgreSQL's socket folder")
    setup_parser.add_argument("--pg-port", type=int, default=5432)
    setup_parser.add_argument("--ip", default="0.0.0.0", help="where the Hub listens (default all addresses)")
    setup_parser.add_argument("--port", type=int, default=8000)
    start_parser = sub.add_parser("start", help="run JupyterHub for the class set up")
    start_parser.add_argument("--state", default="/srv/gptcourse-hub", help="the Hub's own folder")
    mathjax_parser = sub.add_parser("mathjax", help="(the Hub starts it) serve MathJax at /services/mathjax/")
    mathjax_parser.add_argument("folder")
    mathjax_parser.add_argument("--port", type=int, required=True)


def command(args: argparse.Namespace) -> int:
    if args.hub_command == "mathjax":
        serve_mathjax(args.folder, args.port)
        return 0
    require_root()
    if args.hub_command == "setup":
        proxy, psql = shutil.which("configurable-http-proxy"), shutil.which("psql")
        if proxy is None:
            raise HubSetupError("configurable-http-proxy is not on PATH: `npm install -g configurable-http-proxy` "
                                "(or Debian's node-configurable-http-proxy with Debian's nodejs)")
        if psql is None:
            raise HubSetupError("psql is not on PATH: install PostgreSQL (Debian: apt-get install postgresql)")
        run_sql(psql, args.pg_socket, args.pg_port, "SELECT 1")  # the server answers, before anything is made
        if args.create_env:
            create_environment(args.python, args.base_python)
        settings = _settings_from(args, proxy)
        passwords = setup(settings, psql, args.pg_socket, args.pg_port, args.database)
        print(f"set up; settings in {settings.settings_file}")
        if passwords:
            print(f"new accounts' passwords: {Path(settings.state) / 'private' / 'passwords.txt'}")
        return 0
    settings_file = Path(args.state) / "private" / SETTINGS_NAME
    if not settings_file.exists():
        raise HubSetupError(f"{settings_file} does not exist: run `gptcourse hub setup` first")
    argv, env = hub_command(settings_file)
    os.chdir(settings_file.parent)
    os.execve(argv[0], argv, env)
