"""Which facts of the seed documents each course notebook teaches (issue 17).

    python benchmarks/seed_coverage.py            # the tables
    python benchmarks/seed_coverage.py --strict   # exit 1 if an anchor names no notebook or heading

The course was written from five seed documents (interview questions and a flashcard deck) that
are not part of this repository. ``benchmarks/data/seed_facts.yaml`` is the course's own list of
their items: every numbered question and card, a one-line gist, the notebook sections that teach
it (``"NN-folder#heading-slug"``, or a bare ``"NN-folder"``), and, where the seed was wrong, what
the course says instead. This script checks every anchor against the Markdown headings of the
notebooks in ``solutions/`` (slugs as the flashcard deck writes them:
:func:`flashcards.course_order.section_anchor`) and prints

1. per notebook, how many seed items it teaches;
2. per seed file, how many of its items some notebook teaches;
3. the share of all seed items taught, now and once the notebooks being written exist;
4. the items whose seed claim the course corrects;
5. the items no notebook teaches, and why.

An anchor into a folder that ``solutions/`` does not have is a *missing notebook* when no
existing notebook has its number (a notebook not written yet) and an *unknown notebook* when one
does (a misspelt folder). Both, and a heading the notebook lacks, are errors under ``--strict``.
"""

from __future__ import annotations

import argparse
import re
import sys
import textwrap
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

import yaml

from distlab import grading
from flashcards.course_order import notebook_sections
from flashcards.model import SLUG

ROOT = Path(__file__).resolve().parents[1]
DATA = ROOT / "benchmarks" / "data" / "seed_facts.yaml"
_FOLDER = re.compile(r"\d\d-[a-z0-9]+(?:-[a-z0-9]+)*")

MISSING_NOTEBOOK = "missing notebook"
UNKNOWN_NOTEBOOK = "unknown notebook"
MISSING_HEADING = "missing heading"


@dataclass(frozen=True)
class SeedItem:
    """One numbered question or card of a seed file, and the sections that teach it."""

    seed: str
    number: str
    gist: str
    taught_by: tuple[str, ...]
    corrected: str | None = None
    why: str | None = None

    @property
    def label(self) -> str:
        """``"004 #18"``: the seed file's number and the item's number in it."""
        return f"{self.seed[:3]} #{self.number}"


@dataclass(frozen=True)
class AnchorProblem:
    item: SeedItem
    anchor: str
    kind: str  # MISSING_NOTEBOOK, UNKNOWN_NOTEBOOK or MISSING_HEADING

    @property
    def folder(self) -> str:
        return self.anchor.partition("#")[0]

    def __str__(self) -> str:
        return f"{self.item.label}: {self.kind}: {self.anchor}"


def _fail(where: str, problem: str) -> ValueError:
    return ValueError(f"seed facts, {where}: {problem}")


def _check_anchor_syntax(where: str, anchor: object) -> str:
    folder, hash_, section = anchor.partition("#") if isinstance(anchor, str) else ("", "", "")
    if not _FOLDER.fullmatch(folder) or (hash_ and not SLUG.fullmatch(section)):
        raise _fail(
            where,
            f"anchor {anchor!r} is not 'NN-folder' or 'NN-folder#heading-slug' "
            "(lower case a-z, 0-9 and '-')",
        )
    return anchor


def _item(seed: str, raw: object) -> SeedItem:
    if not isinstance(raw, dict) or "n" not in raw:
        raise _fail(seed, f"an item must be a mapping with a number 'n', got {raw!r}")
    where = f"{seed} item {raw['n']!r}"
    unknown = set(raw) - {"n", "gist", "taught_by", "corrected", "why"}
    if unknown:
        raise _fail(
            where, f"unknown keys {sorted(unknown)}; allowed: n, gist, taught_by, corrected, why"
        )
    gist, taught_by = raw.get("gist"), raw.get("taught_by")
    if not isinstance(gist, str) or not gist.strip():
        raise _fail(where, f"gist must be a non-empty line, got {gist!r}")
    if not isinstance(taught_by, list):
        raise _fail(where, f"taught_by must be a list of anchors ([] if none), got {taught_by!r}")
    if not taught_by and not raw.get("why"):
        raise _fail(where, "taught_by is empty: say why no notebook teaches it ('why: ...')")
    for key in ("corrected", "why"):
        if key in raw and (not isinstance(raw[key], str) or not raw[key].strip()):
            raise _fail(where, f"{key} must be non-empty text, got {raw[key]!r}")
    anchors = tuple(_check_anchor_syntax(where, a) for a in taught_by)
    return SeedItem(
        seed, str(raw["n"]), gist.strip(), anchors, raw.get("corrected"), raw.get("why")
    )


def load_items(path: str | Path = DATA) -> list[SeedItem]:
    """Every item of the seed list at ``path``, validated: numbers unique per seed file, and as
    many items as the file's ``count`` says (so an item left out is noticed)."""
    data = yaml.safe_load(Path(path).read_text(encoding="utf-8"))
    if not isinstance(data, dict) or not isinstance(data.get("seeds"), list):
        raise _fail(str(path), "expected a mapping with a list 'seeds'")
    items: list[SeedItem] = []
    for seed in data["seeds"]:
        name = seed.get("file") if isinstance(seed, dict) else None
        if not isinstance(name, str) or not isinstance(seed.get("items"), list):
            raise _fail(str(path), f"each seed needs 'file' and a list 'items', got {seed!r}")
        these = [_item(name, raw) for raw in seed["items"]]
        repeated = [n for n, k in Counter(i.number for i in these).items() if k > 1]
        if repeated:
            raise _fail(name, f"item numbers {repeated} appear more than once")
        if seed.get("count") != len(these):
            raise _fail(name, f"count is {seed.get('count')!r} but {len(these)} items are listed")
        items += these
    return items


def course_headings(root: str | Path = ROOT) -> dict[str, set[str]]:
    """``folder -> heading slugs`` for every notebook folder of ``solutions/``."""
    root = Path(root)
    return {
        folder: {s for nb in grading.source_notebooks(root, folder) for s in notebook_sections(nb)}
        for folder in grading.assignment_names(root)
    }


def anchor_problem(anchor: str, headings: dict[str, set[str]]) -> str | None:
    """What is wrong with ``anchor`` in a course with these ``headings``, or None."""
    folder, _, section = anchor.partition("#")
    if folder not in headings:
        numbers = {f[:2] for f in headings}
        return UNKNOWN_NOTEBOOK if folder[:2] in numbers else MISSING_NOTEBOOK
    if section and section not in headings[folder]:
        return MISSING_HEADING
    return None


def check(items: list[SeedItem], headings: dict[str, set[str]]) -> list[AnchorProblem]:
    return [
        AnchorProblem(item, anchor, kind)
        for item in items
        for anchor in item.taught_by
        if (kind := anchor_problem(anchor, headings)) is not None
    ]


@dataclass(frozen=True)
class Coverage:
    """What the seed list says, against the notebooks that exist.

    ``per_notebook``: folder -> items with at least one anchor into it (valid or not);
    ``per_seed``: seed file -> (items taught by an existing heading, items taught once the
    missing notebooks exist, all items); ``taught_now`` / ``taught_planned``: the same over all.
    """

    items: list[SeedItem]
    per_notebook: dict[str, int]
    per_seed: dict[str, tuple[int, int, int]]
    taught_now: int
    taught_planned: int

    @property
    def total(self) -> int:
        return len(self.items)


def coverage(items: list[SeedItem], headings: dict[str, set[str]]) -> Coverage:
    def now(item: SeedItem) -> bool:
        return any(anchor_problem(a, headings) is None for a in item.taught_by)

    per_notebook = Counter(
        folder for item in items for folder in {a.partition("#")[0] for a in item.taught_by}
    )
    per_seed = {}
    for seed in dict.fromkeys(i.seed for i in items):
        these = [i for i in items if i.seed == seed]
        per_seed[seed] = (sum(map(now, these)), sum(bool(i.taught_by) for i in these), len(these))
    return Coverage(
        items,
        dict(sorted(per_notebook.items())),
        per_seed,
        taught_now=sum(map(now, items)),
        taught_planned=sum(bool(i.taught_by) for i in items),
    )


def _percent(part: int, whole: int) -> str:
    return f"{100 * part / whole:5.1f} %" if whole else "    - "


def _tables(cov: Coverage, headings: dict[str, set[str]]) -> list[str]:
    lines = ["Seed items taught, per notebook (an item counts once per notebook)", ""]
    lines.append(f"  {'notebook':40} {'items':>5}")
    for folder in sorted(set(headings) | set(cov.per_notebook)):
        state = "" if folder in headings else "   (not written yet)"
        lines.append(f"  {folder:40} {cov.per_notebook.get(folder, 0):5d}{state}")
    lines += [
        "",
        "Per seed file: taught by a notebook now / once the missing ones exist / items",
        "",
    ]
    for seed, (now, planned, total) in cov.per_seed.items():
        lines.append(
            f"  {seed:28} {now:3d} {_percent(now, total)}   {planned:3d} {_percent(planned, total)}"
            f"   of {total:3d}"
        )
    share_now = _percent(cov.taught_now, cov.total).strip()
    share_planned = _percent(cov.taught_planned, cov.total).strip()
    lines += [
        "",
        f"Seed items taught by some notebook: {cov.taught_now} of {cov.total} ({share_now}) now, "
        + f"{cov.taught_planned} ({share_planned}) once the missing notebooks exist",
    ]
    return lines


def _corrections_and_gaps(cov: Coverage) -> list[str]:
    corrected = [i for i in cov.items if i.corrected]
    lines = ["", f"Seed claims the course corrects ({len(corrected)})"]
    for item in corrected:
        lines.append(f"  {item.label:9} {item.gist}")
        lines += textwrap.wrap(
            item.corrected,
            96,
            initial_indent=" " * 12,
            subsequent_indent=" " * 12,
            break_on_hyphens=False,
        )
    untaught = [i for i in cov.items if not i.taught_by]
    lines += ["", f"Seed items no notebook teaches ({len(untaught)})"]
    lines += [f"  {i.label:9} {i.gist}  ({i.why})" for i in untaught]
    return lines


def _problems(problems: list[AnchorProblem]) -> list[str]:
    if not problems:
        return []
    lines = ["", f"Anchors that name no notebook or heading ({len(problems)})"]
    waiting = Counter(p.folder for p in problems if p.kind == MISSING_NOTEBOOK)
    lines += [f"  {MISSING_NOTEBOOK}: {folder} ({n} anchors)" for folder, n in waiting.items()]
    lines += [f"  {p}" for p in problems if p.kind != MISSING_NOTEBOOK]
    return lines


def report(cov: Coverage, problems: list[AnchorProblem], headings: dict[str, set[str]]) -> str:
    """The five parts listed in the module docstring, then the anchors that are wrong."""
    return "\n".join(_tables(cov, headings) + _corrections_and_gaps(cov) + _problems(problems))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--strict", action="store_true", help="exit 1 if an anchor is wrong")
    parser.add_argument("--data", type=Path, default=DATA, help="the seed list (YAML)")
    parser.add_argument("--root", type=Path, default=ROOT, help="the course checkout")
    args = parser.parse_args(argv)
    items = load_items(args.data)
    headings = course_headings(args.root)
    problems = check(items, headings)
    print(report(coverage(items, headings), problems, headings))
    return 1 if args.strict and problems else 0


if __name__ == "__main__":
    sys.exit(main())
