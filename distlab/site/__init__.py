"""The course website: every notebook as a page, built offline into static files.

``distlab site build`` (or ``python -m distlab.site build``) writes ``build/site/html``, a
folder any static host serves. The modules:

* :mod:`~distlab.site.executed`: the executed solution notebooks, reused from the test run
  (``tests/test_course.py`` stores them) or run with nbgrader where missing;
* :mod:`~distlab.site.pages`: a notebook as the learner gets it, with demo outputs, and the
  box that opens each page (Binder, download, grade, drill);
* :mod:`~distlab.site.deck`: the flashcard deck by notebook;
* :mod:`~distlab.site.api`: one page per library area, from the docstrings;
* :mod:`~distlab.site.build`: stages the sources (:mod:`~distlab.site.files` writes only what
  changed) and runs Sphinx (:mod:`distlab.site.conf`);
* :mod:`~distlab.site.command`: the ``distlab site`` command.

Importing this package loads none of Sphinx: only building does. The Sphinx side needs the
``site`` extra (``pip install -e ".[site]"``).
"""

from distlab.site.command import register

__all__ = ["register"]
