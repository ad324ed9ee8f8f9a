"""Every ``distlab`` and ``flashcards`` subcommand, every option, given bad values: no traceback.

Each case calls ``main(argv)`` in-process (no subprocess per case). A case passes when the
command either runs (exit 0: the value was acceptable, e.g. ``--gamma 0``) or refuses with exit
status 2 and a one-line ``error:`` message, and no Python traceback reaches the user.
"""

from __future__ import annotations

import argparse
import contextlib
import io

import pytest

from distlab.cli import build_parser as distlab_parser
from distlab.cli import main as distlab_main
from flashcards.cli import build_parser as flashcards_parser
from flashcards.cli import main as flashcards_main

BAD_VALUES = ["-1", "0", "nan", "inf", "1e30", "not-a-number", "MISSING_FILE"]
#: positional arguments a subcommand needs before its options can be tried
POSITIONALS = {"grade": ["MISSING_FILE"], "export-anki": ["OUT_FILE"], "export-json": ["OUT_FILE"],
               "import-json": ["MISSING_FILE"], "unsuspend": ["no-such-card"]}  # fmt: skip
#: options added to every case unless it tests them, so a run that accepts a value stays tiny
TINY = {"bench": {"--world-sizes": "1", "--sizes": "4KiB", "--iters": "1"},
        "schedule": {"--jobs": "3", "--nodes": "2"}}  # fmt: skip
PROGRAMS = {"distlab": (distlab_parser, distlab_main), "flashcards": (flashcards_parser, flashcards_main)}  # fmt: skip


def _cases():
    for program, (build, _) in PROGRAMS.items():
        sub = next(a for a in build()._actions if isinstance(a, argparse._SubParsersAction))
        for command, parser in sub.choices.items():
            for action in parser._actions:
                if action.nargs == 0 or not action.option_strings:
                    continue  # flags take no value; positionals are in POSITIONALS
                for value in BAD_VALUES:
                    yield pytest.param(program, command, action.option_strings[0], value,
                                       id=f"{program}-{command}-{action.option_strings[0]}={value}")  # fmt: skip
            for value in BAD_VALUES if command in POSITIONALS else ():
                yield pytest.param(program, command, None, value, id=f"{program}-{command}-{value}")


@pytest.fixture(scope="module")
def cards_db(tmp_path_factory):
    """One throwaway card database for every case: the deck is loaded into it once."""
    return str(tmp_path_factory.mktemp("cards") / "cards.sqlite3")


@pytest.mark.parametrize("program,command,option,value", list(_cases()))
def test_bad_value_gives_one_line_error(
    program, command, option, value, tmp_path, monkeypatch, cards_db
):
    monkeypatch.setenv("DISTLAB_FLASHCARDS_DB", cards_db)
    monkeypatch.chdir(tmp_path)
    files = {"MISSING_FILE": str(tmp_path / "missing.json"), "OUT_FILE": str(tmp_path / "out")}
    positionals = [files.get(p, p) for p in POSITIONALS.get(command, [])]
    if option is None:
        argv = [command, files.get(value, value)]
    else:
        argv = [command, *positionals, option, files.get(value, value)]
    if program == "distlab":
        tiny = TINY.get(command, {})
        argv += [word for flag, v in tiny.items() if flag != option for word in (flag, v)]
    err = io.StringIO()
    with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
        try:
            code = PROGRAMS[program][1](argv)
        except SystemExit as exc:  # argparse's own refusal
            code = exc.code
    message = err.getvalue()
    assert "Traceback" not in message, message
    assert code in (0, 2), (code, message)
    if code == 2:
        lines = [line for line in message.splitlines() if "error" in line]
        assert len(lines) == 1, message
