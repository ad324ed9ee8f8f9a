"""Which cells a test cell needs: the names each code cell defines and uses.

To run exercise K alone, the grader reads every code cell once with :mod:`ast` and
notes the names it *defines* (assignments, ``def``, ``class``, imports, loop
and ``with`` targets, objects it mutates) and the names it *uses* (anywhere,
function bodies included, since a function runs later with the globals it
names). Starting from the exercise's test cells, :func:`needed_cells` walks back: each
name a needed cell uses pulls in the latest earlier cell that defines it. Cells that
define nothing but set up the process (seeds, threads, folders, environment
variables) are always kept, because results may depend on them.

Used by :mod:`distlab.grading.exercise` (grade one exercise),
:mod:`distlab.grading.mutants` (grade wrong answers) and :mod:`distlab.grading.kernel`
(:func:`leading_imports`: what a kernel may import before the first cell runs). Pure :mod:`ast`: IPython is used,
when it is installed, only to translate magics before parsing.
"""

from __future__ import annotations

import ast
from dataclasses import dataclass

SETUP_CALLS = frozenset(
    {
        "manual_seed",
        "seed",
        "set_num_threads",
        "makedirs",
        "mkdir",
        "chdir",
        "filterwarnings",
        "simplefilter",
        "set_printoptions",
        "use_deterministic_algorithms",
        "setdefault",
        "putenv",
    }
)


MUTATORS = frozenset(
    {"append", "extend", "insert", "update", "add", "setdefault", "pop", "remove", "clear",
     "discard", "sort", "reverse", "load_state_dict"}
)  # fmt: skip


@dataclass(frozen=True)
class CellNames:
    """What one code cell defines and uses at the notebook's top level."""

    defines: frozenset[str]
    uses: frozenset[str]
    setup: bool  # defines nothing, and calls something that configures the process
    imports: frozenset[str] = frozenset()  # the names of ``defines`` that an import binds


def _python(source: str) -> ast.Module | None:
    """The cell as Python (IPython magics and shell escapes translated), or None."""
    try:
        from IPython.core.inputtransformer2 import TransformerManager

        source = TransformerManager().transform_cell(source)
    except ImportError:  # pragma: no cover - IPython comes with Jupyter
        pass
    try:
        return ast.parse(source)
    except SyntaxError:
        return None


def _bound(target: ast.AST) -> set[str]:
    """Names a store target binds or mutates (``a``, ``a, b``, ``a.x``, ``a[i]`` -> a)."""
    if isinstance(target, ast.Name):
        return {target.id}
    if isinstance(target, (ast.Tuple, ast.List)):
        return set().union(*(_bound(t) for t in target.elts)) if target.elts else set()
    if isinstance(target, ast.Starred):
        return _bound(target.value)
    if isinstance(target, (ast.Attribute, ast.Subscript)):
        return _bound(target.value)
    return set()


def _top_level(body: list[ast.stmt]):
    """The statements run at the top level: into if/for/while/try/with, not into def/class."""
    for node in body:
        yield node
        if isinstance(node, (ast.If, ast.For, ast.AsyncFor, ast.While)):
            yield from _top_level(node.body)
            yield from _top_level(node.orelse)
        elif isinstance(node, (ast.With, ast.AsyncWith)):
            yield from _top_level(node.body)
        elif isinstance(node, ast.Try):
            for block in (node.body, node.orelse, node.finalbody):
                yield from _top_level(block)
            for handler in node.handlers:
                yield from _top_level(handler.body)


def _imported_by(node: ast.stmt) -> set[str]:
    """The names an import statement binds (``import a.b`` binds ``a``)."""
    if isinstance(node, (ast.Import, ast.ImportFrom)):
        return {(a.asname or a.name).split(".")[0] for a in node.names if a.name != "*"}
    return set()


def _defined_by(node: ast.stmt) -> set[str]:
    if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
        return {node.name}
    if isinstance(node, (ast.Import, ast.ImportFrom)):
        return _imported_by(node)
    if isinstance(node, ast.Assign):
        return set().union(*(_bound(t) for t in node.targets))
    if isinstance(node, (ast.AnnAssign, ast.AugAssign)):
        return _bound(node.target)
    if isinstance(node, (ast.For, ast.AsyncFor)):
        return _bound(node.target)
    if isinstance(node, (ast.With, ast.AsyncWith)):
        return set().union(set(), *(_bound(i.optional_vars) for i in node.items if i.optional_vars))
    if isinstance(node, ast.Expr) and isinstance(node.value, ast.Call):
        func = node.value.func  # x.append(...), x.update(...): mutates x
        if (
            isinstance(func, ast.Attribute)
            and isinstance(func.value, ast.Name)
            and func.attr in MUTATORS
        ):
            return {func.value.id}
    return set()


def _calls(tree: ast.AST) -> set[str]:
    names = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Call):
            func = node.func
            names.add(func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", ""))
    return names


def cell_names(source: str) -> CellNames:
    """What a code cell defines and uses (and which of its names an import binds); a cell that
    does not parse uses and defines nothing."""
    tree = _python(source)
    if tree is None:
        return CellNames(frozenset(), frozenset(), False)
    defines = set().union(set(), *(_defined_by(n) for n in _top_level(tree.body)))
    imports = set().union(set(), *(_imported_by(n) for n in _top_level(tree.body)))
    for node in ast.walk(tree):  # walrus at the top level, and `global x` inside functions
        if isinstance(node, ast.NamedExpr):
            defines |= _bound(node.target)
        elif isinstance(node, ast.Global):
            defines |= set(node.names)
    uses = _free_names(tree, defines)
    setup = not defines and bool(_calls(tree) & SETUP_CALLS)
    if any(isinstance(n, ast.Assign) and _is_environ(n) for n in ast.walk(tree)):
        setup = True
    return CellNames(frozenset(defines), frozenset(uses), setup, frozenset(imports))


class _FreeNames(ast.NodeVisitor):
    """Names a cell reads before it binds them, visiting in evaluation order (the value of
    an assignment before its targets, a loop's iterable before its variable, a
    comprehension's ``for`` before its element). A function or lambda body reads globals
    when it is called: its names count unless the function binds them itself."""

    def __init__(self):
        self.bound: set[str] = set()
        self.free: set[str] = set()
        self.deferred: set[str] = set()

    def visit_Name(self, node: ast.Name) -> None:
        if isinstance(node.ctx, ast.Load):
            if node.id not in self.bound:
                self.free.add(node.id)
        else:
            self.bound.add(node.id)

    def visit_Assign(self, node: ast.Assign) -> None:
        self.visit(node.value)
        for target in node.targets:
            self.visit(target)

    def visit_AnnAssign(self, node: ast.AnnAssign) -> None:
        self.visit(node.annotation)  # evaluated at the top level, like the value
        if node.value is not None:
            self.visit(node.value)
        self.visit(node.target)

    def visit_AugAssign(self, node: ast.AugAssign) -> None:
        self.visit(node.value)
        for name in _bound(node.target):
            if name not in self.bound:
                self.free.add(name)

    def visit_For(self, node: ast.For) -> None:
        self.visit(node.iter)
        self.visit(node.target)
        for statement in node.body + node.orelse:
            self.visit(statement)

    visit_AsyncFor = visit_For

    def _comprehension(self, node, *elements) -> None:
        for generator in node.generators:
            self.visit(generator)
        for element in elements:
            self.visit(element)

    def visit_ListComp(self, node) -> None:
        self._comprehension(node, node.elt)

    visit_SetComp = visit_GeneratorExp = visit_ListComp

    def visit_DictComp(self, node) -> None:
        self._comprehension(node, node.key, node.value)

    def visit_comprehension(self, node: ast.comprehension) -> None:
        self.visit(node.iter)
        self.visit(node.target)
        for condition in node.ifs:
            self.visit(condition)

    def _function(self, node) -> None:
        for default in node.args.defaults + node.args.kw_defaults + _annotations(node):
            if default is not None:
                self.visit(default)
        for decorator in getattr(node, "decorator_list", []):
            self.visit(decorator)
        self.deferred |= enclosing_reads(node)
        if hasattr(node, "name"):
            self.bound.add(node.name)

    visit_FunctionDef = visit_AsyncFunctionDef = visit_Lambda = _function

    def visit_ExceptHandler(self, node: ast.ExceptHandler) -> None:
        if node.type is not None:
            self.visit(node.type)
        if node.name:  # `except E as error:` binds error for the handler's body
            self.bound.add(node.name)
        for statement in node.body:
            self.visit(statement)

    def visit_ClassDef(self, node: ast.ClassDef) -> None:
        for base in node.bases + node.decorator_list:
            self.visit(base)
        for statement in node.body:
            self.visit(statement)
        self.bound.add(node.name)


_FUNCTIONS = (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)


def _annotations(node) -> list[ast.expr]:
    """A function's parameter and return annotations: evaluated where the ``def`` runs (a
    stub ``def f(model: nn.Module)`` needs ``nn`` defined, though its body reads nothing)."""
    if isinstance(node, ast.Lambda):
        return []
    found = [a.annotation for a in ast.walk(node.args) if isinstance(a, ast.arg) and a.annotation]
    return found + ([node.returns] if node.returns is not None else [])


_COMPREHENSIONS = (ast.ListComp, ast.SetComp, ast.GeneratorExp, ast.DictComp)


def enclosing_reads(node: ast.AST) -> set[str]:
    """The names a function, lambda, class body or comprehension reads from the scopes
    around it, by Python's scope rules: a parameter, or a name the body assigns, imports or
    defines, is its own, in nested functions too (a nested ``def worker(rank)`` reads no
    ``rank`` from the notebook). Methods do not see the names their class body binds."""
    if isinstance(node, _FUNCTIONS):
        params = {a.arg for a in ast.walk(node.args) if isinstance(a, ast.arg)}
        return _scope_reads(node.body if isinstance(node.body, list) else [node.body], params)
    if isinstance(node, ast.ClassDef):
        return _scope_reads(node.body, set(), class_body=True)
    _, *rest = node.generators  # a comprehension: its first iterable is read outside
    parts = [g.iter for g in rest] + [c for g in node.generators for c in g.ifs]
    parts += [node.key, node.value] if isinstance(node, ast.DictComp) else [node.elt]
    return _scope_reads(parts, set().union(*(_bound(g.target) for g in node.generators)))


def _scope_reads(nodes: list[ast.AST], params: set[str], class_body: bool = False) -> set[str]:
    """Names read in one scope (``nodes``, not entering nested scopes) or by the scopes
    nested in it, that this scope does not bind itself."""
    bound, declared_global = set(params), set()
    reads, nested = set(), set()
    stack = list(nodes)
    while stack:
        node = stack.pop()
        if isinstance(node, (*_FUNCTIONS, ast.ClassDef, *_COMPREHENSIONS)):
            nested |= enclosing_reads(node)
            if isinstance(node, _FUNCTIONS):  # defaults, annotations, decorators run out here
                stack += [d for d in node.args.defaults + node.args.kw_defaults if d]
                stack += _annotations(node)
            if isinstance(node, ast.ClassDef):
                stack += node.bases + [k.value for k in node.keywords]
            if isinstance(node, _COMPREHENSIONS):
                stack.append(node.generators[0].iter)
            else:
                stack += getattr(node, "decorator_list", [])
            if hasattr(node, "name"):
                bound.add(node.name)
            continue
        if isinstance(node, ast.Name):
            (reads if isinstance(node.ctx, ast.Load) else bound).add(node.id)
        elif isinstance(node, (ast.Import, ast.ImportFrom)):
            bound |= {(a.asname or a.name).split(".")[0] for a in node.names}
        elif isinstance(node, ast.ExceptHandler) and node.name:
            bound.add(node.name)
        elif isinstance(node, (ast.Global, ast.Nonlocal)):
            declared_global |= set(node.names)
        stack.extend(ast.iter_child_nodes(node))
    bound -= declared_global  # `global x`: x is the notebook's, read and written there
    own = (reads | declared_global) - bound
    return own | nested if class_body else own | (nested - bound)


def _free_names(tree: ast.Module, defines: set[str]) -> frozenset[str]:
    visitor = _FreeNames()
    visitor.visit(tree)
    return frozenset(visitor.free | (visitor.deferred - defines))


def _is_environ(node: ast.Assign) -> bool:
    return any(
        isinstance(t, ast.Subscript) and "environ" in ast.unparse(t.value) for t in node.targets
    )


def _is_matplotlib_magic(node: ast.stmt) -> bool:
    """``%matplotlib ...`` as IPython translates it: ``get_ipython().run_line_magic(...)``."""
    if not (isinstance(node, ast.Expr) and isinstance(node.value, ast.Call)):
        return False
    call = node.value
    return (
        isinstance(call.func, ast.Attribute)
        and call.func.attr == "run_line_magic"
        and bool(call.args)
        and isinstance(call.args[0], ast.Constant)
        and call.args[0].value == "matplotlib"
    )


def leading_imports(source: str) -> str:
    """The cell's first statements, up to the first one that is neither an import nor a
    ``%matplotlib`` line, as Python (magics translated); "" if there are none. Running
    them runs nothing but imports (and the plotting backend's choice)."""
    tree = _python(source)
    if tree is None:
        return ""
    leading = []
    for node in tree.body:
        if not (isinstance(node, (ast.Import, ast.ImportFrom)) or _is_matplotlib_magic(node)):
            break
        leading.append(node)
    return ast.unparse(ast.Module(body=leading, type_ignores=[])) if leading else ""


def needed_cells(sources: list[str], targets: list[int]) -> list[int]:
    """Indexes of the cells to run, in order, so that the ``targets`` cells run as in the
    whole notebook: every setup cell before the last target, and for every name a needed
    cell uses, the latest earlier cell that defines it."""
    names = [cell_names(s) for s in sources]
    setup = [i for i in range(max(targets)) if names[i].setup]
    needed = set(targets) | set(setup)
    pending = sorted(needed)
    while pending:
        index = pending.pop()
        for name in names[index].uses:
            for earlier in range(index - 1, -1, -1):
                if name in names[earlier].defines:
                    if earlier not in needed:
                        needed.add(earlier)
                        pending.append(earlier)
                    break
    return sorted(needed)
