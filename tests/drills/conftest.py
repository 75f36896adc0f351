"""Collects every drill's row and prints the report at the end of the run."""

from __future__ import annotations

from pathlib import Path

import pytest
from drill_ledger import DrillResult, write_report

RESULTS: list[DrillResult] = []
REPORT = Path(__file__).resolve().parents[2] / "build" / "drills.md"


@pytest.fixture
def report() -> list[DrillResult]:
    return RESULTS


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    if RESULTS:
        text = write_report(RESULTS, REPORT)
        terminalreporter.write_sep("=", "failover drills")
        terminalreporter.write_line(text)
        terminalreporter.write_line(f"(written to {REPORT.relative_to(REPORT.parents[1])})")
