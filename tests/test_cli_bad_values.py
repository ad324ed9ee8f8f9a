"""Every ``distlab`` and ``flashcards`` subcommand, every option, given bad values: no traceback.

Each case calls ``main(argv)`` in-process (no subprocess per case). Every case starts from a
command that runs (``BASE``: the required options with good values), so the bad value is the
only thing wrong and reaches the code that uses it instead of being stopped by argparse for a
missing option. A case passes when the command either runs (exit 0: the value is acceptable,
e.g. ``--gamma 0``) or refuses with exit status 2 and a one-line ``error:`` message that names
the option and the value, and no Python traceback reaches the user.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import os

import pytest

from distlab.cli import build_parser as distlab_parser
from distlab.cli import main as distlab_main
from flashcards.cli import build_parser as flashcards_parser
from flashcards.cli import main as flashcards_main

BAD_VALUES = ["-1", "0", "nan", "inf", "1e30", "not-a-number", "MISSING_FILE"]
#: positional arguments a subcommand needs before its options can be tried
#: (good ones, so that an option's bad value is the only thing wrong; ``grade`` keeps a missing
#: notebook because grading a real one takes seconds per case)
POSITIONALS = {"grade": ["MISSING_FILE"], "export-anki": ["OUT_FILE.apkg"], "export-json": ["OUT_FILE"],
               "import-json": ["HISTORY_FILE"], "unsuspend": ["REVIEWED_CARD"]}  # fmt: skip
#: a command that runs, per subcommand: its required options with good values, and small
#: sizes so that a run which accepts a value stays tiny. An option under test replaces its
#: own entry and any entry it is mutually exclusive with.
BASE = {"bench": {"--world-sizes": "1", "--sizes": "4KiB", "--iters": "1"},
        "schedule": {"--jobs": "3", "--nodes": "2"},
        "memory": {"--params": "1e9"},
        "bubble": {"--stages": "2", "--micro-batches": "4"},
        "plan": {"--layers": "2", "--hidden": "64", "--heads": "4", "--cluster": "dgx-h100",
                 "--nodes": "1", "--global-batch": "8"}}  # fmt: skip
#: base options that go only with another: dropped with it (``--hidden`` is refused without ``--layers``)
COMPANIONS = {"--layers": ("--hidden", "--heads")}
#: (command, option) whose error is right but about something else, so need not name the value:
#: any ``unsuspend --db`` path is a new, empty database in which the card has no history
ELSEWHERE = {("unsuspend", "--db")}
#: commands whose options the sweep does not reach: ``grade`` stops at its missing notebook
#: (grading a real one takes seconds per case); only "no traceback, one line" is checked
NOT_REACHED = {"grade"}
#: known gaps (none left): a case whose error misses the option or the value. Strict xfail: a fix
#: makes its case pass, which fails the run until it is removed.
GAPS: dict = {}  # fmt: skip
#: values that must be refused, not run: nan by any number option, and these
MUST_REFUSE = {
    ("sim", "--world-size", "0"),
    ("schedule", "--repair-h", "-1"),
    ("sim", "--gamma", "inf"),
}
PROGRAMS = {"distlab": (distlab_parser, distlab_main), "flashcards": (flashcards_parser, flashcards_main)}  # fmt: skip


def _subparsers(build) -> dict[str, argparse.ArgumentParser]:
    return next(a for a in build()._actions if isinstance(a, argparse._SubParsersAction)).choices


def _cases():
    for program, (build, _) in PROGRAMS.items():
        for command, parser in _subparsers(build).items():
            for action in parser._actions:
                if action.nargs == 0 or not action.option_strings:
                    continue  # flags take no value; positionals are in POSITIONALS
                option = action.option_strings[0]
                for value in BAD_VALUES:
                    gap = GAPS.get((command, option, value))
                    marks = [pytest.mark.xfail(strict=True, reason=gap)] if gap else []
                    yield pytest.param(program, command, option, value, marks=marks,
                                       id=f"{program}-{command}-{option}={value}")  # fmt: skip
            for value in BAD_VALUES if command in POSITIONALS else ():
                yield pytest.param(program, command, None, value, id=f"{program}-{command}-{value}")


def _takes_number(program: str, command: str, option: str | None) -> bool:
    """Whether ``option`` is read as a number (argparse ``int``/``float`` or a
    :func:`distlab.core.checks.cli` type)."""
    parser = _subparsers(PROGRAMS[program][0])[command]
    action = next((a for a in parser._actions if option in a.option_strings), None)
    kind = getattr(action, "type", None)
    return kind in (int, float) or getattr(kind, "__module__", "") == "distlab.core.checks"


def base_options(program: str, command: str, option: str | None) -> list[str]:
    """``BASE[command]`` without ``option`` and the options it excludes, as argv words."""
    parser = _subparsers(PROGRAMS[program][0])[command]
    excluded = {option}
    for group in parser._mutually_exclusive_groups:
        strings = {s for action in group._group_actions for s in action.option_strings}
        if option in strings:
            excluded |= strings
    excluded |= {c for flag in excluded for c in COMPANIONS.get(flag, ()) if c != option}
    return [
        w for flag, v in BASE.get(command, {}).items() if flag not in excluded for w in (flag, v)
    ]


def run_cli(program: str, argv: list[str]) -> tuple[int, str]:
    """``main(argv)`` in-process: (exit status, stderr)."""
    err = io.StringIO()
    with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
        try:
            code = PROGRAMS[program][1](argv)
        except SystemExit as exc:  # argparse's own refusal
            code = exc.code
    return code, err.getvalue()


def names_value(message: str, value: str) -> bool:
    """Whether ``message`` shows ``value`` as typed, as Python prints the number, or (a path)
    by its file name."""
    shown = {value, os.path.basename(value) or value}
    with contextlib.suppress(ValueError, OverflowError):
        shown |= {repr(float(value)), str(int(float(value)))}
    return any(s in message for s in shown)


def names_option(message: str, option: str) -> bool:
    """Whether ``message`` names ``option``: ``--world-sizes``, ``world_sizes`` or ``world size``."""
    name = option.lstrip("-").removesuffix("s")
    return any(
        s in message.lower() for s in (option, name, name.replace("-", "_"), name.replace("-", " "))
    )


@pytest.fixture(scope="module")
def cards_db(tmp_path_factory):
    """One throwaway card database for every case: the deck is loaded into it once."""
    return str(tmp_path_factory.mktemp("cards") / "cards.sqlite3")


@pytest.fixture(scope="module")
def reviewed_card(cards_db):
    """A card with one review in ``cards_db``: what ``flashcards unsuspend`` accepts."""
    from flashcards.session import DrillSession

    session = DrillSession(None, cards_db)
    card = session.current
    session.rate(3)
    return card.slug


@pytest.fixture(scope="module")
def history_file(tmp_path_factory):
    """A review history that ``flashcards import-json`` accepts (an empty store's export)."""
    from flashcards.history import export_json
    from flashcards.store import Store

    folder = tmp_path_factory.mktemp("history")
    path = folder / "history.json"
    export_json(Store(str(folder / "empty.sqlite3")), path)
    return str(path)


@pytest.mark.parametrize("program,command,option,value", list(_cases()))
def test_bad_value_gives_one_line_error(
    program, command, option, value, tmp_path, monkeypatch, cards_db, history_file, reviewed_card
):
    monkeypatch.setenv("DISTLAB_FLASHCARDS_DB", cards_db)
    monkeypatch.setattr("sys.stdin", io.StringIO(""))  # a drill that runs meets end of input
    monkeypatch.chdir(tmp_path)
    files = {"MISSING_FILE": str(tmp_path / "missing.json"), "OUT_FILE": str(tmp_path / "out"),
             "OUT_FILE.apkg": str(tmp_path / "out.apkg"), "HISTORY_FILE": history_file,
             "REVIEWED_CARD": reviewed_card}  # fmt: skip
    positionals = [files.get(p, p) for p in POSITIONALS.get(command, [])]
    value = files.get(value, value)
    if option is None:
        argv = [command, value]
    else:
        argv = [command, *positionals, option, value]
    argv += base_options(program, command, option)
    code, message = run_cli(program, argv)
    assert "Traceback" not in message, message
    assert code in (0, 2), (code, message)
    if (command, option, value) in MUST_REFUSE or (value == "nan" and _takes_number(
        program, command, option)):  # fmt: skip
        assert code == 2, f"{argv} was accepted"
    if code == 2:
        lines = [line for line in message.splitlines() if "error" in line]
        assert len(lines) == 1, message
        if command in NOT_REACHED or (command, option) in ELSEWHERE:
            return
        assert names_value(lines[0], value), f"{argv}: the error does not show {value!r}: {message}"
        if option is not None:
            assert names_option(lines[0], option), (
                f"{argv}: the error does not name {option}: {message}"
            )


@pytest.mark.parametrize("command", ["memory", "bubble", "plan", "bench", "schedule"])
def test_base_command_runs(command):
    """Each base command is valid on its own, so a refusal in the sweep is the bad value's."""
    assert run_cli("distlab", [command, *base_options("distlab", command, None)]) == (0, "")


def test_params_inf_reaches_the_planner():
    """The case that used to pass only because argparse stopped at a missing option."""
    argv = ["plan", "--params", "inf", *base_options("distlab", "plan", "--params")]
    assert "--layers" not in argv and "--global-batch" in argv
    code, message = run_cli("distlab", argv)
    assert code == 2 and "--params" in message and "inf" in message, message


# -- "No input hangs or traces back": sizes, orders, card files, review stores, paths, tags ----
def run_cli_out(program: str, argv: list[str]) -> tuple[int, str, str]:
    """``main(argv)`` in-process: (exit status, stdout, stderr)."""
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stderr(err), contextlib.redirect_stdout(out):
        try:
            code = PROGRAMS[program][1](argv)
        except SystemExit as exc:
            code = exc.code
    return code, out.getvalue(), err.getvalue()


def one_error_line(message: str) -> str:
    lines = [line for line in message.splitlines() if "error" in line]
    assert len(lines) == 1 and "Traceback" not in message, message
    return lines[0]


def test_bubble_with_huge_counts_answers_in_closed_form(monkeypatch):
    """p = 1000 used to replay three schedules for > 40 s, p = 10^11 for ever: the closed
    forms answer at once, and the replay column is left out past its limit."""
    import json

    from distlab.calc import pipeline

    schedule_ops = pipeline.schedule_ops

    def bounded(stages, micro_batches, *, schedule, virtual_stages):
        slots = stages * micro_batches * virtual_stages
        assert stages <= 64 and slots <= 8_192, f"distlab bubble built {stages} x {slots} slots"
        return schedule_ops(stages, micro_batches, schedule=schedule, virtual_stages=virtual_stages)

    monkeypatch.setattr(pipeline, "schedule_ops", bounded)
    p, m = 99_999_999_999, 8
    for argv in (["--stages", str(p), "--micro-batches", "8"],
                 ["--stages", "4", "--micro-batches", "8", "--virtual-stages", str(p)]):  # fmt: skip
        code, out, err = run_cli_out("distlab", ["bubble", *argv, "--json"])
        assert (code, err) == (0, ""), err
        rows = json.loads(out)["rows"]
        assert rows[-1]["bubble_counted_from_schedule"] is None
    code, out, _ = run_cli_out("distlab", ["bubble", "--stages", str(p), "--micro-batches", "8", "--json"])  # fmt: skip
    assert json.loads(out)["rows"][0]["bubble_of_total"] == (p - 1) / (m + p - 1)
    code, out, _ = run_cli_out("distlab", ["bubble", "--stages", "4", "--micro-batches", "8"])
    assert code == 0 and out.count("27.27%") == 4  # gpipe and 1f1b: formula and replay agree
    code, out, _ = run_cli_out("distlab", ["bubble", "--stages", "1000", "--micro-batches", "8"])
    assert code == 0 and "64 stages or 8,192 slots" in out


@pytest.mark.parametrize("order", ["tp-pp", "pp-tp-dp"])
def test_place_refuses_a_partial_order(order):
    code, err = run_cli("distlab", ["place", "--order", order])
    line = one_error_line(err)
    missing = ", ".join(d for d in ("tp", "cp", "ep", "dp", "pp") if d not in order.split("-"))
    assert code == 2 and "--order" in line and f"order {order!r} leaves out {missing}" in line


def test_place_refuses_a_degree_above_the_largest_world_size():
    code, err = run_cli("distlab", ["place", "--tp", "99999999999"])
    line = one_error_line(err)
    assert code == 2 and "tp=99999999999 is more than 262,144" in line, line


@pytest.mark.timeout(30)
def test_flashcards_list_refuses_an_alias_bomb(tmp_path):
    """ "Billion laughs": 9^10 leaves once expanded; the loader used to walk them for minutes."""
    lines = ["topic: bomb", "title: Bomb", "l0: &l0 [lol, lol, lol, lol, lol, lol, lol, lol, lol]"]
    lines += [f"l{i}: &l{i} [{', '.join([f'*l{i - 1}'] * 9)}]" for i in range(1, 10)]
    path = tmp_path / "bomb.yaml"
    path.write_text("\n".join([*lines, "cards: *l9", ""]))
    code, err = run_cli("flashcards", ["list", "--deck", str(path), "--db", str(tmp_path / "r.db")])
    line = one_error_line(err)
    assert code == 2 and str(path) in line and "may not use anchors or aliases" in line, line


def test_flashcards_names_a_review_store_that_is_not_sqlite(tmp_path, monkeypatch):
    garbage = tmp_path / "reviews.db"
    garbage.write_bytes(bytes(range(256)) * 8)
    monkeypatch.setenv("DISTLAB_FLASHCARDS_DB", str(garbage))
    for command in (["list"], ["stats"], ["export-json", str(tmp_path / "h.json")]):
        code, err = run_cli("flashcards", command)
        line = one_error_line(err)
        assert code == 2 and str(garbage) in line and "$DISTLAB_FLASHCARDS_DB" in line, line
        assert "not a SQLite database" in line and "move it away" in line
    assert garbage.read_bytes() == bytes(range(256)) * 8


def test_export_anki_refuses_a_missing_folder(tmp_path):
    folder = tmp_path / "nonexistent-dir"
    code, err = run_cli("flashcards", ["export-anki", str(folder / "x.apkg"), "--db", str(tmp_path / "r.db")])  # fmt: skip
    line = one_error_line(err)
    assert code == 2 and f"the folder {folder} does not exist" in line, line
    assert not folder.exists()


@pytest.mark.parametrize("command", ["list", "export-anki", "drill", "stats"])
def test_unknown_tag_is_refused_with_the_known_tags(command, tmp_path):
    argv = [command, *([str(tmp_path / "d.apkg")] if command == "export-anki" else []),
            "--db", str(tmp_path / "r.db"), "--tag", "colectives"]  # fmt: skip
    code, err = run_cli("flashcards", argv)
    line = one_error_line(err)
    assert code == 2 and "unknown tag 'colectives' (did you mean 'collectives'?)" in line, line
    assert "tags in this deck: 3d-placement, advanced, basic" in line
    code, err = run_cli("flashcards", [*argv[:-1], "no-such-tag"])
    assert code == 2 and "unknown tag 'no-such-tag': no card of this deck has it" in err
