"""``--crash-replay=REPORT.json``: run again exactly the failing cells of an earlier report, under its seed.

Each failing cell names its test item, hit and completion order; the replay deselects every other item and runs
each selected one at those (hit, order) pairs only, smallest first, so a CI job can re-check yesterday's red cells
in seconds. Failing cells are listed smallest first in reports too (earliest hit, then order): the smallest
failing schedule of a test is the first repro line to try.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from pytest_replaysafe.outcome import Outcome


@dataclass
class Replay:
    seed: int
    #: test item id -> the (hit, order) pairs to run, smallest first
    cells: dict[str, list[tuple[int, int]]] = field(default_factory=dict)

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
            replay.cells.setdefault(c["test"], []).append((max(int(c["hit"]), 1), int(c.get("order", 0))))
        for pairs in replay.cells.values():
            pairs.sort()
        return replay

    def select(self, config: pytest.Config, items: list[pytest.Item]) -> None:
        """Keep only the items with failing cells (the others are reported as deselected)."""
        kept = [item for item in items if item.nodeid in self.cells]
        dropped = [item for item in items if item.nodeid not in self.cells]
        if dropped:
            config.hook.pytest_deselected(items=dropped)
        items[:] = kept

    def executions(self, nodeid: str) -> list[tuple[int, int]] | None:
        return self.cells.get(nodeid)


def smallest_first(cell: dict[str, Any]) -> tuple[str, int, int, str, str]:
    """The order failing cells are listed in: per test, earliest hit, then completion order."""
    return (cell["test"].split("[")[0], cell["hit"], cell.get("order", 0), cell["point"], cell["backend"])
