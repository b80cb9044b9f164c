"""Progress of a running matrix, counted in cells: done / total and the time left.

A test item is one (test, point, backend, mode) and holds one cell per hit of its point, which is known only once
the item ran its clean run. Until then an item counts as many cells as a finished item of the same test and
point (the hits of a point do not depend on backend or mode), else the mean of finished items, and the total is
shown as an estimate (``~``). The time left is the elapsed time scaled by the cells still to run."""

from __future__ import annotations

import re
import time
from collections.abc import Callable, Sequence
from typing import Any

_POINT = re.compile(r"\[([^\[\]-]+)-")  # the cell id starts with the point: test[point-backend-mode]


def _group(nodeid: str) -> str:
    """Items that share a test and a point have the same number of hits."""
    found = _POINT.search(nodeid)
    return nodeid.split("[")[0] + ("::" + found.group(1) if found else "")


class Progress:
    def __init__(self, every: float | None, clock: Callable[[], float] = time.monotonic) -> None:
        #: Seconds between two progress lines (0: after every item; None: never).
        self.every = every
        self.clock = clock
        self.items: set[str] = set()
        self.done: dict[str, int] = {}  # item -> its cells
        self.started = clock()
        self.last_line: float | None = None

    def expect(self, nodeids: Sequence[str]) -> None:
        self.items = set(nodeids)
        self.started = self.clock()

    def estimate_total(self) -> tuple[int, bool]:
        """``(cells, exact)``: the cells of finished items plus an estimate for the others."""
        by_group: dict[str, list[int]] = {}
        for nodeid, n in self.done.items():
            by_group.setdefault(_group(nodeid), []).append(n)
        mean = sum(self.done.values()) / len(self.done) if self.done else 1.0
        total = float(sum(self.done.values()))
        for nodeid in self.items - set(self.done):
            seen = by_group.get(_group(nodeid))
            total += max(seen) if seen else mean
        return round(total), len(self.done) == len(self.items)

    def line(self) -> str:
        cells = sum(self.done.values())
        total, exact = self.estimate_total()
        elapsed = self.clock() - self.started
        text = f"replaysafe: {cells}/{'' if exact else '~'}{total} cells, {len(self.done)}/{len(self.items)} tests"
        text += f", {elapsed:.0f} s"
        if cells and cells < total:
            text += f", about {elapsed * (total - cells) / cells:.0f} s left"
        return text

    def finished(self, nodeid: str, cells: Sequence[Any]) -> str | None:
        """Count an item's cells; the progress line to print now, if one is due."""
        self.done[nodeid] = len(cells)
        if self.every is None:
            return None
        now = self.clock()
        due = self.last_line is None and now - self.started >= self.every
        due = due or (self.last_line is not None and now - self.last_line >= self.every)
        if not due or len(self.done) == len(self.items):  # the grid follows the last item
            return None
        self.last_line = now
        return self.line()
