"""``python -m distlab.grading.nbgrader_main ARGS [--then ARGS ...]``: nbgrader's commands,
several in one process, without the fixed costs that grading does not need.

:func:`distlab.grading.run.run_nbgrader` runs this module in its contained child process.
Each ``ARGS`` is what ``nbgrader ARGS`` takes (``autograde 01-memory-anatomy --student
learner --create --force``), and runs through nbgrader's own application, with the same
config files and converters, so the gradebook, the autograded notebook and the points are
the ones ``nbgrader`` gives. What changes is only what it costs (seconds of CPU, measured
on the course machine):

* the commands share one process: Python, nbgrader and its Jupyter stack load once, not
  once per command (about 2 s each time);
* ``rfc3987_syntax`` is not loaded (:data:`~distlab.grading.run.UNUSED_SLOW_MODULES`, about
  3 s);
* a new gradebook reads its schema version (the alembic head) in this process. nbgrader
  asks a new ``alembic heads`` process for it, which loads nbgrader again through one of
  its migration scripts (about 5 s); :func:`alembic_head` reads the same migration
  scripts with alembic's own ``ScriptDirectory``.

``--results FILE STUDENT ASSIGNMENT NOTEBOOK SUBMITTED`` (before the commands) writes, once
they are done, the points of each graded cell from the gradebook and the grade ids of the
edited read-only cells of ``SUBMITTED`` (:func:`write_results`), so the process that reads
the grade needs no nbgrader of its own.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import nbformat

from distlab.grading.kernel import calls_run
from distlab.grading.run import RESULTS, THEN
from distlab.grading.whole import edited_test_cells, gradebook_scores
from distlab.launch.template import hosting


def alembic_head() -> str:
    """The gradebook schema version nbgrader stamps a new gradebook with: the head revision
    of its migration scripts (what ``alembic heads`` prints first)."""
    from alembic.script import ScriptDirectory
    from nbgrader.dbutil import ALEMBIC_DIR

    return ScriptDirectory(ALEMBIC_DIR).get_current_head()


def split_commands(argv: list[str]) -> list[list[str]]:
    """``a b --then c d`` -> ``[[a, b], [c, d]]`` (empty commands dropped)."""
    commands: list[list[str]] = [[]]
    for arg in argv:
        if arg == THEN:
            commands.append([])
        else:
            commands[-1].append(arg)
    return [c for c in commands if c]


def run_command(argv: list[str]) -> None:
    """``nbgrader ARGV`` in this process, as ``nbgrader``'s ``main`` runs it (jupyter_core's
    ``launch_instance``: an event loop set, ``initialize``, ``start``, whose ``NoStart`` means
    that the subcommand ran); afterwards the application singletons are cleared so that the
    next command starts from a fresh application."""
    from jupyter_core.application import NoStart
    from jupyter_core.utils import ensure_event_loop
    from nbgrader.apps.nbgraderapp import NbGraderApp

    loop = ensure_event_loop()
    app = NbGraderApp.instance()
    try:
        app.initialize(argv)
        app.start()
    except NoStart:
        pass
    finally:
        for singleton in (app.subapp, app):
            if singleton is not None:
                type(singleton).clear_instance()
        loop.close()


def write_results(out: str, student: str, assignment: str, notebook: str, submitted: str) -> None:
    """Points per graded cell from the gradebook of the current folder, and the edited
    read-only cells of ``submitted``, as JSON in ``out``."""
    results = {
        "scores": gradebook_scores(Path.cwd(), student, assignment, notebook),
        "edited_test_cells": edited_test_cells(submitted),
    }
    Path(out).write_text(json.dumps(results), encoding="utf-8")


def _hosts_kernels(commands: list[list[str]], results: list[str] | None) -> bool:
    """Whether the kernels nbgrader starts here fork from one template (which imports torch
    once: :mod:`distlab.grading.forked_kernel`): when it grades a class, and for one
    learner's notebook that starts processes (its kernel and its worker starter then share
    one import of torch instead of making two)."""
    if not any(c[:1] == ["autograde"] for c in commands):
        return False
    if results is None:
        return True
    return calls_run(nbformat.read(results[4], as_version=4))


def main(argv: list[str] | None = None) -> None:
    argv = list(sys.argv[1:] if argv is None else argv)
    results = None
    if argv[:1] == [RESULTS]:
        results, argv = argv[1:6], argv[6:]
    from nbgrader import api

    api.get_alembic_version = alembic_head  # nbgrader calls it when it creates a gradebook
    commands = split_commands(argv)
    with hosting(_hosts_kernels(commands, results)):
        for command in commands:
            run_command(command)
    if results:
        write_results(*results)


if __name__ == "__main__":
    main()
