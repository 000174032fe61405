"""The `gptcourse` command: `gptcourse check-env` (paste its output in bug reports)."""

from __future__ import annotations

import argparse
import importlib
import platform
import subprocess
import sys
from collections.abc import Callable

MIN_PYTHON = (3, 10)
PACKAGES = ("torch", "jupyterlab", "nbgrader", "ipywidgets", "matplotlib")


def _version_of(module: str) -> tuple[bool, str]:
    try:
        return True, importlib.import_module(module).__version__
    except Exception as err:  # a broken install can raise anything on import
        return False, f"not importable ({type(err).__name__}: {err})"


def _nbgrader_labextension() -> tuple[bool, str]:
    try:
        out = subprocess.run([sys.executable, "-m", "jupyter", "labextension", "list"],
                             capture_output=True, text=True, timeout=60)
    except (OSError, subprocess.TimeoutExpired) as err:
        return False, f"could not run `jupyter labextension list`: {err}"
    lines = [line for line in (out.stdout + out.stderr).splitlines() if "nbgrader" in line]
    if any("enabled" in line and "disabled" not in line for line in lines):
        return True, "enabled"
    return False, "not enabled: run `jupyter labextension enable @jupyter/nbgrader`" if lines else "not installed"


def environment_checks() -> list[tuple[str, bool, str]]:
    """(name, ok, detail) for everything the course needs."""
    checks = [("python", sys.version_info >= MIN_PYTHON,
               f"{platform.python_version()} (need >= {'.'.join(map(str, MIN_PYTHON))})")]
    for name in PACKAGES:
        checks.append((name, *_version_of(name)))
    checks.append(("nbgrader labextension", *_nbgrader_labextension()))
    if checks[1][1]:
        import torch

        detail = f"{torch.get_num_threads()} (cuda available: {torch.cuda.is_available()})"
        checks.append(("torch threads", True, detail))
    return checks


def check_env(_: argparse.Namespace) -> int:
    checks = environment_checks()
    for name, ok, detail in checks:
        print(f"[{'OK' if ok else 'FAIL'}] {name}: {detail}")
    return 0 if all(ok for _, ok, _ in checks) else 1


COMMANDS: dict[str, tuple[str, Callable[[argparse.Namespace], int]]] = {
    "check-env": ("check that everything the course needs is installed", check_env),
}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="gptcourse", description="Build a GPT from scratch: course tools.")
    sub = parser.add_subparsers(dest="command", required=True)
    for name, (help_text, func) in COMMANDS.items():
        sub.add_parser(name, help=help_text).set_defaults(func=func)
    args = parser.parse_args(argv)
    return args.func(args)


if __name__ == "__main__":
    sys.exit(main())
