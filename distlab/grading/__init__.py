"""``distlab grade``: autograde a course notebook on your own machine, as nbgrader would.

The modules, each importing only those listed before it (and :mod:`distlab.core.course`,
where the course's notebooks live):

* :mod:`~distlab.grading.run`: run nbgrader (or a notebook) so that nothing it starts
  outlives it, and turn Ctrl+C into an exception that cleans up;
* :mod:`~distlab.grading.cells`: nbgrader's cell metadata, and why a test cell failed;
* :mod:`~distlab.grading.slicing`: the cells a test cell needs (names defined and used);
* :mod:`~distlab.grading.report`: :class:`NotebookGrade` and its report;
* :mod:`~distlab.grading.release`: which release of the course a notebook came from
  (recorded in its metadata when ``course/`` is generated), and what changed in its
  exercises since;
* :mod:`~distlab.grading.resolve`: which file ``distlab grade NAME`` grades;
* :mod:`~distlab.grading.upgrade`: a learner's work carried into the current release
  (``distlab course upgrade``; ``distlab grade`` grades an older copy that way);
* :mod:`~distlab.grading.workfolder`: a learner's work folder of released notebooks
  (``distlab course start``);
* :mod:`~distlab.grading.whole`: the whole notebook, by nbgrader in a throw-away course
  directory;
* :mod:`~distlab.grading.exercise`: one exercise, running only the cells it needs;
* :mod:`~distlab.grading.record`: each exercise's newest grade and check, in the learner's
  data folder (``distlab progress`` reads them);
* :mod:`~distlab.grading.command`: the ``distlab grade`` command (:func:`register`);
* :mod:`~distlab.grading.check`: ``distlab.check(...)``, one exercise's tests run in the
  notebook's live kernel (loaded only there: ``distlab.check`` imports it).

Five more are loaded only where they are used: :mod:`~distlab.grading.forked_kernel`
(grading kernels forked from the template that imported torch, instead of started afresh),
:mod:`~distlab.grading.execute`
(nbgrader's Execute step that reports timeouts and dead kernels; it runs inside
nbgrader and the exercise runner, and imports nbgrader),
:mod:`~distlab.grading.kernel` (the exercise runner's kernel, started before nbgrader
loads, with the first cell's imports under way), :mod:`~distlab.grading.nbgrader_main`
(nbgrader's commands, several in one child process, with their fixed costs cut) and
:mod:`~distlab.grading.mutants` (grades plausible wrong answers, for the course's tests). The ``distlab grade`` process itself never imports
nbgrader: its children do, and send back the points.
"""

from __future__ import annotations

from distlab.core.course import (
    CONFIG_FILE,
    RELEASE_DIR,
    ROOT_ENV_VAR,
    SOURCE_DIR,
    assignment_names,
    find_course_root,
    source_notebooks,
)
from distlab.grading.cells import raised_in
from distlab.grading.command import TIMEOUT_ENV_VAR, register
from distlab.grading.exercise import grade_exercise, grade_exercises
from distlab.grading.report import ExerciseScore, NotebookGrade, format_report
from distlab.grading.resolve import Resolved, find_notebook, identify, resolve_notebook
from distlab.grading.whole import (
    autograde,
    edited_test_cells,
    grade_notebook,
    prepare_course,
    read_grade,
    submit,
)

__all__ = [
    "CONFIG_FILE",
    "RELEASE_DIR",
    "ROOT_ENV_VAR",
    "SOURCE_DIR",
    "TIMEOUT_ENV_VAR",
    "ExerciseScore",
    "NotebookGrade",
    "Resolved",
    "assignment_names",
    "autograde",
    "edited_test_cells",
    "find_course_root",
    "find_notebook",
    "format_report",
    "grade_exercise",
    "grade_exercises",
    "grade_notebook",
    "identify",
    "prepare_course",
    "raised_in",
    "read_grade",
    "register",
    "resolve_notebook",
    "source_notebooks",
    "submit",
]
