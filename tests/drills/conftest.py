"""Collects every drill's row and prints the report at the end of the run; a failed
drill's report carries its replicas' notable log lines (the workdir holding the whole
logs is deleted with the cluster)."""

from __future__ import annotations

from collections.abc import Generator
from pathlib import Path

import pytest
from drill_harness import DrillCluster
from drill_ledger import DrillResult, write_report

RESULTS: list[DrillResult] = []
REPORT = Path(__file__).resolve().parents[2] / "build" / "drills.md"
CLUSTERS = pytest.StashKey[list[DrillCluster]]()


@pytest.fixture
def report() -> list[DrillResult]:
    return RESULTS


@pytest.fixture
def drill_clusters(request: pytest.FixtureRequest) -> list[DrillCluster]:
    """The clusters a test starts: their logs go into its report should it fail."""
    clusters: list[DrillCluster] = []
    request.node.stash[CLUSTERS] = clusters
    return clusters


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(
    item: pytest.Item, call: pytest.CallInfo[None]
) -> Generator[None, pytest.TestReport, pytest.TestReport]:
    report = yield
    if report.when == "call" and report.failed:
        clusters = item.stash.get(CLUSTERS, None) or []
        for i, cluster in enumerate(clusters):
            report.sections.append((f"replica logs, cluster {i}", cluster.notable_logs()))
    return report


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    if RESULTS:
        text = write_report(RESULTS, REPORT)
        terminalreporter.write_sep("=", "failover drills")
        terminalreporter.write_line(text)
        terminalreporter.write_line(f"(written to {REPORT.relative_to(REPORT.parents[1])})")
