"""Copies from older releases (issue 36 §2): what a release records, what changed since a copy's
release, grading such a copy, ``distlab course upgrade`` and ``distlab course start``.

The fixtures in ``tests/data/older-releases/`` are learners' copies as they stood at earlier
commits (the released notebook of that commit with its solution cells filled in from
``solutions/`` of the same commit, outputs stripped; see the README there): 08 from before
its exercises used ``withheld`` (the copy the issue graded 0/7), 00 and 13 with changed
exercises, 03 with the same exercises as today. Only the two tests marked slow run a kernel.
"""

from __future__ import annotations

import copy
import shutil
from pathlib import Path

import nbformat
import pytest

from distlab import cli
from distlab.core.course import CONFIG_FILE, assignment_names, find_course_root, released_notebook
from distlab.grading.cells import grade_id_of, is_graded
from distlab.grading.release import (
    RELEASE_KEY,
    STUB_LINES,
    checksum,
    compare,
    release_of,
    stamp,
)
from distlab.grading.resolve import resolve_notebook
from distlab.grading.upgrade import carry, release_notes

ROOT = find_course_root()
OLDER = Path(__file__).parent / "data" / "older-releases"
FIXTURES = {path.name.rsplit("-", 1)[0]: path for path in sorted(OLDER.glob("*.ipynb"))}
#: what compare() names for each fixture: exercise title -> words its line holds
CHANGED = {
    "00-launching": {
        "Pass a token around the ring": "its test changed",
        "Shard a dataset like DistributedSampler": "its test changed",
    },
    "03-algorithms-and-cost": {},
    "08-pipeline-parallelism": {
        "1F1B schedule as data": "its test changed",
        "Measure the bubble of a real run": "its test changed",
        "Micro-batches for a 10 % bubble": "its test changed",
    },
    "13-sharded-matmuls-and-overlap": {"Gather first or reduce after": "its starting code changed"},
}


def _read(path: Path):
    return nbformat.read(path, as_version=4)


def _released(assignment: str):
    return _read(released_notebook(ROOT, assignment))


def _cell(nb, grade_id: str):
    return next(c for c in nb.cells if grade_id_of(c) == grade_id)


def _solutions(nb) -> dict[str, str]:
    return {
        grade_id_of(c): c.source for c in nb.cells if c.metadata.get("nbgrader", {}).get("solution")
    }


# ----------------------------------------------------------- what a release records ---
@pytest.mark.parametrize("assignment", assignment_names(ROOT))
def test_every_released_notebook_records_its_release(assignment):
    nb = _released(assignment)
    record = nb.metadata.get("distlab", {}).get(RELEASE_KEY)
    assert record == stamp(nb), (
        f"course/{assignment} records another release than its cells make (or none): run "
        f"`nbgrader generate_assignment {assignment} --force`"
    )
    assert record["cells"] == [c.id for c in nb.cells] and len(record["id"]) == 12


def test_the_checksum_is_nbgraders():
    """release.checksum, written out so that `distlab grade` never imports nbgrader, gives what
    nbgrader stored in every released cell; the stub lines are the config's code stub."""
    from nbgrader.utils import compute_checksum

    for assignment in assignment_names(ROOT):
        for cell in _released(assignment).cells:
            if grade_id_of(cell):
                stored = cell.metadata["nbgrader"]["checksum"]
                assert checksum(cell) == compute_checksum(cell) == stored, grade_id_of(cell)
    config = (ROOT / CONFIG_FILE).read_text(encoding="utf-8")
    assert repr("\n".join(STUB_LINES)).strip("'") in config


# ------------------------------------------------------------------ what changed ---
def test_the_current_release_is_current_solved_or_not():
    released = _released("08-pipeline-parallelism")
    solved = copy.deepcopy(released)
    _cell(solved, "smallest-m").source = "def smallest_micro_batches(p, target, v=1):\n    return 1"
    for learner in (released, solved):
        comparison = compare(learner, released)
        assert comparison.current and comparison.changes == []
        assert release_notes(comparison, "x.ipynb") == []


@pytest.mark.parametrize("assignment", sorted(CHANGED))
def test_an_older_copy_names_each_exercise_that_changed(assignment):
    older, released = _read(FIXTURES[assignment]), _released(assignment)
    comparison = compare(older, released)
    assert not comparison.current and release_of(older) is None
    changed = {c.exercise: c.what for c in comparison.changes}
    assert set(changed) == set(CHANGED[assignment]), changed
    for title, words in CHANGED[assignment].items():
        assert words in changed[title] and "\n" not in changed[title], changed[title]
    notes = release_notes(comparison, FIXTURES[assignment])
    assert "made before releases were recorded" in notes[0]
    assert notes[-1].endswith(f"distlab course upgrade {FIXTURES[assignment]}")
    if not CHANGED[assignment]:
        assert "exercises are as in your copy" in notes[1]


def test_each_kind_of_change_is_told_in_one_line():
    """Points, the function to write, a new and a removed exercise; a test that only gained
    imports is the same test; a stamp of another release is not the current one."""
    older = _released("08-pipeline-parallelism")
    older.metadata["distlab"][RELEASE_KEY] = dict(stamp(older), id="0123456789ab")
    now = copy.deepcopy(_released("08-pipeline-parallelism"))
    _cell(now, "test-one-f-one-b").metadata["nbgrader"]["points"] = 4
    stub = _cell(now, "idle-share")
    stub.source = stub.source.replace("rank_runs: list[RankRun]", "rank_runs, unit")
    stub.metadata["nbgrader"]["checksum"] = checksum(stub)
    _cell(now, "test-idle-share").source = "import math\n\n" + _cell(now, "test-idle-share").source
    test = _cell(now, "test-smallest-m")
    test.metadata["nbgrader"]["grade_id"] = "test-fewest-micro-batches"
    test.metadata["distlab"]["exercise"] = "Fewest micro-batches"
    comparison = compare(older, now)
    assert not comparison.current
    lines = [c.line for c in comparison.changes]
    assert lines == [
        "1F1B schedule as data: its points changed from 3 to 4",
        (
            "Measure the bubble of a real run: the code to write is now "
            "`def idle_share(rank_runs, unit) -> float:` (your copy: "
            "`def idle_share(rank_runs: list[RankRun]) -> float:`)"
        ),
        "Fewest micro-batches: new in this release: your copy does not have it",
        "Micro-batches for a 10 % bubble: no longer in the course, so not graded",
    ]
    notes = release_notes(comparison, "my 08.ipynb", test_ids=["test-one-f-one-b"])
    assert "release 0123456789ab" in notes[0]
    assert notes[1:] == [
        "changed since your copy's release:",
        "  1F1B schedule as data: its points changed from 3 to 4",
        "move your work to the current release: distlab course upgrade 'my 08.ipynb'",
    ]


# ---------------------------------------------------------------------- carrying ---
def test_carry_puts_the_learners_work_into_the_current_release():
    older = _read(FIXTURES["08-pipeline-parallelism"])
    index = older.cells.index(_cell(older, "one-f-one-b"))
    mine = nbformat.v4.new_code_cell("helper = 42  # a cell of my own")
    older.cells.insert(index + 1, mine)
    gone = nbformat.v4.new_code_cell("def interleaved_schedule(p, m, v):\n    return None")
    gone.metadata["nbgrader"] = {"solution": True, "grade_id": "interleaved", "checksum": "0"}
    older.cells.append(gone)
    released = _released("08-pipeline-parallelism")
    carried, done = carry(older, released)
    assert compare(carried, released).current and release_of(carried) == release_of(released)
    assert _solutions(carried) == {
        k: v for k, v in _solutions(older).items() if k in done.solutions
    }
    assert done.solutions == ["one-f-one-b", "idle-share", "smallest-m"]
    after = carried.cells[carried.cells.index(_cell(carried, "one-f-one-b")) + 1]
    assert after.source == mine.source and done.own_cells == [
        "code cell `helper = 42  # a cell of my own`"
    ]
    assert len(done.not_carried) == 1 and "interleaved" in done.not_carried[0]
    for cell in carried.cells:  # the rest is the release's own
        if is_graded(cell):
            assert cell.source == _cell(released, grade_id_of(cell)).source


def test_a_stub_never_started_becomes_the_current_stub():
    """A solution cell still as released (its checksum matches) is not carried: the current
    stub may have changed. With a record of its release, the course cells the current release
    dropped are not taken for the learner's."""
    older = _released("08-pipeline-parallelism")
    record = stamp(older)
    older.metadata["distlab"][RELEASE_KEY] = dict(record, id="0123456789ab")
    dropped = nbformat.v4.new_markdown_cell("## A section the course removed")
    older.cells.insert(3, dropped)
    record["cells"].insert(3, dropped.id)
    older.metadata["distlab"][RELEASE_KEY]["cells"] = record["cells"]
    _cell(older, "idle-share").source += "\n# started"
    carried, done = carry(older, _released("08-pipeline-parallelism"))
    assert done.not_started == ["one-f-one-b", "smallest-m"] and done.solutions == ["idle-share"]
    assert done.own_cells == [] and dropped.id not in [c.id for c in carried.cells]


# --------------------------------------------------------------- the commands ---
def _run(capsys, *argv) -> tuple[int, str, str]:
    code = cli.main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def test_upgrade_keeps_a_backup_and_says_what_it_could_not_carry(tmp_path, capsys):
    path = tmp_path / "my 13.ipynb"
    older = _read(FIXTURES["13-sharded-matmuls-and-overlap"])
    gone = nbformat.v4.new_code_cell("def old_exercise():\n    return 1")
    gone.metadata["nbgrader"] = {"solution": True, "grade_id": "old-exercise", "checksum": "0"}
    older.cells.append(gone)
    nbformat.write(older, path)
    before = path.read_bytes()
    code, out, _ = _run(capsys, "course", "upgrade", str(path))
    assert code == 0, out
    backups = list((tmp_path / "backups").glob("*.ipynb"))
    assert len(backups) == 1 and backups[0].read_bytes() == before
    assert f"your file as it was: {backups[0]}" in out
    upgraded, released = _read(path), _released("13-sharded-matmuls-and-overlap")
    assert compare(upgraded, released).current
    assert _solutions(upgraded) == {
        k: v for k, v in _solutions(older).items() if k != "old-exercise"
    }
    assert "could not carry:\n  solution cell old-exercise (`def old_exercise():`)" in out
    assert "Gather first or reduce after: its starting code changed" in out
    code, out, _ = _run(capsys, "course", "upgrade", str(path))
    assert code == 0 and "nothing to do" in out and len(list((tmp_path / "backups").iterdir())) == 1


def test_upgrade_refuses_what_is_not_a_learners_copy(tmp_path, capsys):
    source = ROOT / "solutions" / "00-launching" / "00-launching.ipynb"
    code, _, err = _run(capsys, "course", "upgrade", str(source))
    assert code == 2 and "source notebook" in err and err.count("\n") == 1
    stray = tmp_path / "notes.ipynb"
    nbformat.write(nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell("1")]), stray)
    code, _, err = _run(capsys, "course", "upgrade", str(stray), str(tmp_path / "missing.ipynb"))
    assert code == 2 and "not part of the distlab course" in err
    code, _, err = _run(capsys, "course", "upgrade", str(tmp_path / "missing.ipynb"))
    assert code == 2 and "no such notebook" in err and "missing.ipynb" in err


def test_start_makes_a_work_folder_and_never_overwrites(tmp_path, capsys):
    work = tmp_path / "work"
    code, out, _ = _run(capsys, "course", "start", str(work), "00", "08-pipeline-parallelism")
    assert code == 0, out
    for name in ("00-launching", "08-pipeline-parallelism"):
        copied = work / name / f"{name}.ipynb"
        assert copied.read_bytes() == released_notebook(ROOT, name).read_bytes()
        assert f"{name}/{name}.ipynb" in out
        assert resolve_notebook(name.split("-")[0], cwd=work).path == copied.resolve()
    assert sorted(p.name for p in work.iterdir()) == ["00-launching", "08-pipeline-parallelism"]
    mine = work / "08-pipeline-parallelism" / "08-pipeline-parallelism.ipynb"
    mine.write_text(mine.read_text() + " ")  # the learner's work
    kept = mine.read_bytes()
    code, _, err = _run(capsys, "course", "start", str(work), "09", "08")
    assert code == 2 and str(mine) in err and "nothing was copied" in err
    assert mine.read_bytes() == kept and not (work / "09-3d-parallelism-and-placement").exists()
    code, _, err = _run(capsys, "course", "start", str(work), "99")
    assert code == 2 and "'99'" in err and "00-launching" in err


# ----------------------------------------------------------------- grading them ---
@pytest.mark.slow
@pytest.mark.timeout(900)
def test_an_older_copy_is_graded_whole_and_says_what_changed(tmp_path):
    """00 as released at the start of the course, solved then: full marks today."""
    from distlab.grading.whole import grade_notebook

    path = tmp_path / "00-launching.ipynb"
    shutil.copy(FIXTURES["00-launching"], path)
    grade = grade_notebook(path)
    assert grade.points == grade.max_points == 5, [e.failure for e in grade.exercises]
    assert "not the current release" in grade.release[0]
    assert any("Shard a dataset like DistributedSampler: its test" in n for n in grade.release)
    assert grade.release[-1].endswith(f"distlab course upgrade {path}")


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_the_copy_that_scored_zero_grades_and_upgrades(tmp_path, capsys):
    """08 solved before its tests used withheld (issue 36: 0/7 with NameError): exercise 1 earns
    its points and names what changed; exercise 3, whose rules changed (the library's bubble
    formula is now withheld), loses them and is named; after the upgrade, exercise 1 grades
    as a current copy."""
    from distlab.grading.exercise import grade_exercise, grade_exercises

    path = tmp_path / "08-pipeline-parallelism.ipynb"
    shutil.copy(FIXTURES["08-pipeline-parallelism"], path)
    first, third = grade_exercises([(path, 1), (path, 3)])
    assert first.points == first.max_points == 3, first.exercises[0].failure
    (line,) = [note for note in first.release if note.startswith("  1F1B schedule as data: ")]
    assert "-> PipelineSched" in line and "its test changed" in line  # the stub's type was renamed
    assert third.points == 0 and "NameError" not in (third.exercises[0].failure or "")
    assert "  Micro-batches for a 10 % bubble: its test changed" in "\n".join(third.release)
    assert cli.main(["course", "upgrade", str(path)]) == 0
    capsys.readouterr()
    again = grade_exercise(path, 1)
    assert again.points == 3 and again.release == []


def test_a_learners_own_helpers_are_not_a_changed_stub():
    """The learner's cell defines more than the stub (a helper): a stub whose docstring changed
    is told by its new line; one that changed in spacing only is not a change."""
    older = _released("08-pipeline-parallelism")
    solution = _cell(older, "idle-share")
    given = solution.source.split("    # YOUR CODE HERE")[0]  # the signature and docstring
    solution.source = f"def _busy(run):\n    return 0.0\n\n{given}    return 0.0\n"
    now = copy.deepcopy(_released("08-pipeline-parallelism"))
    stub = _cell(now, "idle-share")
    stub.source += "\n"
    stub.metadata["nbgrader"]["checksum"] = checksum(stub)
    assert compare(older, now).changes == []
    stub.source = stub.source.replace('"""Sum over', '"""Count only ranks that ran. Sum over')
    stub.metadata["nbgrader"]["checksum"] = checksum(stub)
    (change,) = compare(older, now).changes
    assert change.what.startswith('its starting code changed: `"""Count only ranks that ran.')


def test_what_the_grader_runs_for_each_kind_of_copy():
    """The current release and a source notebook (hidden tests in it) as they are; an older
    copy as its work carried into the current release."""
    from distlab.grading.upgrade import to_grade

    name = "00-launching"
    released = _released(name)
    source = _read(ROOT / "solutions" / name / f"{name}.ipynb")
    older = _read(FIXTURES[name])
    graded, comparison = to_grade(released, name, name)
    assert graded is released and comparison.current
    assert to_grade(source, name, name) == (source, None)
    graded, comparison = to_grade(older, name, name)
    assert not comparison.current and release_of(graded) == release_of(released)
    assert _solutions(graded) == _solutions(older)
