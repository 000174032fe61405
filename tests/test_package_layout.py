"""The package's names: one thing per name, every public name where `gptcourse.WHERE` says, and a command line
that answers without importing torch."""

import importlib
import pkgutil
import subprocess
import sys
import warnings

import pytest

import gptcourse

MODULES = sorted(m.name for m in pkgutil.walk_packages(gptcourse.__path__, "gptcourse.")
                 if not m.name.endswith("__main__"))


def test_no_module_shares_its_name_with_a_public_name():
    """`gptcourse.generate` must be the function whether or not its module was imported: an import of a module
    sets the attribute of its parent package, so a module named like a public name would replace it."""
    for name in MODULES:
        importlib.import_module(name)
    leaves = {name.rsplit(".", 1)[1] for name in MODULES}
    assert leaves.isdisjoint(gptcourse.__all__), leaves & set(gptcourse.__all__)
    for name in gptcourse.__all__:
        assert not isinstance(getattr(gptcourse, name), type(gptcourse)), f"gptcourse.{name} is a module"


@pytest.mark.parametrize("module", MODULES)
def test_no_module_exports_a_function_of_its_own_name(module):
    leaf = module.rsplit(".", 1)[1]
    assert not callable(getattr(importlib.import_module(module), leaf, None)), f"{module}.{leaf} is callable"


def test_every_public_name_is_defined_where_the_table_says():
    for module, names in gptcourse.WHERE.items():
        for name in names:
            obj = getattr(importlib.import_module(f"gptcourse.{module}"), name)
            assert getattr(gptcourse, name) is obj
            if hasattr(obj, "__module__") and callable(obj):
                assert obj.__module__ == f"gptcourse.{module}", f"{name} is defined in {obj.__module__}"
    with pytest.raises(AttributeError, match="no attribute 'attentionn'"):
        gptcourse.attentionn  # noqa: B018


def _imports_after(*args: str) -> set[str]:
    code = ("import sys\nfrom gptcourse.cli import main\n"
            "try:\n    main(sys.argv[1:])\nexcept SystemExit:\n    pass\nprint(' '.join(sys.modules))")
    out = subprocess.run([sys.executable, "-c", code, *args], capture_output=True, text=True, check=True).stdout
    return set(out.splitlines()[-1].split())


@pytest.mark.parametrize("args", [("--help",), ("progress", "--help"), ("progress", "--labs", "no-such-folder"),
                                  ("autograde", "--help"), ("no-such-command",)])
def test_the_command_line_answers_without_importing_torch(args):
    modules = _imports_after(*args)
    assert "gptcourse.cli" in modules
    assert not {"torch", "nbgrader", "nbclient"} & modules


def test_python_m_gptcourse_training_runs_without_a_runpy_warning():
    result = subprocess.run([sys.executable, "-W", "error::RuntimeWarning", "-m", "gptcourse.training", "--help"],
                            capture_output=True, text=True)
    assert result.returncode == 0, result.stderr
    assert "RuntimeWarning" not in result.stderr and "--steps" in result.stdout


def test_importing_a_module_keeps_the_function():
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        import gptcourse.inference.sampling as sampling
    assert callable(gptcourse.generate) and sampling.generate is gptcourse.generate
    assert callable(sampling.filter_logits)
