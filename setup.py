"""Build step that ships the course inside the package.

``pip install .`` (and Binder, which runs it) installs the ``distlab`` package only; the
grader also needs ``nbgrader_config.py``, the source notebooks in ``solutions/`` and the
released ones in ``course/``, which live beside the package in the repository. This step
copies them into the built package as ``distlab/_course/`` (see
:mod:`distlab.core.course`, which finds them there). An editable install skips it: it
imports distlab from the checkout, where the course already is.
"""

import shutil
from pathlib import Path

from setuptools import setup
from setuptools.command.build_py import build_py

HERE = Path(__file__).resolve().parent
COURSE_FILES = ("nbgrader_config.py",)
COURSE_FOLDERS = ("solutions", "course")
LEFT_OUT = shutil.ignore_patterns(".ipynb_checkpoints", "__pycache__", "*.pyc")


class BuildWithCourse(build_py):
    """``build_py``, then the course copied into ``<build>/distlab/_course/``."""

    def run(self):
        super().run()
        if getattr(self, "editable_mode", False):
            return
        target = Path(self.build_lib) / "distlab" / "_course"
        shutil.rmtree(target, ignore_errors=True)
        target.mkdir(parents=True)
        for name in COURSE_FILES:
            shutil.copy2(HERE / name, target / name)
        for name in COURSE_FOLDERS:
            shutil.copytree(HERE / name, target / name, ignore=LEFT_OUT)


setup(cmdclass={"build_py": BuildWithCourse})
