"""nbgrader configuration for the distlab course.

Layout (nbgrader's ``{nbgrader_step}/{student_id}/{assignment_id}``, where the
instructor steps have no student folder):

* ``solutions/NN-topic/*.ipynb``: the source notebooks, with solutions and
  hidden tests; the only notebooks anyone edits by hand;
* ``course/NN-topic/*.ipynb``: what learners get, made by
  ``nbgrader generate_assignment NN-topic --create --force`` (stubs instead of
  solutions, hidden tests removed, checksums on the read-only cells).

``distlab grade NOTEBOOK`` and ``tests/test_course.py`` build a throw-away
course directory from this file and ``solutions/`` and autograde there.
"""

c = get_config()  # noqa: F821 - injected by traitlets when nbgrader loads this file

c.CourseDirectory.course_id = "distlab"
c.CourseDirectory.source_directory = "solutions"
c.CourseDirectory.release_directory = "course"

# A student's infinite loop (or a deadlocked send/recv) must end in a recorded
# failure of that cell, not a hung grader: nbgrader's Execute interrupts a cell
# after this many seconds and records a CellTimeoutError. distlab.run has its
# own timeout (default 120 s) that kills the worker processes of a stuck job.
c.Execute.timeout = 120
c.Execute.interrupt_on_timeout = True

# What replaces the code between ### BEGIN SOLUTION and ### END SOLUTION.
c.ClearSolutions.code_stub = {"python": "# YOUR CODE HERE\nraise NotImplementedError()"}
c.ClearSolutions.text_stub = "YOUR ANSWER HERE"
