"""A graded kernel of lab NN sees the package without the lab's references (`gptcourse.grading.box.package_view`).

(a) For every lab, ONE kernel in a box started for that lab tries each route to each reference the lab forbids
(resolved here, in the real package, by the forbidden-name table) and to the lab's case references and judges:
import machinery, `sys.modules`, a module's `__dict__`, the installed source (the module's file, every
`gptcourse` on sys.path, `inspect.getsource`) exec'd afresh, a function rebuilt from its code object, and a
by-reference pickle. Each must give a stub that raises "not available" when called, or nothing.
(b) Submissions whose only filled cells reach the reference through those routes earn 0 for those pieces: they
are rows of the WRONG tables of labs 02 and 10 (tests/reference_routes.py), graded in those labs' round trips.
"""

from __future__ import annotations

import json
import types
from pathlib import Path

import pytest
from nbformat.v4 import new_code_cell, new_notebook
from nbgrader_course import ROOT, sandbox_problem

from gptcourse.grading.attention_mistakes import attend_by_hand, kv_heads_by_hand
from gptcourse.grading.box.sandbox import Sandbox
from gptcourse.grading.cases import lab_cases
from gptcourse.grading.forbidden import reference_table
from gptcourse.grading.piece import forbidden_names
from gptcourse.grading.steps.execute import RobustExecute, with_box

pytestmark = [pytest.mark.slow, pytest.mark.skipif(sandbox_problem() is not None,
                                                  reason=f"the sandbox cannot start here: {sandbox_problem()}")]
LAB_FOLDERS = {path.name[:2]: path.name for path in sorted((ROOT / "solutions").iterdir()) if path.is_dir()}

# Run in the graded kernel with TARGETS = [(module, name), ...]; prints {"module.name route": outcome}, where the
# outcome is "stub" (calling it raised the view's error), "absent" (the route found nothing) or what it found.
PROBE = r'''
import ast, importlib, inspect, json, os, pickle, sys, textwrap, types

def outcome(get):
    try:
        obj = get()
    except (AttributeError, ImportError, KeyError, NameError, OSError, TypeError, ValueError):
        return "absent"
    own = [n for n, v in vars(obj).items() if isinstance(v, (types.FunctionType, staticmethod, classmethod,
                                                               property)) and n != "__new__"] \
        if isinstance(obj, type) else []
    if own:
        return f"a class with its methods {own[:3]}"
    copies = [obj]
    if isinstance(obj, types.FunctionType):  # the code object, in a function of its own
        copies.append(types.FunctionType(obj.__code__, obj.__globals__, "copy", obj.__defaults__, obj.__closure__))
    for candidate in copies:
        try:
            candidate()
        except RuntimeError as err:
            if "is not available while lab" not in str(err):
                return f"raised {err!r:.80}"
        except BaseException as err:
            return f"the real one (it raised {type(err).__name__})"
        else:
            return "the real one (it returned)"
    return "stub"

def from_source(source, module, name):
    """The definition of `name` in `source`, exec'd afresh among the module's names."""
    tree = ast.parse(source)
    [node] = [n for n in tree.body if getattr(n, "name", None) == name]
    namespace = dict(vars(importlib.import_module(module)))
    exec(compile(ast.Module([node], []), "<copy>", "exec"), namespace)
    return namespace[name]

def copies_on_sys_path(module):
    relative = module.split(".")[1:]
    for folder in sys.path:
        for path in (os.path.join(folder, "gptcourse", *relative) + ".py",
                     os.path.join(folder, "gptcourse", *relative, "__init__.py")):
            if os.path.isfile(path):
                yield path

found = {}
for module, name in TARGETS:
    key = f"{module}.{name}"
    routes = {
        "import_module": lambda: getattr(importlib.import_module(module), name),
        "__import__": lambda: getattr(__import__(module, fromlist=[name]), name),
        "sys.modules": lambda: getattr(sys.modules[module], name),
        "__dict__": lambda: sys.modules[module].__dict__[name],
        "getsource": lambda: from_source(textwrap.dedent(inspect.getsource(
            getattr(sys.modules[module], name))), module, name),
        "__file__": lambda: from_source(open(sys.modules[module].__file__).read(), module, name),
        "pickle": lambda: pickle.loads(f"c{module}\n{name}\n.".encode()),
    }
    for i, path in enumerate(copies_on_sys_path(module)):
        routes[f"sys.path copy {i}"] = lambda path=path: from_source(open(path).read(), module, name)
    for route, get in routes.items():
        found[f"{key} {route}"] = outcome(get)
print(json.dumps(found))
'''


def targets(lab: str) -> list[tuple[str, str]]:
    """(module, name) of each gptcourse function and class lab `lab` forbids, of its cases' references and
    judges, and of the attention mistakes' by-hand attention, found in the real package."""
    table, _ = reference_table(forbidden_names(lab))
    objects = [obj for obj, _, _ in table.values() if isinstance(obj, (type, types.FunctionType))]
    objects += [f for case in lab_cases(lab) for f in (case.expected, case.judge)]
    objects += [attend_by_hand, kv_heads_by_hand]  # the mistakes' right attention by hand, in every lab's view
    found = {(obj.__module__, obj.__qualname__) for obj in objects
             if obj.__module__.startswith("gptcourse.") and "." not in obj.__qualname__}
    return sorted(found)


def run_in_box(lab_folder: str, source: str, folder: Path) -> str:
    """The text output of one cell run by the grader's executor in a box started for `lab_folder`."""
    nb = new_notebook(cells=[new_code_cell(source)],
                      metadata={"kernelspec": {"name": "python3", "display_name": "Python 3", "language": "python"}})
    with Sandbox().start_box([str(folder)], lab=lab_folder) as box:
        with_box(RobustExecute, box)(timeout=300).preprocess(
            nb, {"metadata": {"path": str(folder)}, "nbgrader": {"assignment": lab_folder}})
    return "".join(out.get("text", "") or f"{out.get('ename')}: {out.get('evalue')}" for out in nb.cells[0].outputs)


@pytest.mark.parametrize("lab", sorted(LAB_FOLDERS))
def test_every_route_to_a_reference_gives_a_stub_or_nothing(lab, tmp_path):
    wanted = targets(lab)
    assert len(wanted) >= 3
    output = run_in_box(LAB_FOLDERS[lab], f"TARGETS = {wanted!r}\n{PROBE}", tmp_path)
    found = json.loads(output.strip().splitlines()[-1])
    real = {route: what for route, what in found.items() if what not in ("stub", "absent")}
    assert not real, f"lab {lab}'s kernel reached a reference: {real}"
    for module, name in wanted:  # the routes that always find the name find its stub
        assert found[f"{module}.{name} import_module"] == found[f"{module}.{name} pickle"] == "stub"


STUBBED_RECORDS = '''
import typing
from typing import NamedTuple


class Loss(NamedTuple):
    value: float

    def doubled(self) -> float:
        return 2 * self.value


class Pair(typing.NamedTuple):
    first: int
'''


def test_a_forbidden_named_tuple_becomes_a_stub_that_raises_when_built():
    """A NamedTuple refuses a `__new__` of its own: stubbed naively, the module would not even import."""
    from gptcourse.grading.box.package_view import stub_source

    namespace: dict = {}
    exec(stub_source(STUBBED_RECORDS, {"Loss", "Pair"}, "gptcourse.records", "13"), namespace)
    for name in ("Loss", "Pair"):
        with pytest.raises(RuntimeError, match=f"gptcourse.records.{name} is not available while lab 13"):
            namespace[name](1)
        assert not hasattr(namespace[name], "_fields")  # the fields and methods are gone with the record
