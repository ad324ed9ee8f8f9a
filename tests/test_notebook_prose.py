"""What the notebooks' prose, the README and the site's pages tell a learner to type exists.

Every ``distlab ...`` and ``flashcards ...`` command written in a markdown cell of a
``solutions/`` notebook (an inline code span or a line of a fenced block), in the
README and in the site's pages (``docs/*.md``) is parsed by the command's own argparse parser: an unknown subcommand or option
fails here, before a learner meets it. Nothing is run: parsing stops before the
command's work. A ``flashcards`` ``--notebook`` or ``--up-to`` value must name a notebook of the course.
"""

from __future__ import annotations

import contextlib
import io
import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

import nbformat
import pytest

from distlab import cli as distlab_cli
from flashcards import cli as flashcards_cli

ROOT = Path(__file__).resolve().parents[1]
NOTEBOOKS = sorted((ROOT / "solutions").glob("*/*.ipynb"))
NOTEBOOK_NAMES = sorted(p.parent.name for p in NOTEBOOKS)
PARSERS = {"distlab": distlab_cli.build_parser, "flashcards": flashcards_cli.build_parser}

FENCE = re.compile(r"```[^\n]*\n(.*?)```", re.DOTALL)
INLINE = re.compile(r"`([^`\n]+)`")


def commands_in_markdown(text: str) -> list[str]:
    """The ``distlab``/``flashcards`` command lines in a piece of markdown."""
    found = []
    for block in FENCE.findall(text):
        for line in block.splitlines():
            found += _commands_in(line.strip().removeprefix("$ "))
    for span in INLINE.findall(FENCE.sub("", text)):
        found += _commands_in(span.strip())
    return found


def _commands_in(line: str) -> list[str]:
    """Each ``&&``/``;``-separated part of a shell line that starts with one of our programs."""
    line = line.split(" #", 1)[0]
    parts = re.split(r"\s*(?:&&|;|\|\|)\s*", line)
    return [p for p in parts if p.split(" ", 1)[0] in PARSERS]


def _sources() -> list[tuple[str, str]]:
    sources = [("README.md", (ROOT / "README.md").read_text())]
    sources += [(f"docs/{p.name}", p.read_text()) for p in sorted((ROOT / "docs").glob("*.md"))]
    for path in NOTEBOOKS:
        nb = nbformat.read(path, as_version=4)
        for cell in nb.cells:
            if cell.cell_type == "markdown":
                sources.append((f"{path.parent.name} cell {cell.get('id')}", cell.source))
    return sources


COMMANDS = sorted(
    {(where, command) for where, text in _sources() for command in commands_in_markdown(text)}
)


def parse_problem(command: str) -> str | None:
    """Why ``command`` would not parse (argparse's own message), or None when it parses.

    A command named without options (``distlab plan``, ``flashcards``) refers to the
    command, not to a run of it: it must exist, so its ``--help`` must parse."""
    program, *argv = shlex.split(command)
    if len(argv) <= 1:
        argv.append("--help")
    parser = PARSERS[program]()
    err = io.StringIO()
    try:
        with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
            args = parser.parse_args(argv)
    except SystemExit as stop:
        return None if stop.code == 0 else err.getvalue().strip().splitlines()[-1]
    for option in ("notebook", "up_to") if program == "flashcards" else ():
        value = getattr(args, option, None)
        if value is not None and not _names_a_notebook(value, prefix_only=option == "up_to"):
            return f"--{option.replace('_', '-')} {value!r} names no notebook of {NOTEBOOK_NAMES}"
    return None


def _names_a_notebook(value: str, *, prefix_only: bool) -> bool:
    if prefix_only:  # --up-to NN
        return any(name.startswith(f"{value}-") for name in NOTEBOOK_NAMES)
    return value.partition("#")[0] in NOTEBOOK_NAMES


def test_the_prose_names_commands():
    """The scan finds what it should (it would pass vacuously on an empty list)."""
    assert len(COMMANDS) >= 10, COMMANDS
    programs = {command.split()[0] for _, command in COMMANDS}
    assert programs == {"distlab", "flashcards"}, COMMANDS


@pytest.mark.parametrize("where,command", COMMANDS)
def test_every_command_in_the_prose_exists(where, command):
    problem = parse_problem(command)
    assert problem is None, f"{where}: `{command}`: {problem}"


def test_the_check_catches_what_learners_met():
    """Issue 27: `flashcards review` does not exist; an unknown option and a notebook
    that does not exist are caught too; the real commands pass."""
    text = (
        "Review with `flashcards review`, or `flashcards drill --notebok 11`.\n"
        "```bash\nflashcards drill --notebook 13-nothing && distlab plan --model 70B\n```\n"
        "Also `distlab.calc.scaling` (a module, not a command) and `distlab grade 02`."
    )
    commands = commands_in_markdown(text)
    assert commands == [
        "flashcards drill --notebook 13-nothing",
        "distlab plan --model 70B",
        "flashcards review",
        "flashcards drill --notebok 11",
        "distlab grade 02",
    ]
    problems = [parse_problem(c) for c in commands]
    assert "invalid choice: 'review'" in problems[2]
    assert "unrecognized arguments: --notebok" in problems[3]
    assert "names no notebook" in problems[0]
    assert "required" in problems[1]  # plan also needs a cluster and a global batch
    assert problems[4] is None
    assert parse_problem("distlab plan") is None  # named, not run: --help parses
    assert parse_problem("flashcards") is None
    assert parse_problem("flashcards drill --notebook 11-scaling-and-compilers#flops") is None
    assert parse_problem("flashcards drill --up-to 02") is None
    assert "names no notebook" in parse_problem("flashcards drill --up-to 99")


@pytest.mark.parametrize("columns", [None, "130"])
def test_cli_tables_print_at_full_width_in_a_notebook(columns):
    """Issue 27: a Jupyter kernel sets FORCE_COLOR=1, so rich took the cell's pipe for a
    terminal and TERM=dumb then squeezed `distlab plan`'s table into 80 columns ("TP/P…",
    wrapped rows). A pipe gets the table's full width, as plain text."""
    env = {k: v for k, v in os.environ.items() if k not in ("COLUMNS", "NO_COLOR")}
    env.update(FORCE_COLOR="1", TERM="dumb", **({"COLUMNS": columns} if columns else {}))
    plan = "plan --model 70B --cluster dgx-h100 --nodes 32 --global-batch 1024 --top 3"
    command = [sys.executable, "-m", "distlab.cli", *plan.split()]
    out = subprocess.run(command, capture_output=True, text=True, check=True, env=env).stdout
    assert "…" not in out and "\x1b[" not in out, out
    header = next(line for line in out.splitlines() if "TP/PP/DP" in line)
    for name in ("ZeRO", "recompute", "schedule", "GB/GPU", "bubble", "comm", "step", "MFU"):
        assert f" {name} " in header, header
    rows = [line for line in out.splitlines() if re.match(r"│ [123] │", line)]
    assert len(rows) == 3 and all("interleaved v=" in row and " s │" in row for row in rows), out
    assert len(header) > 80
