"""Finding the reference implementation in a student's work, twice: in the cells' source, and in the object a test
checks.

Each piece of a lab declares its `forbidden` names, ("gptcourse.attention", "gptcourse.training.loop", ...)
(`piece.forbidden_names` reads them): the references a student must not use for that piece. A name is resolved
as Python resolves it, attribute of the object first, then submodule (`from gptcourse import attention` is the
function that `gptcourse` exports); a module stands for itself and every function and class it defines
("anything from gptcourse.training.loop"). A reference is matched by identity, so re-exports and aliases are the
same object:

    from gptcourse import attention as my_attention                       -> gptcourse.attention
    import gptcourse.model.causal_attention as A;  A.attention(q, k, v)   -> gptcourse.attention
    class AttentionHead(gptcourse.AttentionHead): pass                     -> gptcourse.AttentionHead

1. `find_forbidden` (in the grader, before judging) reads the cells with `ast`, never runs them, and follows names
   through imports (`import`, `from ... import`, star imports by the module's `__all__`), assignments (tuples,
   `:=`, annotated), scopes (a parameter, a local or the student's own `def`/`class` shadows an import) and
   attribute chains, including every module a chain passes through. Import machinery the scan cannot follow
   (`__import__`, `importlib`, `sys.modules`, `exec`/`eval`/`compile`, `globals()`, `builtins`, `__dict__`, a
   non-constant `getattr` on a module, torch's registry of ops by name `torch.ops`) and the grader's own code
   (`gptcourse.grading` beyond `check`, whose cases hold the references) are reported as well: the labs need none
   of it. A submission may import only what the labs need: Python's standard library and the packages of
   `ALLOWED_PACKAGES`; any other import (also by `importlib.import_module` or `__import__` with a constant name)
   is a finding, since another package may hold a piece's reference under a name no list can foresee
   (transformers has a copy of `apply_rotary_pos_emb` in dozens of model modules).
2. `reference_behind` (in the student's kernel, called by `check`) looks at the object under test: is it a
   reference, a subclass or an instance of one, or does it wrap one (`__wrapped__` chains, `functools.partial`,
   bound methods, static/class methods and properties, containers, and the closures, defaults and global
   attribute chains in the bytecode of the student's own functions and methods)? The kernel reports what it
   found in the result payload and the grader zeroes the piece.
3. `calls_to` (in the student's kernel, around the case's run) records the references that the student's own code
   calls while the case runs, however it reached them (a name computed at run time, an object built inside the
   call): a profile hook matches each call's callee against the references, by identity (a function's code, a
   class's methods, a builtin), and its caller against the student's own code. A method of a built-in type,
   listed as its descriptor (`torch.Tensor.log_softmax`), is the same reference when bound (`logits.log_softmax(1)`):
   a bound call is matched by its name and the type of the object it is bound to. Calls a reference makes, or that
   the package the student may use makes, are not the student's and do not count.
The kernel is the student's: a tampered one can hide its own use from the second and third lines, never raise a
score, which is why the static scan stays first.
Neither sees source copied from the package; in a graded kernel there is none to copy: the references are stubs
there (`package_view.py`).
"""

from __future__ import annotations

import ast
import dis
import functools
import importlib
import inspect
import sys
import types
from collections import deque
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

DYNAMIC_CALLS = {"__import__", "exec", "eval", "compile", "globals", "vars", "breakpoint"}
# torch.ops: every ATen op by name (torch.ops.aten._scaled_dot_product_attention_math is the kernel behind
# F.scaled_dot_product_attention, as another object), a registry the labs never need
# timeit runs a string of code, pydoc.locate imports a dotted name: two more doors past the import allowlist
DYNAMIC_PATHS = ("importlib", "sys.modules", "builtins", "runpy", "pkgutil", "ctypes", "torch.ops", "timeit",
                 "pydoc")
GRADER = "gptcourse.grading"  # the grader's own code: a student cell may use `check` from it, nothing else
DYNAMIC_ATTRIBUTES = {"__dict__", "__globals__", "__builtins__", "__getattribute__", "__subclasses__", "__code__"}
HOW = ("is", "subclasses", "is an instance of", "wraps or calls", "calls")  # what the kernel's checks may report
# what a graded submission may import besides Python's standard library (`sys.stdlib_module_names`), by top-level
# package: torch and gptcourse (whose references each piece forbids by name), regex (lab 08's pre-tokenizer), and
# numpy, matplotlib and ipywidgets, which the course installs to look at numbers and hold no piece of a GPT, and
# IPython, the kernel itself (a display's content is judged by the active-content step)
ALLOWED_PACKAGES = frozenset({"torch", "gptcourse", "regex", "numpy", "matplotlib", "ipywidgets", "IPython"})
IMPORT_CALLS = ("importlib.import_module", "importlib.__import__")  # with `__import__`: they import a name given
MAX_VISITS = 3000  # objects `reference_behind` looks at, at most: a huge or cyclic object graph stays cheap
MAX_ITEMS = 100  # items of one container it looks at


@dataclass(frozen=True)
class Finding:
    cell: str  # how the report names the cell, e.g. "solution cell 'attention'"
    name: str  # what it uses: a dotted reference, or the dynamic construct
    pieces: tuple[str, ...]  # the pieces it costs; empty for dynamic constructs (the caller decides)
    how: str  # "imports", "uses", "dynamic" or "not allowed" (an import outside the allowlist; name: its package)


def allowed_import(module: str) -> bool:
    """Whether a submission may import `module` (dotted): it lies in the standard library or `ALLOWED_PACKAGES`."""
    root = module.split(".")[0]
    return root in ALLOWED_PACKAGES or root in sys.stdlib_module_names


def allowed_text() -> str:
    """The allowlist, as a report line says it."""
    return f"Python's standard library, {', '.join(sorted(ALLOWED_PACKAGES))}"


def pieces_lost(finding: Finding, owner: str | None, forbidden: dict[str, tuple[str, ...]]) -> tuple[str, ...]:
    """The pieces `finding` costs: its references' pieces; one the scan cannot tie to a reference (a construct it
    cannot follow, an import outside the allowlist) costs the piece whose solution cell it is in (`owner`, that
    cell's grade_id), or every piece elsewhere."""
    if finding.pieces:
        return finding.pieces
    return (owner,) if owner in forbidden else tuple(forbidden)


def resolve(path: str, roots: Iterable[str], import_missing: bool = True) -> Any:
    """The object at dotted `path` as Python finds it, if `path` lies under one of `roots`; else None.

    Each step takes the attribute first and only then the submodule (what `from a import b` and `a.b` do): a
    package that re-exports a function under a submodule's name gives the function. Submodules are imported
    only when `import_missing` (the grader) and never a dunder one (`gptcourse.training.__main__` would train);
    without it (the student's kernel) only modules already imported count: the student cannot hold an object of
    a module nobody imported.
    """
    parts = path.split(".")
    if parts[0] not in roots or not all(parts):
        return None
    obj = _module(parts[0], import_missing)
    for i, part in enumerate(parts[1:], start=2):
        if obj is None:
            return None
        try:
            obj = getattr(obj, part)
            continue
        except Exception:  # AttributeError, or whatever a lazy module's __getattr__ raised
            pass
        obj = _module(".".join(parts[:i]), import_missing) if isinstance(obj, types.ModuleType) else None
    return obj


def _module(name: str, import_missing: bool) -> types.ModuleType | None:
    if name in sys.modules or not import_missing:
        return sys.modules.get(name)
    if any(part.startswith("__") for part in name.split(".")):
        return None
    try:
        return importlib.import_module(name)
    except Exception:  # ImportError, or a module that fails to import: not something the student can use
        return None


def _members(module: types.ModuleType) -> Iterator[tuple[str, Any]]:
    """The functions and classes `module` defines itself (not those it imports)."""
    for attr, value in list(vars(module).items()):
        if isinstance(value, (type, types.FunctionType)) and getattr(value, "__module__", None) == module.__name__:
            yield attr, value


def reference_table(forbidden: dict[str, tuple[str, ...]], import_missing: bool = True
                    ) -> tuple[dict[int, tuple[Any, str, set[str]]], dict[str, set[str]]]:
    """({id(object): (object, canonical name, pieces)}, {unresolvable name: pieces}) for a lab's forbidden names.

    A module brings every function and class it defines, named `module.attr`; a name listed explicitly keeps
    its own spelling. A name the grader cannot resolve is matched by spelling only.
    """
    roots = {name.split(".")[0] for names in forbidden.values() for name in names}
    table: dict[int, tuple[Any, str, set[str]]] = {}
    by_name: dict[str, set[str]] = {}
    members: list[tuple[str, Any, str]] = []
    for piece, names in forbidden.items():
        for name in names:
            obj = resolve(name, roots, import_missing)
            if obj is None:
                by_name.setdefault(name, set()).add(piece)
                continue
            table.setdefault(id(obj), (obj, name, set()))[2].add(piece)
            if isinstance(obj, types.ModuleType):
                members += [(f"{name}.{attr}", value, piece) for attr, value in _members(obj)]
    for name, value, piece in members:  # after every explicit name, so that those keep their spelling
        table.setdefault(id(value), (value, name, set()))[2].add(piece)
    return table, by_name


# ---- 1. the static scan of the cells' source


class _Scanner(ast.NodeVisitor):
    """Collects the dotted paths a cell imports or uses, following bindings through scopes.

    `scopes[0]` is the notebook's namespace (name -> dotted path, carried from cell to cell); a function, lambda,
    class or comprehension pushes a scope of its own. None marks a name bound to something the scan does not
    follow (the student's own function, a parameter, a number).
    """

    def __init__(self, aliases: dict[str, str | None], report: bool, star_names: Callable[[str], list[str]]) -> None:
        self.scopes: list[dict[str, str | None]] = [aliases]
        self.globals: list[set[str]] = [set()]  # names a function declares `global`
        self.report = report
        self.star_names = star_names
        self.uses: list[tuple[str, str]] = []  # (dotted path or construct, "imports" | "uses" | "star" | "dynamic")

    # bindings

    def _lookup(self, name: str) -> str | None:
        for scope in reversed(self.scopes):
            if name in scope:
                return scope[name]
        return None

    def _bound(self, name: str) -> bool:
        """Whether the cells bound `name` (then it is not the builtin of that name)."""
        return any(name in scope for scope in self.scopes)

    def _bind(self, name: str, path: str | None) -> None:
        scope = self.scopes[0] if name in self.globals[-1] else self.scopes[-1]
        scope[name] = path

    def _assign(self, target: ast.AST, value: ast.AST | None) -> None:
        """Bind `target` to what `value` names (None: to something the scan does not follow)."""
        if isinstance(target, ast.Name):
            self._bind(target.id, self._path(value) if value is not None else None)
        elif isinstance(target, (ast.Tuple, ast.List)):
            pairs = (isinstance(value, (ast.Tuple, ast.List)) and len(value.elts) == len(target.elts)
                     and not any(isinstance(e, ast.Starred) for e in (*target.elts, *value.elts)))
            for i, element in enumerate(target.elts):
                self._assign(element, value.elts[i] if pairs else None)  # type: ignore[union-attr]
        elif isinstance(target, ast.Starred):
            self._assign(target.value, None)
        else:  # an attribute or a subscript: what it reads is a use
            self.visit(target)

    def _path(self, node: ast.AST) -> str | None:
        if isinstance(node, ast.Name):
            return self._lookup(node.id)
        if isinstance(node, ast.Attribute):
            base = self._path(node.value)
            return f"{base}.{node.attr}" if base else None
        if isinstance(node, ast.NamedExpr):
            return self._path(node.value)
        if (isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == "getattr"
                and not self._bound("getattr") and len(node.args) >= 2
                and isinstance(node.args[1], ast.Constant) and isinstance(node.args[1].value, str)):
            base = self._path(node.args[0])
            return f"{base}.{node.args[1].value}" if base else None
        return None

    def _use(self, path: str, how: str) -> None:
        if self.report:
            self.uses.append((path, how))

    def _visit_all(self, nodes: Iterable[ast.AST | None]) -> None:
        for node in nodes:
            if node is not None:
                self.visit(node)

    # statements that bind names

    def visit_Import(self, node: ast.Import) -> None:
        for alias in node.names:
            root = alias.name.split(".")[0]
            self._bind(alias.asname or root, alias.name if alias.asname else root)
            self._use(alias.name, "imports")

    def visit_ImportFrom(self, node: ast.ImportFrom) -> None:
        if node.level or not node.module:  # a relative import: a notebook is no package, it fails
            for alias in node.names:
                if alias.name != "*":
                    self._bind(alias.asname or alias.name, None)
            return
        for alias in node.names:
            if alias.name == "*":
                self._use(node.module, "star")
                for name in self.star_names(node.module):
                    self._bind(name, f"{node.module}.{name}")
                continue
            path = f"{node.module}.{alias.name}"
            self._bind(alias.asname or alias.name, path)
            self._use(path, "imports")

    def visit_Assign(self, node: ast.Assign) -> None:
        self.visit(node.value)
        for target in node.targets:
            self._assign(target, node.value)

    def visit_AnnAssign(self, node: ast.AnnAssign) -> None:
        self._visit_all((node.annotation, node.value))
        if node.value is not None or not isinstance(node.target, ast.Name):
            self._assign(node.target, node.value)

    def visit_AugAssign(self, node: ast.AugAssign) -> None:
        self.visit(node.value)
        if isinstance(node.target, ast.Name):
            path = self._lookup(node.target.id)
            if path:
                self._use(path, "uses")
        self._assign(node.target, None)

    def visit_NamedExpr(self, node: ast.NamedExpr) -> None:
        self.visit(node.value)
        self._assign(node.target, node.value)

    def visit_For(self, node: ast.For | ast.AsyncFor) -> None:
        self.visit(node.iter)
        self._assign(node.target, None)
        self._visit_all((*node.body, *node.orelse))

    visit_AsyncFor = visit_For

    def visit_With(self, node: ast.With | ast.AsyncWith) -> None:
        for item in node.items:
            self.visit(item.context_expr)
            if item.optional_vars is not None:
                self._assign(item.optional_vars, None)
        self._visit_all(node.body)

    visit_AsyncWith = visit_With

    def visit_ExceptHandler(self, node: ast.ExceptHandler) -> None:
        self._visit_all((node.type,))
        if node.name:
            self._bind(node.name, None)
        self._visit_all(node.body)

    def visit_Delete(self, node: ast.Delete) -> None:
        for target in node.targets:
            self._assign(target, None)

    def visit_Global(self, node: ast.Global) -> None:
        self.globals[-1].update(node.names)

    # scopes

    def _enter(self, names: Iterable[str]) -> None:
        self.scopes.append(dict.fromkeys(names))
        self.globals.append(set())

    def _leave(self) -> None:
        self.scopes.pop()
        self.globals.pop()

    @staticmethod
    def _parameters(args: ast.arguments) -> list[str]:
        every = [*args.posonlyargs, *args.args, *args.kwonlyargs, args.vararg, args.kwarg]
        return [a.arg for a in every if a is not None]

    def _function(self, node: ast.FunctionDef | ast.AsyncFunctionDef | ast.Lambda) -> None:
        """Decorators, defaults and annotations run where the function is defined; its body when it is called."""
        args = node.args
        self._visit_all((*args.defaults, *args.kw_defaults))
        if not isinstance(node, ast.Lambda):
            self._visit_all((*node.decorator_list, node.returns,
                             *(a.annotation for a in (*args.posonlyargs, *args.args, *args.kwonlyargs,
                                                      args.vararg, args.kwarg) if a is not None)))
            self._bind(node.name, None)  # the student's own definition shadows an import of that name
        self._enter(self._parameters(args))
        self._visit_all(node.body if isinstance(node.body, list) else [node.body])
        self._leave()

    visit_FunctionDef = visit_AsyncFunctionDef = visit_Lambda = _function

    def visit_ClassDef(self, node: ast.ClassDef) -> None:
        """Bases (`class MyHead(gptcourse.AttentionHead)`) are read before the class's own name is bound."""
        self._visit_all((*node.decorator_list, *node.bases, *(k.value for k in node.keywords)))
        self._enter(())
        self._visit_all(node.body)
        self._leave()
        self._bind(node.name, None)

    def _comprehension(self, node: ast.ListComp | ast.SetComp | ast.GeneratorExp | ast.DictComp) -> None:
        self._enter(())
        for generator in node.generators:
            self.visit(generator.iter)
            self._assign(generator.target, None)
            self._visit_all(generator.ifs)
        parts = (node.key, node.value) if isinstance(node, ast.DictComp) else (node.elt,)
        self._visit_all(parts)
        self._leave()

    visit_ListComp = visit_SetComp = visit_GeneratorExp = visit_DictComp = _comprehension

    # uses

    def visit_Name(self, node: ast.Name) -> None:
        if node.id == "__builtins__":
            self._use("__builtins__", "dynamic")
        if isinstance(node.ctx, ast.Load):
            path = self._lookup(node.id)
            if path:
                self._use(path, "uses")
            elif node.id in DYNAMIC_CALLS and not self._bound(node.id):  # called, or kept to be called later
                self._use(f"{node.id}()", "dynamic")

    def visit_Attribute(self, node: ast.Attribute) -> None:
        if node.attr in DYNAMIC_ATTRIBUTES:
            self._use(f".{node.attr}", "dynamic")
        path = self._path(node)
        if path:
            self._use(path, "uses")
        else:
            self.generic_visit(node)

    def visit_Call(self, node: ast.Call) -> None:
        builtin_import = isinstance(node.func, ast.Name) and node.func.id == "__import__" \
            and not self._bound("__import__")
        imports = builtin_import or self._path(node.func) in IMPORT_CALLS
        if imports and node.args and isinstance(node.args[0], ast.Constant) and isinstance(node.args[0].value, str):
            self._use(node.args[0].value, "imports")  # what it imports, besides the call the scan cannot follow
        if isinstance(node.func, ast.Name) and node.func.id == "getattr" and not self._bound("getattr") \
                and len(node.args) >= 2 and self._path(node.args[0]) and not isinstance(node.args[1], ast.Constant):
            self._use("getattr() with a computed name", "dynamic")
        path = self._path(node)
        if path:
            self._use(path, "uses")
            self._visit_all((*node.args[2:], *(k.value for k in node.keywords)))
            return
        self.generic_visit(node)


def _parse(source: str) -> ast.Module | None:
    """A cell's code as its kernel runs it, None if it is no Python: IPython first turns magics (`%time`, `%%capture`)
    and shell escapes (`!ls`) into calls of `get_ipython()`, so that one such line does not hide the cell's other
    lines from the scan."""
    try:
        return ast.parse(source)
    except SyntaxError:
        pass
    from IPython.core.inputtransformer2 import TransformerManager  # here: the student's kernel never scans

    try:
        return ast.parse(TransformerManager().transform_cell(source))
    except Exception:  # SyntaxError, or whatever IPython raised on input it cannot read: the kernel fails it too
        return None


def find_forbidden(cells: list[tuple[str, str, bool]], forbidden: dict[str, tuple[str, ...]]) -> list[Finding]:
    """Findings in `cells` = [(label, source, written by the student)], in notebook order.

    Instructor cells are read too (their imports bind names the student may use) but not reported. A path is a
    finding when it, or a module it passes through, is a reference; an import outside the allowlist is one too
    (`allowed_import`), once per package and cell.
    """
    roots = {name.split(".")[0] for names in forbidden.values() for name in names}
    table, by_name = reference_table(forbidden)

    @functools.cache
    def hit(path: str) -> tuple[str, tuple[str, ...]] | None:
        """(canonical name, pieces) of the reference `path` or one of its prefixes names, longest first."""
        parts = path.split(".")
        for cut in range(len(parts), 0, -1):
            prefix = ".".join(parts[:cut])
            obj = resolve(prefix, roots)
            if obj is not None and id(obj) in table:
                _, name, pieces = table[id(obj)]
                return name, tuple(sorted(pieces))
            if obj is None and prefix in by_name:
                return prefix, tuple(sorted(by_name[prefix]))
        return None

    @functools.cache
    def star_names(module_path: str) -> list[str]:
        """What `from module import *` binds: the module's `__all__`, else its public names."""
        module = resolve(module_path, roots)
        if module is None:
            return []
        names = getattr(module, "__all__", None)
        if not (isinstance(names, (list, tuple)) and all(isinstance(n, str) for n in names)):
            names = [n for n in dir(module) if not n.startswith("_")]
        return list(names)

    findings: list[Finding] = []
    aliases: dict[str, str | None] = {}
    for label, source, authored in cells:
        tree = _parse(source)
        if tree is None:
            continue  # it fails when it runs; nothing it names can be imported
        scanner = _Scanner(aliases, authored, star_names)
        scanner.visit(tree)
        seen: set[str] = set()
        for path, how in scanner.uses:
            if how in ("imports", "star") and not allowed_import(path):
                package = path.split(".")[0]
                if package not in seen:
                    seen.add(package)
                    findings.append(Finding(label, package, (), "not allowed"))
            if how == "dynamic" or any(path == p or path.startswith(p + ".") for p in DYNAMIC_PATHS):
                finding = Finding(label, path.lstrip(".") if how == "dynamic" else path, (), "dynamic")
            elif path.startswith(GRADER + ".") and path != f"{GRADER}.check":
                finding = Finding(label, path, (), "dynamic")
            elif how == "star":
                hits = [h for h in (hit(path), *(hit(f"{path}.{n}") for n in star_names(path))) if h]
                if not hits:
                    continue
                finding = Finding(label, f"{path}.*", tuple(sorted({p for _, ps in hits for p in ps})), "imports")
            else:
                found = hit(path)
                if found is None:
                    continue
                finding = Finding(label, found[0], found[1], how)
            if finding.name not in seen:
                seen.add(finding.name)
                findings.append(finding)
    return findings


# ---- 2. the run-time check of the object under test (in the student's kernel)


def reference_behind(obj: Any, names: Iterable[str], user_modules: Iterable[str] = ("__main__",)
                     ) -> tuple[str, str] | None:
    """(how, reference name) if `obj` is, subclasses, is an instance of, or wraps or calls one of the references
    `names`; None if none is found. `how` is one of HOW.

    Only the student's own functions and classes (defined in `user_modules`: a notebook's is `__main__`) are
    looked into, so the references' own code, and torch's, never count. Whatever the student's objects do when
    looked at (a raising `__getattr__`, a lying `__class__`), this returns.
    """
    table, _ = reference_table({"": tuple(names)}, import_missing=False)
    refs = {key: name for key, (_, name, _) in table.items()}
    return _safe(lambda: _search(obj, refs, frozenset(user_modules)), None) if refs else None


def _search(obj: Any, refs: dict[int, str], user: frozenset[str]) -> tuple[str, str] | None:
    """`reference_behind` on {id(reference): name}: the object itself and its classes first, then what it holds,
    breadth first (every object seen is kept alive, so that no id is reused during the search)."""
    if id(obj) in refs:
        return "is", refs[id(obj)]
    cls = obj if isinstance(obj, type) else type(obj)
    for base in _safe(lambda: cls.__mro__, ()):
        if id(base) in refs:
            return ("subclasses" if cls is obj else "is an instance of"), refs[id(base)]
    seen = {id(obj): obj}
    queue = deque([obj])
    while queue and len(seen) < MAX_VISITS:
        for neighbour in _safe(lambda: list(_neighbours(queue.popleft(), user)), []):
            if id(neighbour) in refs:
                return "wraps or calls", refs[id(neighbour)]
            if id(neighbour) not in seen:
                seen[id(neighbour)] = neighbour
                queue.append(neighbour)
    return None


def _safe(get: Callable[[], Any], default: Any) -> Any:
    try:
        return get()
    except Exception:  # the student's object raised while being looked at: there is nothing to see there
        return default


def _neighbours(x: Any, user: frozenset[str]) -> Iterator[Any]:
    """The objects `x` holds that a call of `x` may reach."""
    if isinstance(x, (types.ModuleType, str, bytes, int, float, complex, type(None))):
        return
    wrapped = _safe(lambda: getattr(x, "__wrapped__", None), None)  # functools.wraps, update_wrapper
    if wrapped is not None:
        yield wrapped
    if isinstance(x, (functools.partial, functools.partialmethod)):
        yield x.func
        yield from x.args[:MAX_ITEMS]
        yield from list((x.keywords or {}).values())[:MAX_ITEMS]
    elif isinstance(x, types.MethodType):
        yield x.__func__
        yield x.__self__
    elif isinstance(x, (staticmethod, classmethod)):
        yield x.__func__
    elif isinstance(x, property):
        yield from (f for f in (x.fget, x.fset, x.fdel) if f is not None)
    elif isinstance(x, (list, tuple, set, frozenset)):
        yield from list(x)[:MAX_ITEMS]
    elif isinstance(x, dict):
        yield from list(x.values())[:MAX_ITEMS]
    elif isinstance(x, type):
        yield from x.__mro__[1:]
        if x.__module__ in user:
            yield from list(vars(x).values())
    elif isinstance(x, types.FunctionType):
        if x.__module__ in user:
            yield from _function_references(x)
    else:
        yield type(x)
        if type(x).__module__ in user:
            yield from list(_safe(lambda: vars(x), {}).values())[:MAX_ITEMS]


def _function_references(fn: types.FunctionType) -> Iterator[Any]:
    """What a function's code can reach: its closure, its defaults, and each object along the global (or
    closure) attribute chains its bytecode loads (`gptcourse.model.causal_attention.attention` yields the module
    `gptcourse`, then `gptcourse.model`, ..., then the function)."""
    cells = dict(zip(fn.__code__.co_freevars, fn.__closure__ or (), strict=False))
    yield from (_safe(lambda c=c: c.cell_contents, None) for c in cells.values())
    yield from fn.__defaults__ or ()
    yield from (fn.__kwdefaults__ or {}).values()
    for deref, root, attrs in _load_chains(fn.__code__):
        if deref:
            if root not in cells:
                continue  # a local variable of the function that its inner function reads
            value = _safe(lambda cell=cells[root]: cell.cell_contents, None)
        elif root in fn.__globals__:
            value = fn.__globals__[root]
        else:
            continue  # a builtin, or a name not defined yet: nothing to follow
        for attr in attrs:
            yield value
            value = _safe(lambda v=value, a=attr: getattr(v, a), None)
            if value is None:
                break
        if value is not None:
            yield value


def _load_chains(code: types.CodeType) -> Iterator[tuple[bool, str, list[str]]]:
    """(read from a closure cell, root name, attribute names) for each `NAME.attr.attr...` the bytecode loads,
    in nested functions and comprehensions too."""
    chain: tuple[bool, str, list[str]] | None = None
    for instruction in dis.get_instructions(code):
        op = instruction.opname
        if op in ("LOAD_GLOBAL", "LOAD_NAME", "LOAD_DEREF", "LOAD_CLASSDEREF"):
            if chain:
                yield chain
            chain = (op != "LOAD_GLOBAL" and op != "LOAD_NAME", str(instruction.argval), [])
        elif op in ("LOAD_ATTR", "LOAD_METHOD") and chain:
            chain[2].append(str(instruction.argval))
        elif op not in ("CACHE", "PUSH_NULL", "EXTENDED_ARG", "NOP") and chain:
            yield chain
            chain = None
    if chain:
        yield chain
    for const in code.co_consts:
        if isinstance(const, types.CodeType):
            yield from _load_chains(const)


# ---- 3. the calls the student's code makes while a case runs (in the student's kernel)


def _callees(obj: Any) -> Iterator[Any]:
    """What a call of reference `obj` starts: a Python function's code object, each method's code of a class
    (building one runs its `__init__`), a module's functions and classes; a builtin itself."""
    if isinstance(obj, types.FunctionType):
        yield obj.__code__
    elif isinstance(obj, type):
        for value in list(vars(obj).values()):
            value = value.__func__ if isinstance(value, (staticmethod, classmethod)) else value
            functions = (value.fget, value.fset, value.fdel) if isinstance(value, property) else (value,)
            yield from (f.__code__ for f in functions if isinstance(f, types.FunctionType))
    elif isinstance(obj, types.BuiltinFunctionType):
        yield obj


def _bound_to(method: Any, descriptors: dict[str, list[tuple[Any, str]]]) -> tuple[Any, str] | None:
    """(descriptor, name) of the reference that the built-in bound method `method` (what a profile hook's c_call
    sees for `logits.log_softmax(1)`, and for `torch.Tensor.log_softmax(logits, 1)` too) is, if any: the method of
    that name which the type of its `__self__` finds, looked up statically (no code of that type runs)."""
    candidates = descriptors.get(getattr(method, "__name__", None))  # a built-in's own attribute: no student code
    if not candidates:
        return None
    owner = type(getattr(method, "__self__", None))  # type(), never the object's `__class__`, which can lie
    found = _safe(lambda: inspect.getattr_static(owner, method.__name__, None), None)
    return next((entry for entry in candidates if entry[0] is found), None)


@contextmanager
def calls_to(names: Iterable[str], user_modules: Iterable[str] = ("__main__",)) -> Iterator[list[str]]:
    """Inside `with calls_to(names) as called:`, `called` lists (once each, in order) the references `names`
    that code of `user_modules` calls directly; a profile hook, chained to any one already set, and removed on
    exit."""
    table, _ = reference_table({"": tuple(names)}, import_missing=False)
    callees = {id(callee): (callee, name) for obj, name, _ in table.values() for callee in _callees(obj)}
    descriptors: dict[str, list[tuple[Any, str]]] = {}  # a method's name -> (its descriptor, reference name)
    for obj, name, _ in table.values():
        if isinstance(obj, types.MethodDescriptorType):
            descriptors.setdefault(obj.__name__, []).append((obj, name))
    user = frozenset(user_modules)
    called: list[str] = []
    previous = sys.getprofile()

    def hook(frame: types.FrameType, event: str, arg: Any) -> None:
        if event == "call":
            found, caller = callees.get(id(frame.f_code)), frame.f_back
        elif event == "c_call":
            found, caller = callees.get(id(arg)) or _bound_to(arg, descriptors), frame
        else:
            found = caller = None
        if found is not None and caller is not None and caller.f_globals.get("__name__") in user \
                and found[1] not in called:
            called.append(found[1])
        if previous is not None:
            previous(frame, event, arg)

    sys.setprofile(hook if callees or descriptors else previous)
    try:
        yield called
    finally:
        sys.setprofile(previous)
