"""The `gptcourse` package as a graded kernel of lab NN sees it: the references that lab forbids do not exist.

A kernel that can read the package can also copy its reference implementation: `exec` the source of
`gptcourse/model/causal_attention.py`, rebuild a function from a code object, unpickle a class by name. No
identity check recognises such a copy, and no list of routes is complete. So a box grading lab NN binds, read-only
and exactly over the package folder, a copy of the package (`lab_view(lab)`) in which

- every function and class the lab's pieces forbid (`Piece.forbidden`; a module: every function and class it
  defines) is a
  stub: `def attention(*args, **kwargs)` raising "gptcourse.attention is not available while lab 02 is graded:
  write your own"; a class keeps its name and bases (so that module-level code subclassing it still imports;
  a NamedTuple's stub is a plain tuple, as a NamedTuple refuses a `__new__` of its own) and raises when
  instantiated. Its body, its source and its bytecode are gone from every file of the copy;
- the grader's own references are stubs too: in the grading modules (`GRADING`: the lab modules, their shared
  fixtures, the attention mistakes' catalogue and `gptcourse.checks`) only the functions and classes a graded
  kernel can reach stay (see below);
  every case reference, judge and mistakes catalogue is a stub.

What stays in the grading modules, and why that is sound: a graded kernel calls, of the cases, only each case's
`call` (the grader hands it the inputs, `kernel_inputs.py`, and judges the payload itself). What is kept is the
closure, computed with `ast`, of the module-level names reachable from (1) every case's `call`, (2) the calls a
grading module makes while it is imported (`declare(Piece(...))`, `register(...)`), (3) the names of grading modules
that the rest of the package imports (`CheckFailed` for kernel.py), following names, the module-level values
they name and imports between grading modules. Code that reaches a module-level function some other way
(`globals()[...]`, a table built by `map`) is not followed: it gets a stub, which raises "not available" where
it is called, so a mistake here shows up loudly, never as a wrong grade (tests/test_kernel_views.py runs every
case's call in its lab's view in seconds; a lab's round trip fails too, minutes later). tests/kernel_views.json
states what the closure keeps, so that a lab whose calls widen it shows in review. Stubbing cannot make a wrong
answer pass: the grader, which imports the real package, computes every expected value.

Only `.py` files (transformed, with line numbers kept where a stub fits in the lines it replaces) and package
data are copied, never the real package's `__pycache__`; the copy is compiled for this interpreter with the real
path as its file names. Views are cached under `cache_folder()`, keyed by a hash of the package's files, this
module's version and the lab, written to a temporary folder and renamed into place, so that concurrent graders
build at most one each and later boxes reuse it. The grader process never imports a view.
"""

from __future__ import annotations

import ast
import compileall
import functools
import hashlib
import os
import shutil
import sys
import tempfile
import types
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from ..cases import Case

VERSION = 3  # part of the cache key: a change to the transform below must bump it
# modules whose functions are kept only if reachable
GRADING = ("gptcourse.checks", "gptcourse.grading.labs", "gptcourse.grading.fixtures",
           "gptcourse.grading.attention_mistakes")
STUB_ERROR = "RuntimeError"

Definition = tuple[str, str]  # (module, top-level name)


def package_folder() -> Path:
    """The real package folder: what a box binds the view over."""
    import gptcourse

    return Path(gptcourse.__file__).resolve().parent


def cache_folder() -> Path:
    """Where views are kept: $XDG_CACHE_HOME/gptcourse/lab-views (default ~/.cache), outside every folder a
    kernel sees (a view of another lab holds this lab's references)."""
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base, "gptcourse", "lab-views")


def lab_number(lab: str) -> str:
    """"02" for "02_causal_attention" or "02" (the prefix of the lab's case ids)."""
    return lab.split("_")[0]


@functools.cache
def lab_view(lab: str) -> str:
    """The package folder of lab `lab`'s view, built on first use and cached (see the module docstring)."""
    number = lab_number(lab)
    package = package_folder()
    sources = dict(_package_files(package))
    key = hashlib.sha256(f"{VERSION}\0{sys.version}\0{package}\0{number}".encode())
    for relative, data in sorted(sources.items()):
        key.update(f"\0{relative}\0{len(data)}\0".encode() + data)
    root = cache_folder()
    final = root / f"lab-{key.hexdigest()[:32]}"
    if not final.is_dir():
        root.mkdir(parents=True, exist_ok=True)
        building = Path(tempfile.mkdtemp(prefix=".building-", dir=root))
        try:
            _build(building / "gptcourse", package, sources, stubbed_definitions(number), number)
            os.chmod(building, 0o755)
            os.rename(building, final)  # atomic; fails if another grader renamed its build first
        except OSError:
            if not final.is_dir():
                raise
        finally:
            shutil.rmtree(building, ignore_errors=True)
    return str(final / "gptcourse")


def view_binds(lab: str, bound: Iterable[str]) -> dict[str, str]:
    """{folder in the box: lab's view} for the package folder and every other `gptcourse` package on sys.path
    that lies in a `bound` folder (e.g. the checkout an editable install points at): no copy of the real one is
    left in view."""
    view = lab_view(lab)
    bound = [str(b) for b in bound]
    found = {str(package_folder())}
    found |= {os.path.realpath(os.path.join(p, "gptcourse")) for p in sys.path
              if p and os.path.isfile(os.path.join(p, "gptcourse", "__init__.py"))}
    return {target: view for target in sorted(found)
            if any(target == b or target.startswith(b.rstrip("/") + "/") for b in bound)}


def _package_files(package: Path) -> Iterator[tuple[str, bytes]]:
    """(path relative to the package, content) of its source and data files; no bytecode, no caches."""
    for path in sorted(package.rglob("*")):
        relative = path.relative_to(package)
        if path.is_file() and "__pycache__" not in relative.parts and path.suffix not in (".pyc", ".pyo"):
            yield relative.as_posix(), path.read_bytes()


def _build(target: Path, package: Path, sources: dict[str, bytes], stubs: dict[str, set[str]], lab: str) -> None:
    for relative, data in sources.items():
        path = target / relative
        path.parent.mkdir(parents=True, exist_ok=True)
        module = _module_name(relative)
        if module in stubs:
            data = stub_source(data.decode(), stubs[module], module, lab).encode()
        path.write_bytes(data)
    if not compileall.compile_dir(str(target), ddir=str(package), quiet=1):
        raise RuntimeError(f"the view of lab {lab} does not compile")
    for path in [target, *target.rglob("*")]:
        os.chmod(path, 0o755 if path.is_dir() else 0o644)


def _module_name(relative: str) -> str:
    parts = ["gptcourse", *relative.removesuffix(".py").split("/")] if relative.endswith(".py") else []
    return ".".join(parts[:-1] if parts[-1:] == ["__init__"] else parts)


# ---- what is stubbed


def stubbed_definitions(lab: str) -> dict[str, set[str]]:
    """module -> the top-level functions and classes that are stubs in lab `lab`'s view: those the lab forbids,
    and those of the grading modules that no graded kernel reaches."""
    from ..forbidden import reference_table
    from ..piece import forbidden_names

    trees = package_trees()
    stubs: dict[str, set[str]] = {}
    table, _ = reference_table(forbidden_names(lab_number(lab)))
    for obj, _name, _pieces in table.values():
        if isinstance(obj, types.ModuleType) and obj.__name__ in trees:
            stubs.setdefault(obj.__name__, set()).update(_definitions(trees[obj.__name__]))
        elif isinstance(obj, (type, types.FunctionType)) and getattr(obj, "__module__", None) in trees:
            stubs.setdefault(obj.__module__, set()).add(obj.__qualname__.split(".")[0])
    kept = kept_definitions(trees)
    for module, tree in trees.items():
        if _is_grading(module):
            stubs.setdefault(module, set()).update(set(_definitions(tree)) - {name for m, name in kept if m == module})
    return {module: names for module, names in stubs.items() if names}


def package_trees() -> dict[str, ast.Module]:
    """module -> its parsed source, for every module of the real package."""
    return {module: ast.parse(data.decode()) for relative, data in _package_files(package_folder())
            if (module := _module_name(relative))}


def call_roots(cases: Iterable[Case]) -> set[Definition]:
    """(module, top-level name) of each case's `call`: what a graded kernel runs of the cases."""
    return {(case.call.__module__, case.call.__qualname__.split(".")[0]) for case in cases}


def kept_definitions(trees: dict[str, ast.Module]) -> set[Definition]:
    """The grading modules' definitions that every lab's view keeps: those reachable from every lab's cases'
    calls (a graded kernel imports every lab module: `cases.registry`). tests/kernel_views.json states them."""
    from ..cases import registry

    return reachable(trees, call_roots(registry().values()))


def _is_grading(module: str) -> bool:
    return any(module == g or module.startswith(g + ".") for g in GRADING)


def _definitions(tree: ast.Module) -> dict[str, ast.stmt]:
    return {node.name: node for node in tree.body
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef))}


@functools.lru_cache(maxsize=256)  # one package's trees (a tree hashes by identity): `reachable` is called per lab
def _imports(module: str, tree: ast.AST) -> dict[str, tuple[str, str | None]]:
    """local name -> (module, attribute or None for the module itself), for every import in `tree` (read only)."""
    package = module if _is_package(module) else module.rpartition(".")[0]
    names: dict[str, tuple[str, str | None]] = {}
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom):
            base = package.split(".")
            source = ".".join(base[:len(base) - node.level + 1] + ([node.module] if node.module else [])) \
                if node.level else (node.module or "")
            for alias in node.names:
                names[alias.asname or alias.name] = (source, alias.name)
        elif isinstance(node, ast.Import):
            for alias in node.names:
                names[alias.asname or alias.name.split(".")[0]] = (alias.name if alias.asname else
                                                                  alias.name.split(".")[0], None)
    return names


@functools.cache
def _is_package(module: str) -> bool:
    return (package_folder().parent / module.replace(".", "/") / "__init__.py").is_file()


def _import_time_names(tree: ast.Module) -> Iterator[str]:
    """Names a module calls while it is imported: in its module-level statements (not in function bodies or
    lambdas), and in the bases and keywords of its classes, which a stub keeps."""
    for node in tree.body:
        if isinstance(node, ast.ClassDef):
            parts: list[ast.AST] = [*node.bases, *node.keywords]
        elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            parts = []
        else:
            parts = [node]
        for part in parts:
            for sub in _walk_outside_lambdas(part):
                if isinstance(sub, ast.Call) and isinstance(sub.func, ast.Name):
                    yield sub.func.id
                elif isinstance(part, ast.expr) and isinstance(sub, ast.Name):
                    yield sub.id


def _walk_outside_lambdas(node: ast.AST) -> Iterator[ast.AST]:
    yield node
    for child in ast.iter_child_nodes(node):
        if not isinstance(child, ast.Lambda):
            yield from _walk_outside_lambdas(child)


def reachable(trees: dict[str, ast.Module], roots: set[Definition]) -> set[Definition]:
    """The grading modules' top-level definitions reachable from `roots`, from their import-time calls and from
    the rest of the package's imports of them (see the module docstring)."""
    imports = {module: _imports(module, tree) for module, tree in trees.items()}
    definitions = {module: _definitions(tree) for module, tree in trees.items()}
    assigned = {module: {target.id: node for node in tree.body if isinstance(node, (ast.Assign, ast.AnnAssign))
                         for target in (node.targets if isinstance(node, ast.Assign) else [node.target])
                         if isinstance(target, ast.Name)}
                for module, tree in trees.items()}
    todo: list[tuple[str, ast.AST]] = []
    kept: set[Definition] = set()
    seen: set[int] = set()

    def use(module: str, name: str, values: bool = True) -> None:
        """Keep what `name` is in `module`; with `values`, also what a module-level value of that name holds
        (code that reads it may call anything in it; an import-time call of it only runs what it is)."""
        if name in definitions[module]:
            if (module, name) not in kept:
                kept.add((module, name))
                todo.append((module, definitions[module][name]))
        elif name in assigned[module]:
            if values and id(assigned[module][name]) not in seen:
                seen.add(id(assigned[module][name]))
                todo.append((module, assigned[module][name]))
        elif name in imports[module]:
            source, attribute = imports[module][name]
            if source in trees and attribute is not None:
                use(source, attribute, values)

    for module, name in roots:
        if module in trees:
            use(module, name)
    for module, tree in trees.items():
        if _is_grading(module):
            for name in _import_time_names(tree):
                use(module, name, values=False)
        else:
            for source, attribute in imports[module].values():
                if source in trees and _is_grading(source) and attribute is not None:
                    use(source, attribute)
    while todo:
        module, node = todo.pop()
        for sub in ast.walk(node):
            if isinstance(sub, ast.Name):
                use(module, sub.id)
            elif isinstance(sub, ast.Attribute) and isinstance(sub.value, ast.Name) \
                    and imports[module].get(sub.value.id, ("", ""))[1] is None:
                source = imports[module][sub.value.id][0]
                if source in trees:
                    use(source, sub.attr)
    return {(module, name) for module, name in kept if _is_grading(module)}


# ---- the transform


def public_name(module: str, name: str) -> str:
    """How a student would name it: "gptcourse.attention" if the package exports it, else "module.name"."""
    import gptcourse

    exported = module.removeprefix("gptcourse.") in gptcourse.WHERE and name in gptcourse.WHERE[
        module.removeprefix("gptcourse.")]
    return f"gptcourse.{name}" if exported else f"{module}.{name}"


def unavailable_message(module: str, name: str, lab: str) -> str:
    return f"{public_name(module, name)} is not available while lab {lab} is graded: write your own"


def _is_named_tuple(base: ast.expr) -> bool:
    return ast.unparse(base) in ("NamedTuple", "typing.NamedTuple")


def stub_source(source: str, names: set[str], module: str, lab: str) -> str:
    """`source` with each top-level function or class in `names` replaced by a stub (decorators, body and comments
    inside it gone); the other lines keep their numbers where the stub is no longer than what it replaces."""
    tree = ast.parse(source)
    lines = source.splitlines(keepends=True)
    for node in sorted(_definitions(tree).values(), key=lambda n: n.lineno, reverse=True):
        if node.name not in names:
            continue
        start = min([node.lineno, *(d.lineno for d in node.decorator_list)]) - 1
        message = repr(unavailable_message(module, node.name, lab))
        if isinstance(node, ast.ClassDef):
            # a NamedTuple refuses a __new__ of its own: its stub is a plain tuple (no fields, no methods)
            heads = [("tuple" if _is_named_tuple(base) else ast.unparse(base)) for base in node.bases]
            heads += [ast.unparse(k) for k in node.keywords]
            stub = [f"class {node.name}({', '.join(heads)}):\n",
                    f"    def __new__(cls, *args, **kwargs): raise {STUB_ERROR}({message})\n"]
        else:
            stub = [f"def {node.name}(*args, **kwargs): raise {STUB_ERROR}({message})\n"]
        span = node.end_lineno - start
        lines[start:node.end_lineno] = stub + ["\n"] * max(0, span - len(stub))
    return "".join(lines)
