"""The `gptcourse` command: `gptcourse check-env` (paste its output in bug reports), `gptcourse progress`,
`gptcourse autograde LAB` (instructors: nbgrader's autograde of a whole class, fast), `gptcourse similarity LAB`
(instructors: copies found among a lab's submissions, the reference and the public solutions), `gptcourse report
LAB` (instructors: what the class got wrong, from the grader's verdicts).

It answers `--help` and argument errors at once: nothing heavy (torch, nbgrader, jupyter) is imported before the
chosen command runs, and a command's own options are added only when that command is chosen.
"""

from __future__ import annotations

import argparse
import json
import platform
import re
import sys
from collections.abc import Callable
from pathlib import Path

MIN_PYTHON = (3, 10)


def required_packages() -> list[str]:
    """The distributions gptcourse needs at run time, read from its installed metadata (pyproject's list)."""
    import importlib.metadata

    try:
        requirements = importlib.metadata.requires("gptcourse") or []
    except importlib.metadata.PackageNotFoundError:  # run from a checkout that was never installed
        return ["torch"]
    names = [re.match(r"[A-Za-z0-9_.\-]+", r).group(0) for r in requirements if "extra ==" not in r]
    return sorted(names, key=lambda name: (name != "torch", name))  # torch first, the rest alphabetically


def version_of(distribution: str) -> tuple[bool, str]:
    import importlib.metadata

    try:
        return True, importlib.metadata.version(distribution)
    except importlib.metadata.PackageNotFoundError as error:
        return False, f"not installed ({error})"


def _json_files(folder: str, pattern: str) -> list[dict]:
    """Every JSON object in the files matching `pattern` under one Jupyter config folder."""
    found = []
    for path in sorted(Path(folder).glob(pattern)):
        try:
            found.append(json.loads(path.read_text()))
        except (OSError, ValueError):
            continue
    return found


def nbgrader_labextension() -> tuple[bool, str]:
    """Read Jupyter's own config files (fast; `jupyter labextension list` takes seconds to start)."""
    from jupyter_core.paths import jupyter_config_path, jupyter_path

    packages = [Path(p) / "@jupyter" / "nbgrader" / "package.json" for p in jupyter_path("labextensions")]
    installed = next((p for p in packages if p.is_file()), None)
    if installed is None:
        return False, "not installed: `pip install nbgrader` ships it"
    disabled, server_enabled = set(), set()
    for folder in jupyter_config_path():
        for config in _json_files(folder, "labconfig/page_config.json"):
            disabled |= {name for name, off in dict(config.get("disabledExtensions") or {}).items() if off}
        for config in _json_files(folder, "jupyter_server_config.d/*.json"):
            extensions = config.get("ServerApp", {}).get("jpserver_extensions", {})
            server_enabled |= {name for name, on in extensions.items() if on and name.startswith("nbgrader")}
    off = sorted(name for name in disabled if name.startswith("@jupyter/nbgrader"))
    if off:
        return False, f"disabled ({', '.join(off)}): run `jupyter labextension enable @jupyter/nbgrader`"
    if "nbgrader.server_extensions.validate_assignment" not in server_enabled:
        return False, "server extension not enabled: run `jupyter server extension enable --sys-prefix nbgrader`"
    version = json.loads(installed.read_text()).get("version", "?")
    return True, f"enabled ({version}, with {len(server_enabled)} server extensions)"


def environment_checks() -> list[tuple[str, bool, str]]:
    """(name, ok, detail) for everything the course needs."""
    checks = [("python", sys.version_info >= MIN_PYTHON,
               f"{platform.python_version()} (need >= {'.'.join(map(str, MIN_PYTHON))})")]
    for name in required_packages():
        checks.append((name, *version_of(name)))
    checks.append(("nbgrader labextension", *nbgrader_labextension()))
    if any(name == "torch" and ok for name, ok, _ in checks):
        import torch

        detail = f"{torch.get_num_threads()} (cuda available: {torch.cuda.is_available()})"
        checks.append(("torch threads", True, detail))
    return checks


def check_env(_: argparse.Namespace) -> int:
    checks = environment_checks()
    for name, ok, detail in checks:
        print(f"[{'OK' if ok else 'FAIL'}] {name}: {detail}")
    return 0 if all(ok for _, ok, _ in checks) else 1


def _is_visible_test(cell: dict) -> bool:
    """An autograded test cell of a released lab with code in it (hidden-test cells hold only a comment)."""
    meta = cell.get("metadata", {}).get("nbgrader", {})
    code = [line for line in cell.get("source", "").splitlines() if line.strip() and not line.lstrip().startswith("#")]
    return cell.get("cell_type") == "code" and bool(meta.get("grade")) and not meta.get("solution") and bool(code)


def _cell_passed(cell: dict) -> bool:
    """nbgrader's rule: a test cell fails if it shows an error or writes to stderr."""
    return not any(out.get("output_type") == "error"
                   or (out.get("output_type") == "stream" and out.get("name") == "stderr")
                   for out in cell.get("outputs", []))


def lab_progress(notebook: Path, timeout: int = 120) -> tuple[int, list[str]]:
    """Run a lab notebook (in memory: the file is not changed) -> (number of visible tests, ids of failing ones)."""
    from .notebook_run import run_all

    # The kernel's own log (a warning about its local TCP connection, once per lab) would land between the rows.
    nb = run_all(notebook, timeout, allow_errors=True, kernel_options=("--log-level=ERROR",))
    tests = [cell for cell in nb.cells if _is_visible_test(cell)]
    failing = [cell.metadata.nbgrader.get("grade_id", "?") for cell in tests if not _cell_passed(cell)]
    return len(tests), failing


def progress(args: argparse.Namespace) -> int:
    labs_dir = Path(args.labs)
    wanted = tuple(args.lab) or ("",)
    notebooks = sorted(p for p in labs_dir.glob("*/*.ipynb") if p.stem == p.parent.name and p.stem.startswith(wanted))
    if not notebooks:
        print(f"no labs found in {labs_dir.resolve()}: run from the course's root folder, or pass --labs PATH")
        return 2
    width = max(len(p.stem) for p in notebooks)
    print(f"{'lab':<{width}}  visible tests  failing")
    all_pass = True
    for notebook in notebooks:
        tests, failing = lab_progress(notebook)
        all_pass &= not failing
        status = "all pass" if not failing else ", ".join(failing)
        print(f"{notebook.stem:<{width}}  {f'{tests - len(failing)}/{tests}':>13}  {status}", flush=True)
    return 0 if all_pass else 1


def _progress_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("lab", nargs="*", help="only labs whose name starts with this (e.g. 02)")
    parser.add_argument("--labs", default="labs", help="the folder holding NN_topic/NN_topic.ipynb (default: labs)")


def _autograde(args: argparse.Namespace) -> int:
    from .grading.classroom import batch

    return batch.command(args)


def _autograde_arguments(parser: argparse.ArgumentParser) -> None:
    from .grading.classroom import batch

    batch.add_arguments(parser)


def _similarity(args: argparse.Namespace) -> int:
    from .grading.classroom import similarity

    return similarity.command(args)


def _similarity_arguments(parser: argparse.ArgumentParser) -> None:
    from .grading.classroom import similarity

    similarity.add_arguments(parser)


def _report(args: argparse.Namespace) -> int:
    from .grading.classroom import class_report

    return class_report.command(args)


def _report_arguments(parser: argparse.ArgumentParser) -> None:
    from .grading.classroom import class_report

    class_report.add_arguments(parser)


def _site(args: argparse.Namespace) -> int:
    from .website import command  # Sphinx and the `site` extra load only for this command

    return command(args)


def _site_arguments(parser: argparse.ArgumentParser) -> None:
    from .website import add_arguments

    add_arguments(parser)


def _hub(args: argparse.Namespace) -> int:
    from .hub import command  # JupyterHub's pieces load only for this command

    return command(args)


def _hub_arguments(parser: argparse.ArgumentParser) -> None:
    from .hub import add_arguments

    add_arguments(parser)


Command = tuple[str, Callable[[argparse.Namespace], int], Callable[[argparse.ArgumentParser], None] | None]

COMMANDS: dict[str, Command] = {
    "check-env": ("check that everything the course needs is installed", check_env, None),
    "progress": ("run each lab's visible tests and show which pass (exit code 1 if any fails)", progress,
                 _progress_arguments),
    "autograde": ("grade a lab's submissions with nbgrader on all cores: progress bar, resume, summary table",
                  _autograde, _autograde_arguments),
    "similarity": ("compare a lab's submissions with the reference, the public solutions and each other "
                   "(copydetect): HTML report, CSV, table of the closest pairs; no score changes",
                   _similarity, _similarity_arguments),
    "report": ("after grading: what the class got wrong, per lab (score histogram, pass rates per piece and "
               "case, named mistakes ranked, runs that stopped): HTML report, CSV, a page per student",
               _report, _report_arguments),
    "site": ("build the course's static website into _site/ from the committed notebooks (needs the site extra)",
             _site, _site_arguments),
    "hub": ("one class on JupyterHub (as root, on Linux): `hub setup` creates accounts, exchange, course and "
            "gradebook; `hub start` runs it", _hub, _hub_arguments),
}


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    chosen = next((word for word in argv if not word.startswith("-")), None)
    parser = argparse.ArgumentParser(prog="gptcourse", description="Build a GPT from scratch: course tools.")
    sub = parser.add_subparsers(dest="command", required=True)
    for name, (help_text, func, add_arguments) in COMMANDS.items():
        command = sub.add_parser(name, help=help_text, description=help_text)
        if add_arguments is not None and name == chosen:
            add_arguments(command)
        command.set_defaults(func=func)
    args = parser.parse_args(argv)
    return args.func(args)


if __name__ == "__main__":
    sys.exit(main())
