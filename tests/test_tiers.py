"""The slowest-tests report (tests/tiers.py): it names the slowest tests with their tier and
flags a test outside the slow tier that took longer than the budget, and only such a test."""

from __future__ import annotations

import pytest
import tiers

SUITE = """
import time
import pytest

def test_quick():
    pass

def test_unmarked_and_slow():
    time.sleep(0.3)

@pytest.mark.slow
def test_marked_and_slow():
    time.sleep(0.3)
"""


def test_an_unmarked_test_over_the_budget_is_flagged(pytester, monkeypatch):
    monkeypatch.setattr(tiers, "FAST_TIER_BUDGET_S", 0.1)
    pytester.makepyfile(test_suite=SUITE)
    pytester.makeini("[pytest]\nmarkers =\n    slow: slow\n")
    result = pytester.runpytest_inprocess("-p", "tiers", "-p", "no:cacheprovider", "-n", "0")
    result.assert_outcomes(passed=3)
    out = result.stdout.str()
    assert "slowest tests" in out
    for line in (  # each on its own: tests of equal duration come in either order
        "*s  FAST TIER, OVER BUDGET *test_suite.py::test_unmarked_and_slow",
        "*s  slow  *test_suite.py::test_marked_and_slow",
        "1 test(s) not marked slow took over 0.1 s*",
    ):
        result.stdout.fnmatch_lines([line])
    assert "OVER BUDGET test_suite.py::test_marked_and_slow" not in out


def test_nothing_is_flagged_when_every_slow_test_is_marked(pytester, monkeypatch):
    monkeypatch.setattr(tiers, "FAST_TIER_BUDGET_S", 1.0)
    pytester.makepyfile(test_suite=SUITE)
    pytester.makeini("[pytest]\nmarkers =\n    slow: slow\n")
    result = pytester.runpytest_inprocess("-p", "tiers", "-p", "no:cacheprovider", "-n", "0")
    result.stdout.fnmatch_lines(["no test outside the slow tier took over 1.0 s"])


@pytest.mark.parametrize("marked", [True, False])
def test_the_tier_comes_from_the_marker(marked):
    report = pytest.TestReport(
        "x.py::t", ("x.py", 0, "t"), {"slow": 1} if marked else {}, "passed", None, "call",
        duration=9.0,
    )  # fmt: skip
    slowest = tiers.SlowestTests()
    slowest.pytest_runtest_logreport(report)
    assert slowest.over_budget() == ([] if marked else [("x.py::t", 9.0)])
