"""Two crash-matrix reports of one seed, cell by cell: which cells changed outcome between a commit and the next.

    python -m pytest_replaysafe.report.compare BEFORE.json AFTER.json

Both reports come from the same command with a fixed ``--crash-seed`` (``make gate`` writes one). A cell is one
test item (point, backend, mode, a budgeted contest's window) at one hit and completion order (and second crash,
at depth 2). Printed:
every cell whose outcome changed, cells only one report has, and a count per change. Exit status 1 when a cell
that held before (``protected``, ``exactly_once``, ``in_doubt_handled``) now fails (``violation``, ``resume_failed``,
``error``, ``failed``) or a cell is missing after: the change must be explained before it lands; 0 otherwise (a
known gap named differently, a thread-race cell that moved, is printed for a person to judge, not failed).
"""

from __future__ import annotations

import sys
from collections import Counter
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

from pytest_replaysafe.matrix import report_file

#: Outcomes of a cell that held, and of one that failed (see :class:`pytest_replaysafe.judge.outcome.Outcome`).
HELD = frozenset({"protected", "exactly_once", "in_doubt_handled"})
BROKEN = frozenset({"violation", "resume_failed", "error", "failed"})
Key = tuple[str, ...]


def key(cell: Mapping[str, Any]) -> Key:
    """The test item (its id names the point, backend, mode and a budgeted contest's window), hit, order, then."""
    return str(cell["test"]), str(cell.get("hit")), str(cell.get("order")), str(cell.get("then") or "")


def cells(path: Path) -> dict[Key, Mapping[str, Any]]:
    try:
        data = report_file.read(path)
    except report_file.ReportFileError as exc:
        raise SystemExit(f"compare: {exc}; give a --crash-report JSON file") from exc
    return {key(c): c for c in data["cells"]}


def describe(k: Key) -> str:
    test, hit, order, then = k
    return f"{test} hit {hit} order {order}" + (f" then {then}" if then else "")


def compare(before: Mapping[Key, Mapping[str, Any]], after: Mapping[Key, Mapping[str, Any]]) -> tuple[list[str], int]:
    """The lines to print, and how many of them are regressions (held before, broken or missing after)."""
    lines: list[str] = []
    regressions = 0
    changes: Counter[str] = Counter()
    for k in sorted(set(before) | set(after)):
        old, new = before.get(k), after.get(k)
        was = old["outcome"] if old else "absent"
        now = new["outcome"] if new else "absent"
        gap_old, gap_new = (old or {}).get("gap"), (new or {}).get("gap")
        if was == now and gap_old == gap_new:
            continue
        bad = was in HELD and (now in BROKEN or now == "absent")
        regressions += bad
        changes[f"{was} -> {now}"] += 1
        detail = f": {new.get('detail', '')[:160]}" if new and now in BROKEN else ""
        gaps = f" (gap {gap_old} -> {gap_new})" if was == now else ""
        lines.append(f"{'REGRESSION ' if bad else ''}{describe(k)}: {was} -> {now}{gaps}{detail}")
    lines.append(
        f"{len(before)} cells before, {len(after)} after; {sum(changes.values())} changed"
        + "".join(f"; {n} {change}" for change, n in sorted(changes.items()))
    )
    return lines, regressions


def main(argv: Iterable[str]) -> int:
    args = list(argv)
    if len(args) != 2:
        print("usage: python -m pytest_replaysafe.report.compare BEFORE.json AFTER.json", file=sys.stderr)
        return 2
    lines, regressions = compare(cells(Path(args[0])), cells(Path(args[1])))
    print("\n".join(lines))
    if regressions:
        print(f"{regressions} cell(s) that held before fail or are missing now: explain each before this lands")
    return 1 if regressions else 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
