"""The two tiers of the suite, and the report that keeps the fast one fast.

``python -m pytest`` runs everything; ``python -m pytest -m "not slow"`` is the fast tier
(docs/testing.md, "Tests and CI"). The ``slow`` marker goes on a test by what it was measured
to cost: more than :data:`FAST_TIER_BUDGET_S` seconds (setup, call and teardown together) on a
quiet 2-core machine, or a share of a slow module-scoped fixture.

At the end of every run this plugin prints the :data:`SHOWN` slowest tests with their
marker, and flags each test that is *not* marked slow and took longer than the budget. The
flag is a report, not a failure: a timed assertion would fail on a busy machine for
reasons that are not the test's. CI prints the table, so a new slow test shows up there
the first time it runs and can be marked (or made faster).

Under pytest-xdist the reports arrive at the controller, which prints the table once.
"""

from __future__ import annotations

import pytest

FAST_TIER_BUDGET_S = 5.0  # per test, setup + call + teardown, in a two-worker run on 2 cores
SHOWN = 20
SLOW = "slow"


class SlowestTests:
    """Collects every test's duration (summed over setup, call, teardown) and its markers."""

    def __init__(self) -> None:
        self.seconds: dict[str, float] = {}
        self.slow: dict[str, bool] = {}

    @pytest.hookimpl
    def pytest_runtest_logreport(self, report: pytest.TestReport) -> None:
        self.seconds[report.nodeid] = self.seconds.get(report.nodeid, 0.0) + report.duration
        self.slow[report.nodeid] = SLOW in report.keywords

    def over_budget(self) -> list[tuple[str, float]]:
        """Tests not marked slow that took longer than the budget, slowest first."""
        return [
            (node, s) for node, s in self.ranked() if not self.slow[node] and s > FAST_TIER_BUDGET_S
        ]

    def ranked(self) -> list[tuple[str, float]]:
        return sorted(self.seconds.items(), key=lambda item: -item[1])

    @pytest.hookimpl(trylast=True)
    def pytest_terminal_summary(self, terminalreporter) -> None:
        if not self.seconds:
            return
        write = terminalreporter.write_line
        terminalreporter.section(f"{SHOWN} slowest tests (setup + call + teardown)")
        for node, seconds in self.ranked()[:SHOWN]:
            if self.slow[node]:
                tier = "slow"
            else:
                tier = "FAST TIER, OVER BUDGET" if seconds > FAST_TIER_BUDGET_S else "fast"
            write(f"{seconds:8.2f} s  {tier:<22} {node}")
        over = self.over_budget()
        if over:
            write(
                f"{len(over)} test(s) not marked slow took over {FAST_TIER_BUDGET_S} s "
                "(mark them @pytest.mark.slow, or make them faster):"
            )
            for node, seconds in over:
                write(f"{seconds:8.2f} s  {node}")
        else:
            write(f"no test outside the slow tier took over {FAST_TIER_BUDGET_S} s")


def pytest_configure(config: pytest.Config) -> None:
    if not hasattr(config, "workerinput"):  # the controller (or a run without xdist)
        config.pluginmanager.register(SlowestTests(), "distlab-slowest-tests")
