"""A solution may not be the reference: every forbidden name of every lab, in every form a student can write it.

Fast tests (no kernel): the static scan (`find_forbidden`) and the run-time check (`reference_behind`) on each
(lab, piece, forbidden name) of each lab's `forbidden_names(lab)`, so a new lab is covered as soon as its pieces
declare `forbidden`; a call of a piece's reference that neither can see (fetched by a name built when it runs) is
named by the calls recorded while the case runs (`calls_to`); the labs' own solutions trigger none of them; the judge
zeroes a piece the kernel reports and survives a kernel that lies. Then ONE real nbgrader batch (labs 01-07, one
submission each) where every solution cell is replaced by the reference: imported, subclassed or wrapped, or reached
in a way only the kernel's checks see (the three variants take the labs in turn; the fast tests above try every
form on every piece).
"""

from __future__ import annotations

import ast
import pkgutil
import re
import sys
import types
from functools import cache
from pathlib import Path
from typing import Any

import nbformat
import pytest
from nbformat.v4 import new_code_cell, new_notebook, new_output

from gptcourse.checks import CheckFailed
from gptcourse.grading import MIME, case_seed, check, get_case, judge_payload, labs
from gptcourse.grading.cases import CaseId
from gptcourse.grading.forbidden import (
    ALLOWED_PACKAGES,
    HOW,
    Finding,
    calls_to,
    find_forbidden,
    reference_behind,
    reference_table,
    resolve,
)
from gptcourse.grading.payload import make_payload
from gptcourse.grading.piece import forbidden_names, lab_pieces
from gptcourse.grading.steps.judge import JudgeTestCells
from gptcourse.grading.steps.report import report_lines

ROOT = Path(__file__).resolve().parents[1]
LABS = [m.name[3:] for m in pkgutil.iter_modules(labs.__path__) if m.name.startswith("lab")]
NAMES = [(lab, piece, name) for lab in LABS for piece, names in forbidden_names(lab).items() for name in names]
NAME_IDS = [f"{lab}.{piece}:{name}" for lab, piece, name in NAMES]


def roots(lab: str) -> set[str]:
    return {name.split(".")[0] for names in forbidden_names(lab).values() for name in names}


@cache
def target(lab: str, name: str) -> tuple[str, Any]:
    """(dotted path, object) a student would use for `name`: the name itself, or for a module, the first
    function or class the module defines (it stands for all of them)."""
    obj = resolve(name, roots(lab))
    if isinstance(obj, types.ModuleType):
        table, _ = reference_table({"": (name,)})
        member = min(n for o, n, _ in table.values() if o is not obj)
        return member, resolve(member, roots(lab))
    return name, obj


SETUP = "import math\nimport torch\nfrom torch import nn\n"


def static_forms(path: str, obj: Any) -> dict[str, tuple[str, str]]:
    """(setup cell, student's cell) pairs in which the student binds (or defines) `answer` to the reference at
    `path`, in the forms a student can write; the setup cell is the instructor's, not reported."""
    parent, attr = path.rsplit(".", 1)
    root, rest = path.split(".", 1)
    forms = {
        "from-import": f"from {parent} import {attr}",
        "alias": f"from {parent} import {attr} as answer",
        "package-attribute": f"import {root} as g\nanswer = g.{rest}",
        "dotted-import": f"import {parent}\n\ndef answer(*args):\n    return {path}(*args)",
        "reassigned": f"import {parent} as m\nx, y = m, 1\nanswer = x.{attr}",
        "walrus": f"import {parent} as m\nif (answer := m.{attr}):\n    pass",
        "wrapper": f"from {parent} import {attr} as ref\n\ndef answer(*args):\n    return ref(*args)",
        "getattr": f"import {parent} as m\nanswer = getattr(m, {attr!r})",
        "inside-a-function": f"def answer(*args):\n    import {parent} as m\n    return m.{attr}(*args)",
    }
    forms = {form: (SETUP, source) for form, source in forms.items()}
    # the setup cell imported the module: the student's use of it is theirs
    forms["instructor-import"] = (f"{SETUP}import {parent} as m", f"answer = m.{attr}")
    module = getattr(obj, "__module__", None)  # a method descriptor has none: it is reached through its type
    home = f"{module}.{obj.__qualname__}"
    if module and home != path and resolve(home, {root}) is obj:
        forms["from-defining-module"] = (SETUP, f"from {obj.__module__} import {obj.__qualname__} as answer")
        forms["defining-module-attribute"] = (SETUP, f"import {obj.__module__} as A\nanswer = A.{obj.__qualname__}")
    if isinstance(obj, type):
        forms["subclass"] = (SETUP, f"import {root}\n\nclass Answer({path}):\n    pass")
        # Python reads the bases before it binds the class's name
        forms["subclass-same-name"] = (f"{SETUP}from {parent} import {attr}", f"class {attr}({attr}):\n    pass")
    public = getattr(resolve(parent, {root}), "__all__", None)
    if public is None or attr in public:
        forms["star"] = (SETUP, f"from {parent} import *")
    return forms


@pytest.mark.parametrize("lab, piece, name", NAMES, ids=NAME_IDS)
def test_every_forbidden_name_resolves(lab, piece, name):
    assert resolve(name, roots(lab)) is not None, f"lab {lab}'s piece {piece!r} forbids {name}, which is not there"


@pytest.mark.parametrize("lab, piece, name", NAMES, ids=NAME_IDS)
def test_the_scan_finds_every_form_of_every_forbidden_name(lab, piece, name):
    path, obj = target(lab, name)
    missed = {}
    for form, (setup, source) in static_forms(path, obj).items():
        cells = [("setup", setup, False), ("cell 2", source, True)]
        findings = find_forbidden(cells, forbidden_names(lab))
        if not any(piece in f.pieces for f in findings):
            missed[form] = (source, findings)
    assert not missed, missed


@pytest.fixture
def lazy_package(monkeypatch):
    """`lazypkg`, shaped as gptcourse was when the scan missed `from gptcourse import attention`: a lazy package
    (PEP 562) that exports the function `thing` and also has a submodule `lazypkg.thing` that defines it."""
    package, submodule = types.ModuleType("lazypkg"), types.ModuleType("lazypkg.thing")
    exec("def thing(x):\n    return x", submodule.__dict__)
    package.__path__ = []
    package.__all__ = ["thing"]
    package.__getattr__ = lambda name: submodule.thing if name == "thing" else (_ for _ in ()).throw(
        AttributeError(name))
    monkeypatch.setitem(sys.modules, "lazypkg", package)
    monkeypatch.setitem(sys.modules, "lazypkg.thing", submodule)
    return package, submodule


@pytest.mark.parametrize("source", [
    "from lazypkg import thing", "from lazypkg import thing as mine", "import lazypkg as L\nmine = L.thing",
    "from lazypkg import *", "import lazypkg\nclass Mine(lazypkg.thing):\n    pass"])
def test_a_name_is_the_attribute_before_the_submodule(lazy_package, source):
    package, submodule = lazy_package
    assert resolve("lazypkg.thing", {"lazypkg"}) is submodule.thing  # not the module lazypkg.thing
    assert "thing" not in vars(package)  # lazy: nothing is there until it is asked for
    found = find_forbidden([("cell 1", source, True)], {"piece": ("lazypkg.thing",)})
    [finding] = [f for f in found if f.how != "not allowed"]  # lazypkg is outside the allowlist too
    assert finding.pieces == ("piece",)


# a submission may import the standard library and ALLOWED_PACKAGES; anything else may hold a reference under a name
# no list foresees (transformers' apply_rotary_pos_emb, in dozens of model modules)
ALLOWED_SOURCES = ["import math, re, collections.abc", "from functools import partial", "import numpy as np",
                   "import torch.nn.functional as F", "from matplotlib import pyplot as plt", "import regex",
                   "from __future__ import annotations", "import importlib\nimportlib.import_module('math')"]
NOT_ALLOWED = {
    "import transformers": "transformers",
    "from tokenizers import Tokenizer": "tokenizers",
    "from transformers.models.llama.modeling_llama import apply_rotary_pos_emb": "transformers",
    "import importlib\nimportlib.import_module('transformers.models.llama')": "transformers",
    "from importlib import import_module as load\nload('tiktoken')": "tiktoken",
    "__import__('scipy.special')": "scipy",
    "from jax.numpy import *": "jax",
    "def f():\n    import transformers": "transformers",
    "%time _ = 1\nfrom transformers import AutoModel": "transformers",  # a magic does not hide the other lines
    "!ls\nimport tokenizers": "tokenizers",
}


@pytest.mark.parametrize("source", ALLOWED_SOURCES)
def test_an_allowed_import_is_no_finding(source):
    findings = find_forbidden([("cell 1", source, True)], forbidden_names("03"))
    assert [f for f in findings if f.how != "dynamic"] == []


@pytest.mark.parametrize("source", NOT_ALLOWED)
def test_an_import_outside_the_allowlist_is_found(source):
    findings = find_forbidden([("setup", "import transformers", False), ("cell 2", source, True)],
                              forbidden_names("03"))
    assert Finding("cell 2", NOT_ALLOWED[source], (), "not allowed") in findings
    assert NOT_ALLOWED[source] not in ALLOWED_PACKAGES


def test_an_import_outside_the_allowlist_zeroes_its_cells_piece_with_a_line_naming_it():
    cells = [new_code_cell("import torch", metadata={"nbgrader": {"grade_id": "setup", "locked": True}}),
             new_code_cell("from transformers.models.llama.modeling_llama import apply_rotary_pos_emb as rope",
                           metadata={"nbgrader": {"grade_id": "apply_rope", "solution": True, "locked": False}}),
             new_code_cell("import tokenizers", metadata={})]  # a cell of the student's own: every piece
    banned = JudgeTestCells()._banned_pieces(new_notebook(cells=cells), forbidden_names("03"), "03")
    assert set(banned) == set(forbidden_names("03"))
    assert banned["apply_rope"].endswith("imports transformers")
    nb = new_notebook(cells=cells[:2])
    assert set(JudgeTestCells()._banned_pieces(nb, forbidden_names("03"), "03")) == {"apply_rope"}
    [line] = report_lines(nb)
    assert "imports transformers, a package the labs do not allow" in line and "torch" in line
    assert line.endswith("0 points for 03.apply_rope.*")


def test_the_scan_never_runs_a_main_module():
    """`gptcourse.training.__main__` trains when imported: a cell naming it must not make the grader train (or
    exit, with the grader's command line)."""
    sources = ["import gptcourse.training.__main__", "from gptcourse.training import __main__",
               "import gptcourse.training.__main__ as m\nm.main()"]
    for source in sources:
        find_forbidden([("cell 1", source, True)], forbidden_names("07"))
    assert "gptcourse.training.__main__" not in sys.modules


# what `reference_behind` must say -> {form: source binding `answer`, with `ref` the reference}
RUNTIME_FORMS = {
    "is": {"is": "answer = ref"},
    "wraps or calls": {
        "lambda": "answer = lambda *args, **kwargs: ref(*args, **kwargs)",
        "def": "def answer(*args, **kwargs):\n    return ref(*args, **kwargs)",
        "dotted": "import {root}\n\ndef answer(*args):\n    return {path}(*args)",
        "closure": ("def make(r):\n    def inner(*args):\n        return r(*args)\n    return inner\n\n"
                    "answer = make(ref)"),
        "functools.wraps": "@functools.wraps(ref)\ndef answer(*args):\n    return None",
        "wrapped-twice": "def a(): pass\ndef answer(): pass\na.__wrapped__ = ref\nanswer.__wrapped__ = a",
        "partial": "answer = functools.partial(ref)",
        "default": "def answer(*args, r=ref):\n    return r(*args)",
        "container": "REFS = dict(r=[ref])\n\ndef answer(*args):\n    return REFS['r'][0](*args)",
        "bound-method": "class Holder:\n    def run(self, *args):\n        return ref(*args)\n\nanswer = Holder().run",
        "staticmethod": "class answer:\n    run = staticmethod(ref)",
    },
}
BASETYPE = 1 << 10  # Py_TPFLAGS_BASETYPE: a class Python lets you subclass
CLASS_FORMS = {
    "subclasses": {
        "subclass": "class answer(ref):\n    pass",
        "subclass-of-subclass": "class Mine(ref):\n    pass\n\nclass answer(Mine):\n    pass",
    },
    "wraps or calls": {
        "delegates": ("class answer:\n    def __init__(self, *args):\n        self.inner = ref(*args)\n\n"
                      "    def __call__(self, *args):\n        return self.inner(*args)"),
    },
}


def run_as_notebook(source: str, **names: Any) -> dict[str, Any]:
    """`source` executed as a notebook cell runs (functions and classes defined in `__main__`)."""
    namespace = {"__name__": "__main__", **names}
    exec(compile("import functools\n" + source, "<cell>", "exec"), namespace)
    return namespace


@pytest.mark.parametrize("lab, piece, name", NAMES, ids=NAME_IDS)
def test_the_run_time_check_sees_through_wrappers_of_every_forbidden_name(lab, piece, name):
    path, obj = target(lab, name)
    subclassable = isinstance(obj, type) and obj.__flags__ & BASETYPE
    tables = (RUNTIME_FORMS, CLASS_FORMS) if subclassable else (RUNTIME_FORMS,)
    forms = {form: (source, how) for table in tables for how, sources in table.items()
             for form, source in sources.items()}
    got = {}
    for form, (source, how) in forms.items():
        code = source.format(root=path.split(".")[0], path=path)
        found = reference_behind(run_as_notebook(code, ref=obj)["answer"], forbidden_names(lab)[piece])
        if found is None or found[0] != how:
            got[form] = found
    assert not got, got


def test_the_run_time_check_sees_instances_and_their_methods():
    import gptcourse

    names = forbidden_names("02")["AttentionHead"]
    head = gptcourse.AttentionHead(8, 4)
    assert reference_behind(head, names) == ("is an instance of", "gptcourse.AttentionHead")
    assert reference_behind(head.forward, names) == ("wraps or calls", "gptcourse.AttentionHead")
    ns = run_as_notebook("class Mine(torch.nn.Module):\n    pass\n\nanswer = Mine()\nanswer.inner = head",
                         torch=__import__("torch"), head=head)
    assert reference_behind(ns["answer"], names) == ("wraps or calls", "gptcourse.AttentionHead")
    # only the names of the piece count: gptcourse.causal_mask is lab 02's reference for causal_mask, not attention
    assert reference_behind(gptcourse.causal_mask, forbidden_names("02")["attention"]) is None


def test_the_run_time_check_survives_hostile_objects():
    source = '''
class Meta(type):
    @property
    def __mro__(cls):
        raise RuntimeError("no")

class Liar(metaclass=Meta):
    def __getattr__(self, name):
        raise ValueError(name)

class Endless:
    def __getattr__(self, name):
        return Endless()

def answer(*args):
    return cycle, Liar(), Endless(), deep
cycle = []
cycle.append(cycle)
deep = [[[[[[]]]]]]
'''
    ns = run_as_notebook(source)
    for obj in (ns["answer"], ns["Liar"], ns["Liar"](), ns["Endless"](), ns["cycle"]):
        assert reference_behind(obj, forbidden_names("02")["attention"]) is None


@cache
def solution_namespace(lab_folder: str) -> tuple[dict[str, Any], list[tuple[str, str, bool]], dict[str, str]]:
    """The lab's setup and solution cells run as a notebook: (namespace, [(label, source, authored)],
    {piece: the name its test cells check})."""
    nb = nbformat.read(ROOT / "solutions" / lab_folder / f"{lab_folder}.ipynb", as_version=4)
    namespace: dict[str, Any] = {"__name__": "__main__"}
    cells, checked = [], {}
    for cell in nb.cells:
        meta = cell.metadata.get("nbgrader", {})
        if cell.cell_type != "code":
            continue
        if meta.get("grade") and not meta.get("solution"):
            for node in ast.walk(ast.parse(cell.source)):
                if isinstance(node, ast.Call) and getattr(node.func, "id", "") == "check":
                    checked[CaseId.parse(node.args[0].value).piece] = node.args[1].id
            continue
        source = "\n".join(line for line in cell.source.splitlines() if "### " not in line)
        exec(compile(source, meta.get("grade_id", "cell"), "exec"), namespace)
        cells.append((meta.get("grade_id", "cell"), source, bool(meta.get("solution"))))
    return namespace, cells, checked


SOLVED = sorted(p.name for p in (ROOT / "solutions").iterdir() if p.name[:2] in LABS and forbidden_names(p.name[:2]))


@pytest.mark.parametrize("lab_folder", SOLVED)
def test_the_labs_solutions_trigger_neither_line(lab_folder):
    lab = lab_folder[:2]
    namespace, cells, checked = solution_namespace(lab_folder)
    assert find_forbidden(cells, forbidden_names(lab)) == []
    assert set(checked) >= set(forbidden_names(lab))
    for piece, names in forbidden_names(lab).items():
        assert reference_behind(namespace[checked[piece]], names) is None, (piece, checked[piece])


# ---- the calls the student's code makes while a case runs (`calls_to`): however it reached the reference


def _fetched(path: str) -> str:
    """Source that reaches the reference at `path` only when it runs, by a name the bytecode never loads."""
    root, rest = path.split(".", 1)
    return f"functools.reduce(getattr, {rest.split('.')!r}, __import__({root!r}))"


def _own_references() -> list[tuple[str, str, str, str]]:
    """(visible case, piece, its checked object's name, forbidden name) for each piece whose reference is one of
    its forbidden names and takes the student's arguments (its expected values are the reference's call)."""
    found = []
    for folder in SOLVED:
        lab = folder[:2]
        nb = nbformat.read(ROOT / "solutions" / folder / f"{folder}.ipynb", as_version=4)
        checked = {CaseId.parse(test_id).piece: obj for cell in nb.cells
                   for test_id, obj in re.findall(r'check\("([^"]+)", (\w+)\)', cell.source)}
        for piece in lab_pieces(lab):
            names = [n for n in piece.forbidden if resolve(n, roots(lab)) is piece.reference]
            if names and piece.expected is None:
                case = next(c for c in piece.cases if not c.hidden)
                found.append((case.id, piece.name, checked[piece.name], names[0]))
    return found


OWN = _own_references()


@pytest.mark.parametrize("test_id, piece, student_name, name", OWN, ids=[f"{t}:{n}" for t, _, _, n in OWN])
def test_a_call_of_the_reference_is_named_at_the_desk_and_scores_zero(test_id, piece, student_name, name):
    """A solution that fetches its piece's reference only when it runs (no walk of its objects can see it) and
    calls it: the visible check names the call, and the grader zeroes the piece with a line naming it."""
    from gptcourse.grading.kernel import run_case

    case = get_case(test_id)
    if isinstance(resolve(name, roots(test_id[:2])), type):
        source = (f"class {student_name}(torch.nn.Module):\n    def __init__(self, *args, **kwargs):\n"
                  f"        super().__init__()\n        self.inner = {_fetched(name)}(*args, **kwargs)\n\n"
                  f"    def forward(self, *args, **kwargs):\n        return self.inner(*args, **kwargs)")
    else:
        source = f"def {student_name}(*args, **kwargs):\n    return {_fetched(name)}(*args, **kwargs)"
    answer = run_as_notebook(source, torch=__import__("torch"))[student_name]
    names = forbidden_names(test_id[:2])[piece]
    assert reference_behind(answer, names) is None  # the walk of the object cannot see it: only the call can
    with pytest.raises(CheckFailed) as failed:
        check(test_id, answer)
    assert f"the object under test calls {name}, the reference for a piece you must write" in \
        " ".join(str(failed.value).split())
    nb = new_notebook(cells=[_test_cell(f"test_{piece}", f'check("{test_id}", {student_name})',
                                        run_case(case, case_seed(case), answer, names))])
    nb, _ = JudgeTestCells().preprocess(nb, {})
    assert nb.cells[0].outputs[0].output_type == "error"
    [line] = report_lines(nb)
    assert line.endswith(f"checks calls {name}, the reference for a piece you must write: 0 points for "
                         f"{test_id[:2]}.{piece}.*")


def test_only_the_students_own_calls_count():
    """A reference called by code the student may use (here torch's nn.RMSNorm calling F.rms_norm) is not the
    student's call; the student's own call is, once, and the hook set before is chained and restored."""
    import torch

    names = ("torch.nn.functional.rms_norm",)
    events = []
    sys.setprofile(lambda frame, event, arg: events.append(event))
    try:
        with calls_to(names) as called:
            torch.nn.RMSNorm(4)(torch.ones(2, 4))
        assert called == []
        ns = run_as_notebook("def mine(x):\n    return F.rms_norm(x, (4,)) + F.rms_norm(x, (4,))",
                             F=torch.nn.functional)
        with calls_to(names) as called:
            ns["mine"](torch.ones(2, 4))
        assert called == ["torch.nn.functional.rms_norm"]
        assert sys.getprofile() is not None and events
    finally:
        sys.setprofile(None)



BOUND = """
class Mine(torch.Tensor):
    def log_softmax(self, dim):
        return self

def bound(x):
    return x.log_softmax(1)

def unbound(x):
    return torch.Tensor.log_softmax(x, 1)

def kept(x):
    method = x.log_softmax
    return method(1)

def others(x):
    return x.softmax(1), x.as_subclass(Mine).log_softmax(1), torch.nn.functional.log_softmax(x, 1)
"""


def test_a_bound_method_of_a_built_in_type_is_the_reference_its_descriptor_is():
    """`logits.log_softmax(1)` is torch.Tensor.log_softmax bound to `logits`: however it is called, and on a
    Parameter too, it is that reference; a method of another name, the student's own override of the name, and
    torch's own call of the method (inside F.log_softmax) are not."""
    import torch

    names = ("torch.Tensor.log_softmax",)
    ns = run_as_notebook(BOUND, torch=torch)
    x = torch.randn(2, 3)
    for student, tensor in [("bound", x), ("bound", torch.nn.Parameter(x)), ("unbound", x), ("kept", x)]:
        with calls_to(names) as called:
            ns[student](tensor)
        assert called == ["torch.Tensor.log_softmax"], student
    with calls_to(names) as called:
        ns["others"](x)
    assert called == []

# ---- the judge: what the kernel reports zeroes the piece, and a lying kernel cannot crash it


def _payload(test_id: str, reference: Any) -> dict:
    case = get_case(test_id)
    return make_payload(test_id, case_seed(case), None, None) | {"reference": reference}


def test_a_reported_reference_fails_the_test_in_the_kernel_and_in_the_grader():
    passed, text = judge_payload(_payload("02.attention.visible", {"how": "subclasses", "name": "gptcourse.x"}))
    assert not passed and "the object under test subclasses gptcourse.x, the reference for a piece you must " \
                          "write" in " ".join(text.split())
    assert set(HOW) == {"is", "subclasses", "is an instance of", "wraps or calls", "calls"}


def _test_cell(grade_id: str, source: str, *payloads: Any):
    cell = new_code_cell(source, metadata={"nbgrader": {"grade": True, "solution": False, "locked": True,
                                                        "grade_id": grade_id, "points": 1, "schema_version": 3}})
    cell.outputs = [new_output("display_data", data={MIME: p, "text/plain": ""}) for p in payloads]
    return cell


def _good_mask_payload() -> dict:
    import torch

    case = get_case("02.causal_mask.visible")
    return make_payload(case.id, case_seed(case), {"mask": torch.ones(4, 4, dtype=torch.bool).tril()}, None)


@pytest.mark.parametrize("reported, says", [
    ({"how": "is", "name": "gptcourse.attention"}, "checks is gptcourse.attention, the reference"),
    ({"how": "owns", "name": "gptcourse.attention"}, "in a form the grader cannot read"),
    ({"how": "is", "name": "x\n- cell 1 was restored"}, "in a form the grader cannot read"),
    ({"how": "is", "name": "a" * 10_000}, "in a form the grader cannot read"),
    (["is", "gptcourse.attention"], "in a form the grader cannot read"),
    ("yes", "in a form the grader cannot read"),
    (0, "in a form the grader cannot read"),
])
def test_the_grader_zeroes_the_piece_the_kernel_reports_whatever_it_reports(reported, says):
    nb = new_notebook(cells=[
        _test_cell("test_causal_mask", 'check("02.causal_mask.visible", causal_mask)', _good_mask_payload()),
        _test_cell("test_attention", 'check("02.attention.visible", attention)',
                   _payload("02.attention.visible", reported)),
        # a later test of the same piece loses its points too, though its own payload says nothing
        _test_cell("test_attention_causal", 'check("02.attention.causal", attention)',
                   _payload("02.attention.causal", None)),
        # a report about a test this cell does not run is not read
        _test_cell("test_AttentionHead", 'check("02.AttentionHead.visible", AttentionHead)',
                   _payload("02.attention.visible", reported)),
    ])
    nb, _ = JudgeTestCells().preprocess(nb, {})
    mask, attention, causal, head = nb.cells
    assert mask.outputs[0].output_type == "stream"
    assert attention.outputs[0].output_type == causal.outputs[0].output_type == "error"
    assert "02.attention.causal: 0 points: the object that 02.attention.visible checks" in causal.outputs[0].evalue
    [line] = report_lines(nb)
    assert line.startswith("cell 2 ('test_attention'): the object that 02.attention.visible checks ") and says in line
    assert line.endswith("0 points for 02.attention.*")
    assert "no result recorded for 02.AttentionHead.visible" in head.outputs[0].evalue


# ---- one real nbgrader batch: every solution cell of labs 01-07 replaced by the reference

BATCH = ("01", "02", "03", "04", "05", "06", "07")


def lab_folders() -> list[str]:
    return sorted(p.name for p in (ROOT / "solutions").iterdir() if p.name[:2] in BATCH)


def reference_for(lab: str, piece: str, student_name: str) -> str:
    """The forbidden name an attacker would import for `piece`: the one named like the student's object, else the
    first listed function or class."""
    objects = [n for n in forbidden_names(lab)[piece] if not isinstance(resolve(n, roots(lab)), types.ModuleType)]
    return next((n for n in objects if n.rsplit(".", 1)[1] == student_name), objects[0])


def attack(variant: str, lab: str, piece: str, student_name: str) -> str:
    """A solution cell that is the reference: imported, subclassed or wrapped, or fetched with functools.reduce
    and subclassed (which only the run-time check sees) or called (which only the calls recorded while the case
    runs show)."""
    path = reference_for(lab, piece, student_name)
    parent, attr = path.rsplit(".", 1)
    root, rest = path.split(".", 1)
    obj = resolve(path, roots(lab))
    if variant == "imports":
        return f"from {parent} import {attr}" + ("" if attr == student_name else f" as {student_name}")
    if variant == "wraps":
        if isinstance(obj, type):
            return f"import {root} as g\n\n\nclass {student_name}(g.{rest}):\n    pass"
        return (f"from {parent} import {attr} as my_reference\n\n\ndef {student_name}(*args, **kwargs):\n"
                f"    return my_reference(*args, **kwargs)")
    fetch = f"functools.reduce(getattr, {rest.split('.')!r}, {root})"
    if isinstance(obj, type):
        return f"import functools\nimport {root}\n\n\nclass {student_name}({fetch}):\n    pass"
    # fetched when called: only the call, recorded while the case runs, shows it (in the box, a stub is called)
    return (f"import functools\nimport {root}\n\n\ndef {student_name}(*args, **kwargs):\n"
            f"    return {fetch}(*args, **kwargs)")


# variant: the scan's verb in its report line (None: only the run-time check sees it)
VARIANTS = {"imports": "imports", "wraps": "(imports|uses)", "run-time": None}


@pytest.fixture(scope="module")
def batch(tmp_path_factory):
    """Every lab of BATCH released and submitted once, each solution cell replaced by the reference in the lab's
    variant (VARIANTS in turn across the labs: each variant on two or three labs, classes and functions), graded by
    ONE `nbgrader autograde`: {student: (lab folder, variant, {piece: the name its test cells check})}."""
    from nbgrader_course import Course

    course = Course(tmp_path_factory.mktemp("forbidden"))
    pattern = "0[1-7]_*"
    course.nbgrader("generate_assignment", pattern, "--force")
    expected = {}
    for turn, folder in enumerate(lab_folders()):
        lab, variant = folder[:2], list(VARIANTS)[turn % len(VARIANTS)]
        _, _, checked = solution_namespace(folder)
        nb = course.notebook("labs", folder)
        pieces = [c.metadata.nbgrader["grade_id"] for c in nb.cells if c.metadata.nbgrader.get("solution")]
        answers = {piece: attack(variant, lab, piece, checked[piece]) for piece in pieces}
        course.submit(f"{variant}-{lab}", folder, course.solved(folder, answers))
        expected[f"{variant}-{lab}"] = (folder, variant, checked)
    course.nbgrader("autograde", pattern)
    return course, expected


def _report(course, student: str, folder: str) -> str:
    return (course.root / "grading" / "reports" / folder / f"{student}.txt").read_text()


@pytest.mark.slow
def test_each_reference_solution_scores_zero(batch):
    course, expected = batch
    for student, (folder, _, _) in expected.items():
        scores = course.scores(folder)[student]
        assert scores == course.expected_scores(folder, set(scores)), (student, scores)


@pytest.mark.slow
def test_each_piece_has_its_report_line(batch):
    course, expected = batch
    costs = "the reference for a piece you must write: 0 points for"
    missing = []
    for student, (folder, variant, checked) in expected.items():
        lab = folder[:2]
        text = _report(course, student, folder)
        for piece in forbidden_names(lab):
            if VARIANTS[variant]:  # the scan's line; one per reference, which may cost several pieces
                line = rf"^- cell \d+ \(solution '\w+'\) {VARIANTS[variant]} \S+, {costs} .*\b{lab}\.{piece}\.\*"
            else:  # the run-time check's line, one per piece
                name = reference_for(lab, piece, checked[piece])
                how = "subclasses" if isinstance(resolve(name, roots(lab)), type) else "calls"
                line = rf"^- cell \d+ \('test_\w+'\): the object that {lab}\.{piece}\.\w+ checks {how} " \
                       rf"{re.escape(name)}, {costs} {lab}\.{piece}\.\*$"
            if not re.search(line, text, re.MULTILINE):
                missing.append((student, piece, line, text))
    assert not missing, missing
