"""The terminal side of the matrix: progress in cells with the time left, the grid, failure lines with repro
commands, the closing lines, and the JSON / Markdown / HTML / GitHub step-summary reports. Runs on the xdist
controller too."""

from __future__ import annotations

import json
import re
from typing import Any

import pytest

from pytest_replaysafe.fixtures import CELL_PROPERTY
from pytest_replaysafe.judge.exposure import EXPOSURE_PROPERTY, summarize
from pytest_replaysafe.matrix.cells import FAULT_CELL_MODES, MODES, Cell
from pytest_replaysafe.matrix.schedules import SCHEDULES_PROPERTY, summary_line, totals
from pytest_replaysafe.matrix.shards import WORKER_KEY
from pytest_replaysafe.options import Settings
from pytest_replaysafe.report import files
from pytest_replaysafe.report import outputs as report
from pytest_replaysafe.report.progress import Progress


def cell_of(item: pytest.Item) -> Cell | None:
    callspec = getattr(item, "callspec", None)
    cell = callspec.params.get("_replaysafe_cell") if callspec is not None else None
    return cell if isinstance(cell, Cell) else None


class MatrixReporter:
    """Collects cells from test reports, prints progress while the matrix runs, and writes the grid and reports at
    the end of the session. On the xdist controller it sees every worker's cells as their reports arrive."""

    def __init__(self, settings: Settings, config: pytest.Config) -> None:
        self.settings = settings
        self.config = config
        self.cells: list[dict[str, Any]] = []
        self.exposure: list[dict[str, Any]] = []  # one sample of clean-run windows per matrix item
        self.schedules: list[dict[str, int]] = []  # one depth-2 choice per matrix item (--crash-depth=2)
        self.progress = Progress(settings.progress_every)
        self.quiet = config.get_verbosity() < 0 or settings.progress_every is None
        self.finished: set[str] = set()  # every item whose teardown was reported (a shard checks its plan)
        self.shard_plan: dict[str, Any] | None = None

    def pytest_collection_finish(self, session: pytest.Session) -> None:  # (after every selection: -k, a shard)
        self.progress.expect([item.nodeid for item in session.items if cell_of(item) is not None])

    @pytest.hookimpl(optionalhook=True)
    def pytest_testnodedown(self, node: Any, error: Any) -> None:  # xdist: a worker's part of the shard plan
        plan = getattr(node, "workeroutput", {}).get(WORKER_KEY)
        if plan is not None:
            self.shard_plan = plan

    @pytest.hookimpl(optionalhook=True)
    def pytest_xdist_node_collection_finished(self, node: Any, ids: list[str]) -> None:
        if not self.progress.items:  # every worker collects the same items
            modes = "|".join(re.escape(m) for m in (*MODES, *FAULT_CELL_MODES))
            self.progress.expect([i for i in ids if re.search(rf"-({modes})(@[\w.]+)?\]", i)])

    def pytest_runtest_logreport(self, report: pytest.TestReport) -> None:
        if report.when != "teardown":
            return
        self.finished.add(report.nodeid)
        found = [json.loads(v) for n, v in report.user_properties if n == CELL_PROPERTY and isinstance(v, str)]
        self.cells += found
        self.exposure += [
            json.loads(v) for n, v in report.user_properties if n == EXPOSURE_PROPERTY and isinstance(v, str)
        ]
        self.schedules += [
            json.loads(v) for n, v in report.user_properties if n == SCHEDULES_PROPERTY and isinstance(v, str)
        ]
        if report.nodeid not in self.progress.items:
            return
        line = self.progress.finished(report.nodeid, found)
        if line is not None and not self.quiet:
            terminal = self.config.pluginmanager.get_plugin("terminalreporter")
            if terminal is not None:
                writer = getattr(terminal, "_tw", None)  # pytest's dots leave the cursor mid-line
                if writer is not None and writer.width_of_current_line:
                    terminal.write("\n")
                terminal.write_line(line)

    def pytest_terminal_summary(self, terminalreporter: Any, exitstatus: int, config: pytest.Config) -> None:
        settings = self.settings
        cells = sorted(self.cells, key=report.cell_order)
        terminalreporter.section(f"replaysafe crash matrix (seed {settings.seed})")
        if not cells and config.option.collectonly:  # (the items are the cells: collected, not run)
            terminalreporter.write_line("collected only: each crash-matrix item above is one cell")
            terminalreporter.write_line("  (test[point-backend-mode]); run without --collect-only to judge them")
            return
        xfailed = len(terminalreporter.stats.get("xfailed", []))
        shard = self.shard_part(xfailed)
        if not cells:
            terminalreporter.write_line("no crash-matrix cells ran (mark tests with @pytest.mark.crash_matrix)")
            if shard is not None and settings.report is not None:  # (a merge needs every shard's, empty or not)
                files.write_all(
                    [], settings.seed, {"rate": settings.rate, "rows": []}, None, (settings.report, None, None), shard
                )
                terminalreporter.write_line(shard_line(shard, settings.report))
            return
        exposure = {"rate": settings.rate, "rows": summarize(self.exposure, settings.rate_per_s)}
        schedules = totals(self.schedules) if self.schedules else None
        for line in report.matrix_lines(cells, exposure):
            terminalreporter.write_line(line)
        paths = (settings.report, settings.markdown, settings.html)
        written = files.write_all(cells, settings.seed, exposure, schedules, paths, shard)
        depth2 = summary_line(schedules) if schedules is not None else None
        for line in report.closing_lines(cells, written, xfailed, depth2):
            terminalreporter.write_line(line)
        if shard is not None:
            terminalreporter.write_line(shard_line(shard, settings.report))

    def shard_part(self, xfailed: int) -> dict[str, Any] | None:
        """With --crash-shard: the plan's part this run ran, and what a merge needs to make the whole report
        (the raw exposure and depth-2 samples, which sum; the items planned here but not finished)."""
        if self.settings.shard is None:
            return None
        plan = self.shard_plan
        selector = self.config.pluginmanager.get_plugin("replaysafe-shard")
        if plan is None and selector is not None and selector.plan is not None:
            plan = selector.plan.to_json()
        if plan is None:  # (no worker reported one: every worker failed before collecting)
            return {"index": self.settings.shard.index, "count": self.settings.shard.count, "plan": None}
        unfinished = [nodeid for nodeid in plan["items"] if nodeid not in self.finished]
        samples = {"exposure_samples": self.exposure, "schedule_samples": self.schedules}
        return {**plan, "unfinished": unfinished, "xfailed": xfailed, "rate": self.settings.rate, **samples}


def shard_line(shard: dict[str, Any], path: Any) -> str:
    where = path if path is not None else "its --crash-report (none was given: add one)"
    return (
        f"shard {shard['index']}/{shard['count']} of plan {shard['plan']}: one part of the matrix; the whole report "
        f"is the merge of every shard's report: python -m pytest_replaysafe merge {where} ... --out merged.json"
    )
