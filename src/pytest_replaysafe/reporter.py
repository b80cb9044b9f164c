"""The terminal side of the matrix: cells done / total in the status word, the grid, failure lines with repro
commands, and the JSON / Markdown / GitHub step-summary reports. Runs on the xdist controller too."""

from __future__ import annotations

import json
import os
from typing import Any

import pytest

from pytest_replaysafe import report
from pytest_replaysafe.fixtures import CELL_PROPERTY
from pytest_replaysafe.matrix import MODES, Cell
from pytest_replaysafe.options import Settings


def cell_of(item: pytest.Item) -> Cell | None:
    callspec = getattr(item, "callspec", None)
    cell = callspec.params.get("_replaysafe_cell") if callspec is not None else None
    return cell if isinstance(cell, Cell) else None


class MatrixReporter:
    """Collects cells from test reports and writes the grid and reports at the end of the session."""

    def __init__(self, settings: Settings) -> None:
        self.settings = settings
        self.cells: list[dict[str, Any]] = []
        self.total: int | None = None
        self.done: set[str] = set()

    def pytest_collection_modifyitems(self, items: list[pytest.Item]) -> None:
        self.total = sum(1 for item in items if cell_of(item) is not None)

    @pytest.hookimpl(wrapper=True)
    def pytest_report_teststatus(self, report: pytest.TestReport) -> Any:
        """Progress while a long matrix runs: the verbose status word says how many items are done."""
        status = yield
        is_cell = any(f"-{mode}]" in report.nodeid for mode in MODES)
        finished = report.when == "call" or (report.when == "setup" and not report.passed)
        if is_cell and finished and isinstance(status, tuple) and len(status) == 3 and isinstance(status[2], str):
            self.done.add(report.nodeid)  # the status hook is asked again for summary lines: count items once
            total = f"/{self.total}" if self.total else ""
            category, letter, word = status
            return category, letter, f"{word} [{len(self.done)}{total} cells]" if word else word
        return status

    def pytest_runtest_logreport(self, report: pytest.TestReport) -> None:
        if report.when != "teardown":
            return
        for name, value in report.user_properties:
            if name == CELL_PROPERTY and isinstance(value, str):
                self.cells.append(json.loads(value))

    def pytest_terminal_summary(self, terminalreporter: Any, exitstatus: int, config: pytest.Config) -> None:
        settings = self.settings
        cells = sorted(self.cells, key=lambda c: (c["test"], c["point"], c["backend"], c["mode"], c["hit"]))
        terminalreporter.section(f"replaysafe crash matrix (seed {settings.seed})")
        if not cells:
            terminalreporter.write_line("no crash-matrix cells ran (mark tests with @pytest.mark.crash_matrix)")
            return
        for line in report.text_grid(cells) + report.failure_lines(cells):
            terminalreporter.write_line(line)
        if settings.report is not None:
            report.write_json(settings.report, cells, settings.seed)
            terminalreporter.write_line(f"crash matrix report: {settings.report}")
        if settings.markdown is not None:
            settings.markdown.write_text(report.markdown(cells, settings.seed))
            terminalreporter.write_line(f"crash matrix grid: {settings.markdown}")
        summary_path = os.environ.get("GITHUB_STEP_SUMMARY")
        if summary_path:
            with open(summary_path, "a", encoding="utf-8") as fh:
                fh.write(report.markdown(cells, settings.seed) + "\n")
