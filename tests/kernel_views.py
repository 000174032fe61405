"""What a graded kernel runs of the grading modules, stated as data, and every case's call run in its lab's view.

A graded kernel of lab NN imports a view of the package (`package_view.py`) in which, of the grading modules
(`package_view.GRADING`), only the definitions reachable from every lab's case calls and from import-time calls
stay; the rest are stubs that raise "not available". `tests/kernel_views.json` states them: "every lab" (what the
grading modules reach while imported, and what the rest of the package imports of them), then, per lab, what that
lab's cases' calls reach beyond it. Every lab's view keeps all of them (a graded kernel imports every lab module),
so a lab whose calls reach more widens every view: the statement's diff shows it in review.

`run(labs, folder)` is the kernel's half without the box or nbgrader: the grader's side (this process, the real
package) writes each lab's case inputs as the grader does (`kernel_inputs.write_inputs`, each hidden case under a
handle), and a plain subprocess, forked per lab with that lab's view first on sys.path, runs the solution notebook's
non-test cells (the solution's objects: the package's references are stubs there, as in the box) and `check`s
every case with them, as a graded kernel's test cells do; then the same with the untouched release's objects,
whose NotImplementedError drives the calls' error paths (there only a stub's error counts). A call that reaches a
stub fails here in seconds, where only a lab's round trip under nbgrader showed it, in minutes. It covers what
these objects make the calls run, not a path that only some wrong answer takes.

    python tests/kernel_views.py write         # restate tests/kernel_views.json from the package
    python tests/kernel_views.py diff          # what differs from it (exit 1 if anything does)
    python tests/kernel_views.py run [NN ...]  # every case's call of labs NN in their views (default: all)
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import time
import traceback
from pathlib import Path

TESTS = Path(__file__).resolve().parent
ROOT = TESTS.parent
STATEMENT = TESTS / "kernel_views.json"
EVERY_LAB = "every lab"
WRITE = "python tests/kernel_views.py write"


def labs() -> list[str]:
    """The lab numbers that have a solution notebook: "01", ..."""
    return sorted(path.name[:2] for path in (ROOT / "solutions").iterdir() if path.is_dir())


def kept() -> dict[str, list[str]]:
    """{"every lab": what every view keeps whatever the calls, "NN": what lab NN's calls reach beyond it}, as
    "module.name", computed with the view's own closure (`package_view.reachable`)."""
    from gptcourse.grading.box.package_view import call_roots, kept_definitions, package_trees, reachable
    from gptcourse.grading.cases import lab_cases

    trees = package_trees()
    base = reachable(trees, set())
    found = {lab: reachable(trees, call_roots(lab_cases(lab))) - base for lab in labs()}
    every = base.union(*found.values())
    if every != kept_definitions(trees):  # the statement's parts must add up to what the views keep
        raise AssertionError(f"the labs' closures add up to other names than the views keep: "
                             f"{sorted(every ^ kept_definitions(trees))}")
    return {EVERY_LAB: _names(base)} | {lab: _names(names) for lab, names in found.items()}


def _names(definitions: set[tuple[str, str]]) -> list[str]:
    return sorted(f"{module}.{name}" for module, name in definitions)


def differences(stated: dict[str, list[str]], found: dict[str, list[str]]) -> list[str]:
    """One line per name kept but not stated ("+") or stated but no longer kept ("-"), by part."""
    lines = [f"{part}: the statement has no such part" for part in sorted(stated.keys() - found.keys())]
    for part, names in found.items():
        was = set(stated.get(part, ()))
        lines += [f"{part}: + {name}" for name in names if name not in was]
        lines += [f"{part}: - {name}" for name in sorted(was - set(names))]
    return lines


def write(found: dict[str, list[str]]) -> None:
    STATEMENT.write_text(json.dumps(found, indent=1) + "\n")


# ---- every case's call in its lab's view


def run(labs: list[str], folder: Path) -> dict[str, tuple[dict[str, str], float]]:
    """lab -> ({"solution CASE" or "release CASE": what went wrong}, seconds), for each lab ("02") in `labs`, in
    its view of the package: every case whose call, run on the solution's object, records an error (or a
    reference) instead of outputs, or on the untouched release's object (whose NotImplementedError takes the
    calls' error paths) reaches a stub; also the cells that raise there ("solution cell ID"). One subprocess imports
    torch once, then forks a child for each lab, which imports that lab's view (as the box's zygote forks kernels:
    `zygote.py`)."""
    from gptcourse.grading.box.package_view import lab_view
    from gptcourse.grading.cases import lab_cases
    from gptcourse.grading.handles import PREFIX
    from gptcourse.grading.kernel_inputs import INPUTS_ENV, write_inputs

    plan, handles = [], {}
    for lab in labs:
        cases = lab_cases(lab)
        handles[lab] = {f"{PREFIX}{i:04d}": case.id for i, case in enumerate(cases) if case.hidden}
        handle_of = {case_id: handle for handle, case_id in handles[lab].items()}
        inputs = folder / f"inputs-{lab}.pt"
        write_inputs(inputs, lab, {}, handles[lab])  # as the grader does, with the public seeds
        plan.append({"lab": lab, "view": lab_view(lab), "env": {INPUTS_ENV: str(inputs)},
                     "notebooks": {"solution": _notebook("solutions", lab), "release": _notebook("labs", lab)},
                     "result": str(folder / f"result-{lab}.json"),
                     "tests": [handle_of.get(case.id, case.id) for case in cases]})
    (folder / "plan.json").write_text(json.dumps(plan))
    env = {name: value for name, value in os.environ.items() if not name.startswith("GPTCOURSE_")}
    done = subprocess.run([sys.executable, __file__, "kernels", str(folder / "plan.json")], cwd=folder, env=env,
                          capture_output=True, text=True, timeout=600)
    if done.returncode != 0:
        raise AssertionError(f"the kernels' stand-in failed:\n{done.stdout[-3000:]}{done.stderr[-3000:]}")
    found = {}
    for lab in labs:
        result = json.loads((folder / f"result-{lab}.json").read_text())
        found[lab] = ({_named(test, handles[lab]): error for test, error in result["failed"].items()},
                      result["seconds"])
    return found


def _notebook(folder: str, lab: str) -> str:
    [path] = (ROOT / folder).glob(f"{lab}_*/{lab}_*.ipynb")
    return str(path)


def _named(test: str, handles: dict[str, str]) -> str:
    """"solution CASE" for "solution HANDLE": a hidden case under its id again."""
    objects, _, handle = test.partition(" ")
    return f"{objects} {handles.get(handle, handle)}"


def kernels(plan_file: str) -> None:
    """The subprocess: import torch as the box's zygote does, then fork one child per lab of the plan, one at a
    time, that runs `kernel` in that lab's view."""
    import importlib

    def threads() -> int:
        return len(os.listdir("/proc/self/task")) if os.path.isdir("/proc/self/task") else 1

    importlib.import_module("torch")
    baseline = threads()  # the main thread and numpy's OpenBLAS pool, as the zygote counts them
    importlib.import_module("torch._dynamo")  # the rest of the zygote's preload (zygote.PRELOAD) but the package
    if threads() > baseline:
        raise SystemExit("a thread started while importing torch._dynamo: forking from here would be unsafe")
    for lab in json.loads(Path(plan_file).read_text()):
        start = time.perf_counter()
        pid = os.fork()
        if pid == 0:
            code = 1
            try:
                sys.path.insert(0, os.path.dirname(lab["view"]))
                os.environ.update(lab["env"])  # where the grader's inputs are (kernel_inputs.INPUTS_ENV)
                failed = kernel(lab["notebooks"], lab["view"], lab["tests"])
                Path(lab["result"]).write_text(json.dumps({"failed": failed,
                                                           "seconds": time.perf_counter() - start}))
                code = 0
            except BaseException:
                traceback.print_exc()
            finally:
                sys.stdout.flush()
                sys.stderr.flush()
                os._exit(code)
        _, status = os.waitpid(pid, 0)
        if status != 0:
            raise SystemExit(f"lab {lab['lab']}: the kernel's stand-in failed ({os.waitstatus_to_exitcode(status)})")


def kernel(notebooks: dict[str, str], view: str, tests: list[str]) -> dict[str, str]:
    """In a child of `kernels`, with a lab's view first on sys.path: check each of `tests` (a case id, or a hidden
    case's handle) with the objects of each notebook's non-test cells, as a graded kernel's test cell does:
    {"NOTEBOOK TEST": the recorded error} of those that recorded one ("release": only a stub's), and
    {"NOTEBOOK cell ID": error} of the cells that raised (the same)."""
    import gptcourse

    if os.path.realpath(gptcourse.__path__[0]) != os.path.realpath(view):
        raise SystemExit(f"gptcourse was imported from {gptcourse.__path__[0]}, not from the view {view}")
    from gptcourse.checks import CheckFailed
    from gptcourse.grading import kernel as graded_kernel
    from gptcourse.grading.cases import CaseId
    from gptcourse.grading.handles import is_handle
    from gptcourse.grading.kernel_inputs import graded_inputs

    payloads: list[dict] = []
    graded_kernel._emit = payloads.append  # what the kernel would display: the payload the grader reads
    failed = {}
    for objects, notebook in notebooks.items():
        every_error = objects == "solution"
        namespace: dict = {"__name__": "__main__"}
        for cell in json.loads(Path(notebook).read_text())["cells"]:
            grading = cell["metadata"].get("nbgrader", {})
            if cell["cell_type"] == "code" and not grading.get("grade"):
                try:
                    exec(compile("".join(cell["source"]), f"<cell {grading.get('grade_id')}>", "exec"), namespace)
                except Exception as err:
                    if every_error or " is not available while lab " in str(err):
                        failed[f"{objects} cell {grading.get('grade_id')}"] = f"{type(err).__name__}: {err}"
        for test in tests:
            piece = graded_inputs(test)["piece"].split(".")[1] if is_handle(test) else CaseId.parse(test).piece
            payloads.clear()
            try:
                graded_kernel.check(test, namespace.get(piece))
            except CheckFailed:
                pass
            [payload] = payloads
            error = payload["error"] or (payload["reference"] and f"reported as a reference: {payload['reference']}")
            if error and (every_error or " is not available while lab " in error):
                failed[f"{objects} {test}"] = error
    return failed


def main(argv: list[str]) -> int:
    if argv[:1] == ["kernels"]:
        kernels(argv[1])
        return 0
    if argv[:1] == ["run"]:
        with tempfile.TemporaryDirectory() as folder:
            found = run(argv[1:] or labs(), Path(folder))
        for lab, (failed, seconds) in found.items():
            print(f"lab {lab}: {len(failed)} failing, {seconds:.1f} s")
            print("".join(f"  {test}: {error}\n" for test, error in failed.items()), end="")
        return 1 if any(failed for failed, _ in found.values()) else 0
    if argv[:1] not in (["write"], ["diff"]):
        print(__doc__)
        return 2
    found = kept()
    if argv[0] == "write":
        write(found)
        print(f"{len(set().union(*found.values()))} names, which every lab's view keeps, written to {STATEMENT}")
        return 0
    lines = differences(json.loads(STATEMENT.read_text()), found)
    print("\n".join([*lines, f"if this is meant, restate it: {WRITE}"]) if lines else f"{STATEMENT.name}: as stated")
    return 1 if lines else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
