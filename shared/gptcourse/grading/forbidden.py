"""Finding the reference implementation in a student's code: which forbidden names their cells import or use.

Each lab module declares `FORBIDDEN = {piece: ("gptcourse.attention", ...)}`. The grader reads the student's
cells with `ast` (never runs them) and follows names through imports and simple assignments:

    import gptcourse.model.causal_attention as A;  A.attention(q, k, v)   -> the same object as gptcourse.attention
    from gptcourse import model;  model.block.causal_mask(4)               -> the same object as gptcourse.causal_mask

A reference is matched by identity in the grader's process (dotted paths under the packages that FORBIDDEN
names are resolved with getattr), so re-exports count too. Import machinery the grader cannot follow
(`__import__`, `importlib`, `sys.modules`, `exec`/`eval`/`compile`, `globals()`, `builtins`, `__dict__`, a
non-constant `getattr` on a module) and the grader's own code (`gptcourse.grading` beyond `check`, whose
cases hold the references) are reported as well: the labs need none of it.
"""

from __future__ import annotations

import ast
import importlib
import sys
from dataclasses import dataclass
from typing import Any

DYNAMIC_CALLS = {"__import__", "exec", "eval", "compile", "globals", "vars", "breakpoint"}
DYNAMIC_PATHS = ("importlib", "sys.modules", "builtins", "runpy", "pkgutil", "ctypes")
GRADER = "gptcourse.grading"  # the grader's own code: a student cell may use `check` from it, nothing else
DYNAMIC_ATTRIBUTES = {"__dict__", "__globals__", "__builtins__", "__getattribute__", "__subclasses__", "__code__"}


@dataclass(frozen=True)
class Finding:
    cell: str  # how the report names the cell, e.g. "solution cell 'attention'"
    name: str  # what it uses: a dotted reference, or the dynamic construct
    pieces: tuple[str, ...]  # the pieces it costs; empty for dynamic constructs (the caller decides)
    how: str  # "imports" or "uses"


def _resolve(path: str, roots: set[str]) -> Any:
    """The object at dotted `path` if it lies under one of `roots` (packages the grader may import), else None."""
    parts = path.split(".")
    if parts[0] not in roots:
        return None
    for cut in range(len(parts), 0, -1):
        module_name = ".".join(parts[:cut])
        try:
            obj = sys.modules.get(module_name) or importlib.import_module(module_name)
        except Exception:
            continue
        try:
            for attr in parts[cut:]:
                obj = getattr(obj, attr)
        except AttributeError:
            return None
        return obj
    return None


class _Scanner(ast.NodeVisitor):
    def __init__(self, aliases: dict[str, str], report: bool) -> None:
        self.aliases = aliases  # local name -> dotted path, carried from cell to cell
        self.report = report
        self.uses: list[tuple[str, str]] = []  # (dotted path or construct, "imports" | "uses" | "dynamic")

    def _path(self, node: ast.AST) -> str | None:
        if isinstance(node, ast.Name):
            return self.aliases.get(node.id)
        if isinstance(node, ast.Attribute):
            base = self._path(node.value)
            return f"{base}.{node.attr}" if base else None
        if (isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == "getattr"
                and len(node.args) >= 2 and isinstance(node.args[1], ast.Constant)
                and isinstance(node.args[1].value, str)):
            base = self._path(node.args[0])
            return f"{base}.{node.args[1].value}" if base else None
        return None

    def _use(self, path: str, how: str) -> None:
        if self.report:
            self.uses.append((path, how))

    def visit_Import(self, node: ast.Import) -> None:
        for alias in node.names:
            if alias.asname:
                self.aliases[alias.asname] = alias.name
            else:
                root = alias.name.split(".")[0]
                self.aliases[root] = root
            self._use(alias.name, "imports")

    def visit_ImportFrom(self, node: ast.ImportFrom) -> None:
        if node.level or not node.module:
            return
        for alias in node.names:
            path = f"{node.module}.{alias.name}"
            if alias.name == "*":
                self._use(node.module, "star-imports")
                continue
            self.aliases[alias.asname or alias.name] = path
            self._use(path, "imports")

    def visit_Assign(self, node: ast.Assign) -> None:
        self.generic_visit(node)
        path = self._path(node.value)
        for target in node.targets:
            if isinstance(target, ast.Name):
                if path:
                    self.aliases[target.id] = path
                else:
                    self.aliases.pop(target.id, None)

    def _define(self, node: ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef) -> None:
        self.aliases.pop(node.name, None)  # the student's own definition shadows an import of that name
        self.generic_visit(node)

    visit_FunctionDef = visit_AsyncFunctionDef = visit_ClassDef = _define

    def visit_Name(self, node: ast.Name) -> None:
        if node.id == "__builtins__":
            self._use("__builtins__", "dynamic")
        if node.id in self.aliases:
            self._use(self.aliases[node.id], "uses")

    def visit_Attribute(self, node: ast.Attribute) -> None:
        if node.attr in DYNAMIC_ATTRIBUTES:
            self._use(f".{node.attr}", "dynamic")
        path = self._path(node)
        if path:
            self._use(path, "uses")
        else:
            self.generic_visit(node)

    def visit_Call(self, node: ast.Call) -> None:
        if isinstance(node.func, ast.Name):
            if node.func.id in DYNAMIC_CALLS and node.func.id not in self.aliases:
                self._use(f"{node.func.id}()", "dynamic")
            if node.func.id == "getattr" and len(node.args) >= 2 and self._path(node.args[0]) \
                    and not isinstance(node.args[1], ast.Constant):
                self._use("getattr() with a computed name", "dynamic")
        path = self._path(node)
        if path:
            self._use(path, "uses")
            for arg in node.args[2:]:
                self.visit(arg)
            return
        self.generic_visit(node)


def find_forbidden(cells: list[tuple[str, str, bool]], forbidden: dict[str, tuple[str, ...]]) -> list[Finding]:
    """Findings in `cells` = [(label, source, written by the student)], in notebook order.

    Instructor cells are read too (their imports bind names the student may use) but not reported.
    """
    roots = {name.split(".")[0] for names in forbidden.values() for name in names}
    resolved: dict[str, Any] = {}

    def resolve(path: str) -> Any:
        if path not in resolved:
            resolved[path] = _resolve(path, roots)
        return resolved[path]

    by_object: dict[int, tuple[str, list[str]]] = {}  # id(reference) -> (its canonical name, pieces)
    by_name: dict[str, tuple[str, list[str]]] = {}  # a name the grader cannot import is matched by spelling
    for piece, names in forbidden.items():
        for name in names:
            obj = resolve(name)
            table, key = (by_object, id(obj)) if obj is not None else (by_name, name)
            table.setdefault(key, (name, []))[1].append(piece)

    def reference(path: str) -> tuple[str, list[str]] | None:
        obj = resolve(path)
        return by_object.get(id(obj)) if obj is not None else by_name.get(path)

    findings: list[Finding] = []
    aliases: dict[str, str] = {}
    for label, source, authored in cells:
        try:
            tree = ast.parse(source)
        except SyntaxError:
            continue  # it fails when it runs; nothing it names can be imported
        scanner = _Scanner(aliases, report=authored)
        scanner.visit(tree)
        seen: set[str] = set()
        for path, how in scanner.uses:
            if how == "dynamic" or any(path == p or path.startswith(p + ".") for p in DYNAMIC_PATHS):
                finding = Finding(label, path.lstrip(".") if how == "dynamic" else path, (), "dynamic")
            elif path.startswith(GRADER + ".") and path != f"{GRADER}.check":
                finding = Finding(label, path, (), "dynamic")
            elif how == "star-imports":
                module = resolve(path)
                hits = [by_object[id(v)] for v in vars(module).values() if id(v) in by_object] if module else []
                if not hits:
                    continue
                finding = Finding(label, f"{path}.*", tuple(sorted({p for _, ps in hits for p in ps})), "imports")
            else:
                hit = reference(path)
                if hit is None:
                    continue
                finding = Finding(label, hit[0], tuple(hit[1]), how)
            if finding.name not in seen:
                seen.add(finding.name)
                findings.append(finding)
    return findings
