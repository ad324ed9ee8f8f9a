"""One site page per library area, made from the docstrings (Sphinx autodoc).

Each area (:data:`AREAS`) is one or more packages; its page documents every module in them,
found by walking the packages, so a new module appears without editing this file. The
docstrings already state each formula and its source; the page shows them as written.
"""

from __future__ import annotations

import importlib.util
import pkgutil
from dataclasses import dataclass
from pathlib import Path

from distlab.site.files import write_if_changed


@dataclass(frozen=True)
class Area:
    """A page: its file name, title, one-line summary and the packages or modules it shows."""

    slug: str
    title: str
    summary: str
    packages: tuple[str, ...]


AREAS = (
    Area("core", "Core: units, checks, ranks, schedules", "the torch-free ground floor",
         ("distlab.core", "distlab.progress", "distlab.withheld")),
    Area("launch", "Launching processes and the tiny models", "`distlab.run`, `init`, `%%ranks`, "
         "MLP and GPT", ("distlab.launch", "distlab.ranks", "distlab.models")),
    Area("collectives", "Collective algorithms", "ring, tree, halving-doubling, hierarchical, "
         "all-to-all: schedules and their runners", ("distlab.collectives",)),
    Area("sim", "Simulator", "topologies, alpha-beta costs, replays, the algorithm registry",
         ("distlab.sim",)),
    Area("calc", "Calculators", "memory, bubbles, FLOPs, communication volumes, the planner",
         ("distlab.calc",)),
    Area("placement", "Placement and scheduling", "clusters, the placer, the job scheduler",
         ("distlab.placement",)),
    Area("parallel", "Parallelism on real processes", "DDP, ZeRO, FSDP, tensor, sequence, "
         "context and pipeline parallelism, MoE, compose, checkpoints", ("distlab.parallel",)),
    Area("viz", "Figures", "the plots and widgets the notebooks draw", ("distlab.viz",)),
    Area("flashcards", "Flashcards", "the deck, FSRS scheduling, the store, the drill",
         ("flashcards",)),
    Area("grading", "Grading", "`distlab grade` and `distlab.check`: nbgrader underneath",
         ("distlab.grading",)),
    Area("commands", "The `distlab` command and this site", "the subcommands and the site build",
         ("distlab.commands", "distlab.cli", "distlab.site")),
)  # fmt: skip

#: modules that are not library code (a configuration file Sphinx executes)
SKIPPED = frozenset({"distlab.site.conf"})


def modules_of(package: str) -> list[str]:
    """``package`` and every module under it, in name order (a module alone: itself).

    Read from the files, importing nothing below ``package`` (autodoc imports them later)."""
    spec = importlib.util.find_spec(package)
    if spec is None:
        raise ValueError(f"no module named {package!r} to document")
    found = [package, *_below(spec.submodule_search_locations or [], package)]
    return sorted(n for n in found if n not in SKIPPED and not n.endswith("__main__"))


def _below(folders: list[str], package: str) -> list[str]:
    """Every module in the package ``folders`` (``package``'s), subpackages walked."""
    found = []
    for info in pkgutil.iter_modules(folders, prefix=f"{package}."):
        found.append(info.name)
        if info.ispkg:
            found += _below([str(Path(info.module_finder.path) / info.name.rpartition(".")[2])],
                            info.name)  # fmt: skip
    return found


def area_page(area: Area) -> str:
    """The MyST Markdown of one area's page."""
    lines = [f"# {area.title}", "", f"{area.summary[0].upper()}{area.summary[1:]}.", ""]
    for package in area.packages:
        for name in modules_of(package):
            lines += [f"## `{name}`", "", "```{automodule} " + name, ":members:", "```", ""]
    return "\n".join(lines)


def index_page() -> str:
    """The library's landing page: one line per area."""
    lines = [
        "# The library",
        "",
        (
            "Every number in the notebooks comes from `distlab`. These pages are its "
            "docstrings, area by area, ground floor first: each calculator states its formula "
            "and the paper, section or table it comes from."
        ),
        "",
    ]
    lines += [f"- [{a.title}]({a.slug}.md): {a.summary}" for a in AREAS]
    lines += ["", "```{toctree}", ":hidden:", "", *[a.slug for a in AREAS], "```", ""]
    return "\n".join(lines)


def write_api_pages(out: Path) -> list[Path]:
    """Write ``index.md`` and one page per area into ``out``."""
    written = [write_if_changed(out / "index.md", index_page())]
    written += [write_if_changed(out / f"{a.slug}.md", area_page(a)) for a in AREAS]
    return written
