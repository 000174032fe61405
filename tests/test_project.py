"""The project's own files: one environment in two spellings, a README that CI follows, check-env."""

import re
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from gptcourse import cli

try:
    import tomllib
except ModuleNotFoundError:  # Python 3.10
    import tomli as tomllib

ROOT = Path(__file__).resolve().parents[1]


def _name(spec: str) -> str:
    return re.split(r"[<>=!~ \[]", spec, maxsplit=1)[0].lower()


def test_environment_yml_matches_pyproject():
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    wanted = set(project["dependencies"]) | set(project["optional-dependencies"]["dev"])
    env = yaml.safe_load((ROOT / "environment.yml").read_text())
    pip_section = next(d["pip"] for d in env["dependencies"] if isinstance(d, dict))
    listed = {spec for spec in pip_section if not spec.startswith("-e")}
    assert listed == wanted, f"only in environment.yml: {listed - wanted}; only in pyproject: {wanted - listed}"


def test_torch_pin_satisfies_the_package_range():
    from packaging.requirements import Requirement

    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    torch_range = next(Requirement(d) for d in project["dependencies"] if _name(d) == "torch")
    pins = [line for line in (ROOT / "requirements.txt").read_text().splitlines() if line.startswith("torch==")]
    assert pins and torch_range.specifier.contains(pins[0].split("==")[1])


def test_ci_runs_the_readme_commands():
    readme = (ROOT / "README.md").read_text()
    quick_start = readme.split("## Quick start", 1)[1].split("```bash", 1)[1].split("```", 1)[0]
    commands = [line.split("#")[0].strip() for line in quick_start.strip().splitlines()]
    install, start, test = commands
    assert start == "jupyter lab"
    ci = (ROOT / ".ci" / "run").read_text()
    assert f"python -m {install}" in ci or install in ci
    assert re.search(rf"^\s*{re.escape(test)}\s*$", ci, re.MULTILINE), f"CI does not run {test!r}"


def test_check_env_passes_here():
    result = subprocess.run([sys.executable, "-m", "gptcourse.cli", "check-env"], capture_output=True, text=True)
    assert result.returncode == 0, result.stdout + result.stderr
    names = [line.split("]", 1)[1].split(":")[0].strip() for line in result.stdout.splitlines()]
    dependencies = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["dependencies"]
    required = {re.match(r"[\w.-]+", d).group(0) for d in dependencies}
    assert {"torch", "regex", "nbgrader", "jupyterlab"} <= required
    assert {"python", "nbgrader labextension", "torch threads"} | required <= set(names)
    assert all(line.startswith("[OK]") for line in result.stdout.splitlines())


def test_check_env_fails_loudly(monkeypatch, capsys):
    real = cli.version_of
    monkeypatch.setattr(cli, "version_of", lambda m: (False, "not importable") if m == "nbgrader" else real(m))
    assert cli.main(["check-env"]) == 1
    assert "[FAIL] nbgrader: not importable" in capsys.readouterr().out


def test_cli_needs_a_command():
    with pytest.raises(SystemExit):
        cli.main([])


def test_check_env_notices_a_disabled_nbgrader_extension(tmp_path, monkeypatch):
    import jupyter_core.paths

    labconfig = tmp_path / "labconfig"
    labconfig.mkdir()
    (labconfig / "page_config.json").write_text('{"disabledExtensions": {"@jupyter/nbgrader": true}}')
    real = jupyter_core.paths.jupyter_config_path
    monkeypatch.setattr(jupyter_core.paths, "jupyter_config_path", lambda: [str(tmp_path), *real()])
    ok, detail = cli.nbgrader_labextension()
    assert not ok
    assert "jupyter labextension enable @jupyter/nbgrader" in detail


def test_the_longest_files_named_in_conftest_exist():
    """conftest.py starts these files first; a renamed one would silently lose its place at the front."""
    source = (ROOT / "conftest.py").read_text()
    named = re.findall(r'"((?:tests|lessons)/[\w/]+\.(?:py|ipynb))"', source[source.index("LONGEST_FIRST"):])
    assert len(named) >= 4, named
    missing = [path for path in named if not (ROOT / path).is_file()]
    assert not missing, f"conftest.py's LONGEST_FIRST names files that do not exist: {missing}"
    assert "--no-loadscope-reorder" in tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["pytest"][
        "ini_options"]["addopts"], "without it xdist reorders the files by their number of tests"


def test_ruff_checks_every_python_file_of_the_package():
    """ruff's excludes (the notebook folders) must not hide package code, as "labs" once hid grading/labs/."""
    listed = subprocess.run([sys.executable, "-m", "ruff", "check", "--show-files", "--no-cache", "."], cwd=ROOT,
                            capture_output=True, text=True, timeout=120)
    if listed.returncode != 0 and "No module named ruff" in listed.stderr:
        pytest.skip("ruff is not installed (pip install -e '.[dev]')")
    checked = {Path(line).resolve() for line in listed.stdout.splitlines() if line.endswith(".py")}
    package = set((ROOT / "shared" / "gptcourse").rglob("*.py"))
    assert package - checked == set(), f"ruff skips {sorted(str(p) for p in package - checked)}"
