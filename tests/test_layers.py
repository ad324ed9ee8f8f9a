"""The package map: every import of ``distlab`` and ``flashcards`` runs down the floors.

The floors, ground first (the site page docs/inside.md, "What is inside", shows the same map):

0. ``distlab.core`` (units, argument checks, the rank layout, both schedule types, the
   course layout), ``distlab.progress``, ``distlab.withheld``: pure Python, no torch;
1. ``distlab.launch``, ``distlab.ranks``, ``distlab.models``, ``distlab.collectives``:
   processes (and ranks kept alive between notebook cells), models, collective algorithms
   (schedule builders, and the executors that run them on torch);
2. ``distlab.sim``: topologies, closed-form costs, replays of both schedule kinds, and the
   algorithm registry that joins a schedule builder, its cost and its runner;
3. ``distlab.calc``: calculators and the planner;
4. ``distlab.placement``: clusters, placer, scheduler;
5. ``distlab.parallel``: DDP, ZeRO, FSDP, TP/SP/CP, pipelines, MoE, 3D, checkpoints, in
   families that stand on floors of their own (:data:`FAMILY_FLOORS`);
6. ``distlab.viz``: figures;
7. ``flashcards``;
8. ``distlab.grading``;
9. ``distlab.commands``, ``distlab.cli`` and the ``distlab`` package itself.

A module may import from its own floor or below, never above, and no two modules may
import each other, directly or round a loop. An import written inside a function is
allowed only when it keeps torch (or numpy, or matplotlib) out of a module that must load
without them; each such import is listed below by name, with that reason. Run this file
alone to see the map it checks: ``python tests/test_layers.py``.
"""

from __future__ import annotations

import ast
import sys
from collections import defaultdict
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PACKAGES = ("distlab", "flashcards")

#: floor -> module prefixes (a module belongs to the longest prefix that names it)
FLOORS = {
    0: ("distlab.core", "distlab.progress", "distlab.withheld"),
    1: ("distlab.launch", "distlab.ranks", "distlab.models", "distlab.collectives"),
    2: ("distlab.sim",),
    3: ("distlab.calc",),
    4: ("distlab.placement",),
    5: ("distlab.parallel",),
    6: ("distlab.viz",),
    7: ("flashcards",),
    8: ("distlab.grading",),
    9: ("distlab.commands", "distlab.cli", "distlab"),
}

#: the families of ``distlab.parallel`` (floor 5), each a folder, on floors of their own:
#: a family imports only families on lower floors (inside a family, modules import each
#: other freely, without loops). ``""`` is the package face, ``distlab.parallel`` itself,
#: with ``moved`` (the module paths from before the families).
FAMILY_FLOORS = {
    0: ("comm",),
    1: ("precision", "context", "pipeline"),
    2: ("zero", "tensor"),
    3: ("data", "moe", "checkpoint", "sharding"),
    4: ("compose",),
    5: ("moved",),
    6: ("",),
}

_TORCH_RUNNER = (
    "the module's schedule builders are pure Python (the simulator, the calculators and the "
    "plots import them); its runner loads torch through the api only when a collective runs"
)

#: (importing module, imported module): why the import waits until a function runs
DEFERRED = {
    ("distlab.commands.bench", "distlab.collectives.agree"): _TORCH_RUNNER,
    ("distlab.collectives.all_to_all", "distlab.collectives.api"): _TORCH_RUNNER,
    ("distlab.collectives.halving_doubling", "distlab.collectives.api"): _TORCH_RUNNER,
    ("distlab.collectives.hierarchical", "distlab.collectives.api"): _TORCH_RUNNER,
    ("distlab.collectives.naive", "distlab.collectives.api"): _TORCH_RUNNER,
    ("distlab.collectives.ring", "distlab.collectives.api"): _TORCH_RUNNER,
    ("distlab.collectives.tree", "distlab.collectives.api"): _TORCH_RUNNER,
    ("distlab.grading.kernel", "distlab.grading.execute"): (
        "the exercise child starts the kernel first and loads nbgrader (which execute "
        "imports) while the kernel imports torch"
    ),
}


def module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def modules() -> dict[str, Path]:
    return {module_name(p): p for pkg in PACKAGES for p in sorted((ROOT / pkg).rglob("*.py"))}


def floor(module: str) -> int:
    best = max(
        (
            prefix
            for prefixes in FLOORS.values()
            for prefix in prefixes
            if module == prefix or module.startswith(prefix + ".")
        ),
        key=len,
    )
    return next(f for f, prefixes in FLOORS.items() if best in prefixes)


def imports(known: dict[str, Path]):
    """Yield ``(module, imported module, deferred, line)`` for every import of our packages."""
    for name, path in known.items():
        package = name if path.name == "__init__.py" else name.rpartition(".")[0]
        yield from _imports_in(ast.parse(path.read_text()), name, package, known, False)


def _imports_in(node, name, package, known, deferred):
    for child in ast.iter_child_nodes(node):
        inside = deferred or isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef))
        if isinstance(child, ast.Import):
            for alias in child.names:
                yield name, _resolve(alias.name, known), deferred, child.lineno
        elif isinstance(child, ast.ImportFrom):
            base = child.module or ""
            if child.level:
                up = package.split(".")[: len(package.split(".")) - (child.level - 1)]
                base = ".".join(up + ([child.module] if child.module else []))
            for alias in child.names:
                target = f"{base}.{alias.name}"
                yield (
                    name,
                    _resolve(target if target in known else base, known),
                    deferred,
                    child.lineno,
                )
        yield from _imports_in(child, name, package, known, inside)


def _resolve(target: str, known) -> str | None:
    """The module of ours that ``target`` names (its longest known prefix), or None."""
    parts = target.split(".")
    if parts[0] not in PACKAGES:
        return None
    while parts and ".".join(parts) not in known:
        parts.pop()
    return ".".join(parts) or None


def edges():
    known = modules()
    return [(a, b, d, line) for a, b, d, line in imports(known) if b is not None and b != a]


def loops(pairs) -> list[list[str]]:
    """Strongly connected groups of more than one module (Tarjan)."""
    graph = defaultdict(set)
    for a, b in pairs:
        graph[a].add(b)
    index, low, stack, on, found = {}, {}, [], set(), []
    sys.setrecursionlimit(10000)

    def visit(v):
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        for w in graph[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            group = []
            while True:
                w = stack.pop()
                on.discard(w)
                group.append(w)
                if w == v:
                    break
            if len(group) > 1:
                found.append(sorted(group))

    for v in list(graph):
        if v not in index:
            visit(v)
    return found


def _package(module: str) -> str:
    parts = module.split(".")
    return ".".join(parts[:2]) if parts[0] == "distlab" and len(parts) > 1 else parts[0]


def test_no_import_runs_up_the_floors():
    upward = [
        f"{a} (floor {floor(a)}) line {line} imports {b} (floor {floor(b)})"
        for a, b, _, line in edges()
        if floor(b) > floor(a)
    ]
    assert not upward, "imports that run up the package map:\n" + "\n".join(upward)


def test_no_module_loops():
    found = loops((a, b) for a, b, _, _ in edges())
    assert not found, "modules that import each other round a loop:\n" + "\n".join(
        " -> ".join(group) for group in found
    )


def test_no_package_loops():
    pairs = {(_package(a), _package(b)) for a, b, _, _ in edges() if _package(a) != _package(b)}
    found = loops(pairs)
    assert not found, "packages that import each other:\n" + "\n".join(map(str, found))


def test_deferred_imports_are_only_the_listed_ones():
    seen = {(a, b) for a, b, deferred, _ in edges() if deferred}
    unlisted = sorted(seen - set(DEFERRED))
    assert not unlisted, (
        "imports inside functions that are not listed in DEFERRED (move them to the top of "
        "the module, or list them with the reason):\n"
        + "\n".join(f"{a} imports {b}" for a, b in unlisted)
    )
    stale = sorted(set(DEFERRED) - seen)
    assert not stale, f"DEFERRED lists imports that no longer exist: {stale}"


def test_every_module_has_a_floor():
    for name in modules():
        assert floor(name) in FLOORS


def family(module: str) -> str:
    """``distlab.parallel.zero.fsdp`` -> ``"zero"``; ``distlab.parallel`` -> ``""``."""
    return module.split(".")[2] if module.count(".") >= 2 else ""


def family_floor(name: str) -> int:
    return next(f for f, names in FAMILY_FLOORS.items() if name in names)


def test_parallel_modules_live_in_families():
    """No flat room: beside its families, ``distlab/parallel`` holds only its face."""
    loose = [
        name
        for name, path in modules().items()
        if name.startswith("distlab.parallel.")
        and path.parent == ROOT / "distlab" / "parallel"
        and family(name) != "moved"
    ]
    assert not loose, f"modules of distlab.parallel outside any family: {loose}"
    for name in modules():
        if name.startswith("distlab.parallel"):
            assert any(family(name) in names for names in FAMILY_FLOORS.values()), (
                f"{name} is in family {family(name)!r}, which FAMILY_FLOORS does not place"
            )


def test_families_import_only_lower_families():
    upward = [
        f"{a} ({family(a)}, floor {family_floor(family(a))}) line {line} imports {b} "
        f"({family(b)}, floor {family_floor(family(b))})"
        for a, b, _, line in edges()
        if a.startswith("distlab.parallel")
        and b.startswith("distlab.parallel")
        and family(a) != family(b)
        and family_floor(family(b)) >= family_floor(family(a))
    ]
    assert not upward, "imports between families that do not run down:\n" + "\n".join(upward)


def test_each_family_says_what_is_inside():
    """A family's docstring names each of its modules (what it is, in reading order)."""
    folder = ROOT / "distlab" / "parallel"
    for package in sorted(p.parent for p in folder.glob("*/__init__.py")):
        doc = ast.get_docstring(ast.parse((package / "__init__.py").read_text())) or ""
        unnamed = [
            p.stem
            for p in sorted(package.glob("*.py"))
            if p.stem != "__init__" and p.stem not in doc
        ]
        assert not unnamed, f"{package.name}/__init__.py does not name {unnamed}"


def _print_map() -> None:
    by_floor = defaultdict(list)
    for name, path in modules().items():
        by_floor[floor(name)].append((name, len(path.read_text().splitlines())))
    for f in sorted(FLOORS):
        lines = sum(n for _, n in by_floor[f])
        print(f"floor {f}: {', '.join(FLOORS[f])}  ({len(by_floor[f])} modules, {lines} lines)")
    by_family = defaultdict(list)
    for name, path in modules().items():
        if name.startswith("distlab.parallel"):
            by_family[family(name)].append(len(path.read_text().splitlines()))
    for f in sorted(FAMILY_FLOORS):
        for name in FAMILY_FLOORS[f]:
            sizes = by_family[name]
            label = f"distlab.parallel.{name}" if name else "distlab.parallel (its face)"
            print(f"  family floor {f}: {label}  ({len(sizes)} modules, {sum(sizes)} lines)")
    all_edges = edges()
    print(f"imports: {len(all_edges)}, inside functions: {sum(d for _, _, d, _ in all_edges)}")


def test_pure_floors_load_without_torch():
    """What the deferred imports buy: the calculators, the simulator, the schedule builders,
    the placer and the ``distlab`` command start without loading torch."""
    import subprocess

    code = (
        "import sys, distlab.core, distlab.collectives, distlab.sim, distlab.calc, "
        "distlab.placement, distlab.cli; "
        "assert 'torch' not in sys.modules, 'torch was imported'"
    )
    subprocess.run([sys.executable, "-c", code], check=True, cwd=ROOT)


if __name__ == "__main__":
    _print_map()
