"""nbgrader configuration for the distlab course.

Layout (nbgrader's ``{nbgrader_step}/{student_id}/{assignment_id}``, where the
instructor steps have no student folder):

* ``solutions/NN-topic/*.ipynb``: the source notebooks, with solutions and
  hidden tests; the only notebooks anyone edits by hand;
* ``course/NN-topic/*.ipynb``: what learners get, made by
  ``nbgrader generate_assignment NN-topic --create --force`` (stubs instead of
  solutions, hidden tests removed, checksums on the read-only cells).

Every released notebook records the release it came from (``metadata.distlab.release``,
written by :func:`distlab.grading.release.stamp_release` as generate_assignment's last step),
so that ``distlab grade`` can tell a copy from an older release and say what changed.

``distlab grade NOTEBOOK`` and ``tests/test_course.py`` build a throw-away
course directory from this file and ``solutions/`` and autograde there.
"""

from nbgrader.converters import GenerateAssignment

c = get_config()  # noqa: F821 - injected by traitlets when nbgrader loads this file

c.CourseDirectory.course_id = "distlab"
c.CourseDirectory.source_directory = "solutions"
c.CourseDirectory.release_directory = "course"
c.GenerateAssignment.preprocessors = [
    *GenerateAssignment.class_traits()["preprocessors"].default(),
    "distlab.grading.release.stamp_release",  # after the checksums: the release's record
]

# A student's infinite loop (or a deadlocked send/recv) must end in a recorded
# failure of that cell, not a hung grader: nbgrader's Execute interrupts a cell
# after this many seconds and records a CellTimeoutError. distlab.run has its
# own timeout (default 120 s) that kills the worker processes of a stuck job.
c.Execute.timeout = 120
c.Execute.interrupt_on_timeout = True

# What replaces the code between ### BEGIN SOLUTION and ### END SOLUTION.
c.ClearSolutions.code_stub = {"python": "# YOUR CODE HERE\nraise NotImplementedError()"}
c.ClearSolutions.text_stub = "YOUR ANSWER HERE"
