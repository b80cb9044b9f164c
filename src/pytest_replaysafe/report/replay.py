"""``--crash-replay=REPORT.json``: run again exactly the failing cells of an earlier report, under its seed.

Each failing cell names its test item, hit, completion order and (depth 2) second crash; the replay deselects
every other item and runs each selected one at those schedules only, smallest first, so a CI job can re-check
yesterday's red cells in seconds. Failing cells are listed smallest first in reports too (fewest crashes, earliest
hit, then order, then the earliest second crash): the smallest failing schedule of a test is the first repro line
to try.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from pytest_replaysafe.judge.outcome import Outcome
from pytest_replaysafe.matrix.schedules import Plan, SecondCrash


@dataclass
class Replay:
    seed: int
    #: test item id -> the (hit, order, second crash) schedules to run, smallest first
    cells: dict[str, list[Plan]] = field(default_factory=dict)

    @classmethod
    def load(cls, path: Path) -> Replay:
        try:
            data = json.loads(path.read_text())
            failing = [c for c in data["cells"] if Outcome(c["outcome"]).failing]
            replay = cls(int(data["seed"]))
        except (OSError, ValueError, KeyError, TypeError) as exc:
            raise pytest.UsageError(
                f"replaysafe: --crash-replay={str(path)!r}: not a crash-matrix JSON report ({exc}); give a file "
                "written by --crash-report"
            ) from None
        for c in failing:
            then = SecondCrash.parse(c["then"], "--crash-replay") if c.get("then") else None
            replay.cells.setdefault(c["test"], []).append((max(int(c["hit"]), 1), int(c.get("order", 0)), then))
        for plans in replay.cells.values():
            plans.sort(key=lambda p: (p[2] is not None, p[0], p[1], p[2] or SecondCrash("", 0)))
        return replay

    def select(self, config: pytest.Config, items: list[pytest.Item]) -> None:
        """Keep only the items with failing cells (the others are reported as deselected)."""
        kept = [item for item in items if item.nodeid in self.cells]
        dropped = [item for item in items if item.nodeid not in self.cells]
        if dropped:
            config.hook.pytest_deselected(items=dropped)
        items[:] = kept

    def executions(self, nodeid: str) -> list[Plan] | None:
        return self.cells.get(nodeid)


def smallest_first(cell: dict[str, Any]) -> tuple[str, bool, int, int, str, str, str]:
    """The order failing cells are listed in: per test, one crash before two, earliest hit, then completion order,
    then the earliest second crash."""
    then = cell.get("then") or ""
    second = (then.rpartition("@")[2].zfill(6), then) if then else ("", "")
    return (
        cell["test"].split("[")[0], bool(then), cell["hit"], cell.get("order", 0), "".join(second), cell["point"],
        cell["backend"],
    )  # fmt: skip
