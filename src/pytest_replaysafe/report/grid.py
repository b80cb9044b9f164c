"""The crash-matrix grid as text: rows are crash points grouped by where they fire (run loop, tool path, faults,
your own) in firing order; one block of columns per backend with its modes as sub-columns. Blocks that do not fit
the width (100 columns) wrap into another panel below. Built from the cells' JSON records."""

from __future__ import annotations

import textwrap
from collections import Counter
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from pytest_replaysafe.judge.outcome import LEGEND, SEVERITY, Outcome

WIDTH = 100
#: Sub-column headings: short, so four modes of four backends need no more than two panels.
MODE_LABELS = {
    "inprocess": "proc", "sigkill": "kill", "stream": "strm", "concurrent": "conc", "recovery": "rcvr", "prune": "prun",
    "drop": "drop", "outage": "out", "redis-down": "rdwn", "readonly": "ro", "resumers": "k-rs",
}  # fmt: skip
MODES_LINE = "modes: proc in-process crash, kill SIGKILL + resume, strm streaming, conc two runs contest the lock"
#: The modes shown only where their columns are, explained there.
RESUME_LINES = {
    "recovery": "rcvr the server's recovery resumes",
    "prune": "prun the retention job runs, then the resume",
    "double-resume": "double-resume killed like kill; every Resume sent twice, the last one again after the kill, "
    "and a different decision for one already taken (it must be refused)",
    "resumers": "k-rs killed like kill; in the resume, every Resume sent by 3 processes at once",
}
FAULT_LINES = {
    "drop": "drop PostgreSQL connections terminated",
    "outage": "out PostgreSQL unreachable for a while",
    "redis-down": "rdwn Redis unreachable",
    "readonly": "ro SQLite read-only",
}
BACKEND_ORDER = ("memory", "sqlite", "postgres", "postgres+redis")
GROUPS = ("run loop", "tool path", "faults", "your points")
GAP = 2  # spaces between backend blocks


def group_of(point: str) -> str:
    """Where a point fires: the run loop, a tool's path through the ledger, an injected fault, or your own."""
    from tenxgraph.core.crashpoints import POINTS

    builtin = {p.name: p for p in POINTS}
    found = builtin.get(point)
    if found is None:
        return "your points"
    if found.kind == "fault":
        return "faults"
    return "run loop" if found.module.endswith(".compiled") else "tool path"


def point_order(point: str) -> tuple[int, int, str]:
    """Group first, then the order the points fire in a run (the crash-point table's order)."""
    from tenxgraph.core.crashpoints import POINTS

    order = [p.name for p in POINTS]
    return (GROUPS.index(group_of(point)), order.index(point) if point in order else len(order), point)


def column_of(cell: dict[str, Any]) -> tuple[str, str]:
    return cell["backend"], cell["mode"]


def column_order(column: tuple[str, str]) -> tuple[int, str, int, str]:
    backend, mode = column
    b = BACKEND_ORDER.index(backend) if backend in BACKEND_ORDER else len(BACKEND_ORDER)
    m = list(MODE_LABELS).index(mode) if mode in MODE_LABELS else len(MODE_LABELS)
    return (b, backend, m, mode)


def left_out(cells: Iterable[dict[str, Any]]) -> list[str]:
    """Columns (``backend/mode``) in which no cell applies: in-memory storage with a killed process."""
    outcomes: dict[tuple[str, str], set[str]] = {}
    for c in cells:
        outcomes.setdefault(column_of(c), set()).add(c["outcome"])
    na = {str(Outcome.NOT_APPLICABLE)}
    return [f"{b}/{m}" for b, m in sorted(outcomes, key=column_order) if outcomes[(b, m)] == na]


def left_out_lines(cells: Sequence[dict[str, Any]], width: int = WIDTH) -> list[str]:
    columns = left_out(cells)
    if not columns:
        return []
    skipped = sum(1 for c in cells if c["outcome"] == str(Outcome.NOT_APPLICABLE))
    text = (
        f"not applicable, left out: {', '.join(columns)} (that storage does not survive a killed process; "
        f"pytest counts these {skipped} cells as skipped)"
    )
    return textwrap.wrap(text, width, subsequent_indent="  ")


def square(outcomes: Counter[Outcome]) -> str:
    """The count of each outcome in one square, worst first (``"3g 4+"``); ``.`` when nothing applies."""
    if set(outcomes) <= {Outcome.NOT_APPLICABLE}:
        return Outcome.NOT_APPLICABLE.symbol
    return " ".join(f"{outcomes[o]}{o.symbol}" for o in SEVERITY if o != Outcome.NOT_APPLICABLE and outcomes[o])


@dataclass
class Grid:
    points: list[str]
    columns: list[tuple[str, str]]
    squares: dict[tuple[str, tuple[str, str]], str]

    @classmethod
    def of(cls, cells: Sequence[dict[str, Any]]) -> Grid:
        skipped = set(left_out(cells))
        points = sorted({c["point"] for c in cells}, key=point_order)
        columns = sorted({column_of(c) for c in cells if "/".join(column_of(c)) not in skipped}, key=column_order)
        counts: dict[tuple[str, tuple[str, str]], Counter[Outcome]] = {}
        for c in cells:
            counts.setdefault((c["point"], column_of(c)), Counter())[Outcome(c["outcome"])] += 1
        return cls(points, columns, {key: square(n) for key, n in counts.items()})

    def backends(self) -> list[str]:
        return list(dict.fromkeys(b for b, _ in self.columns))


def _panels(grid: Grid, label_w: int, width: int) -> list[list[str]]:
    """Backends packed greedily into panels no wider than *width* (a backend wider than that gets its own)."""
    panels: list[list[str]] = [[]]
    used = label_w
    for backend in grid.backends():
        w = _block_width(grid, backend)
        if panels[-1] and used + GAP + w > width:
            panels.append([])
            used = label_w
        panels[-1].append(backend)
        used += GAP + w
    return panels


def _sub_widths(grid: Grid, backend: str) -> list[tuple[str, int]]:
    out = []
    for b, mode in grid.columns:
        if b == backend:
            label = MODE_LABELS.get(mode, mode)
            out.append((mode, max([len(label)] + [len(grid.squares.get((p, (b, mode)), "")) for p in grid.points])))
    return out


def _block_width(grid: Grid, backend: str) -> int:
    subs = _sub_widths(grid, backend)
    return max(len(backend), sum(w for _, w in subs) + len(subs) - 1)


def _panel_lines(grid: Grid, backends: list[str], label_w: int) -> list[str]:
    head1, head2 = " " * label_w, " " * label_w
    blocks = []
    for backend in backends:
        subs = _sub_widths(grid, backend)
        block_w = _block_width(grid, backend)
        pad = block_w - (sum(w for _, w in subs) + len(subs) - 1)
        subs[-1] = (subs[-1][0], subs[-1][1] + pad)  # a long backend name widens its last sub-column
        blocks.append((backend, subs))
        head1 += " " * GAP + backend.ljust(block_w)
        head2 += " " * GAP + " ".join(MODE_LABELS.get(m, m).rjust(w) for m, w in subs)
    lines = [head1.rstrip(), head2.rstrip()]
    group = None
    for point in grid.points:
        if group_of(point) != group:
            group = group_of(point)
            lines.append(group)
        row = ("  " + point).ljust(label_w)
        for backend, subs in blocks:
            row += " " * GAP + " ".join(grid.squares.get((point, (backend, m)), "").rjust(w) for m, w in subs)
        lines.append(row.rstrip())
    return lines


def text_grid(cells: Sequence[dict[str, Any]], width: int = WIDTH) -> list[str]:
    """The grid, one panel per group of backends that fits *width*, then the left-out note and the legend."""
    grid = Grid.of(cells)
    label_w = max(len(p) + 2 for p in grid.points)
    lines: list[str] = []
    for i, backends in enumerate(_panels(grid, label_w, width)):
        if i:
            lines.append("")
        lines += _panel_lines(grid, backends, label_w)
    lines += left_out_lines(cells)
    lines += textwrap.wrap(LEGEND, width, subsequent_indent="  ")
    lines += textwrap.wrap(MODES_LINE, width, subsequent_indent="  ")
    resumes = [text for mode, text in RESUME_LINES.items() if any(c["mode"] == mode for c in cells)]
    if resumes:
        lines += textwrap.wrap("resumed another way: " + ", ".join(resumes), width, subsequent_indent="  ")
    shown = [text for mode, text in FAULT_LINES.items() if any(c["mode"] == mode for c in cells)]
    if shown:
        lines += textwrap.wrap("faults, no crash (--crash-faults): " + ", ".join(shown), width, subsequent_indent="  ")
    return lines
