"""Crash-matrix reports: the terminal grid, ``--crash-report`` JSON (schema ``replaysafe.crash-matrix/1``) and the
same grid as Markdown (for ``$GITHUB_STEP_SUMMARY``). All built from the cells' JSON records."""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

from pytest_replaysafe.outcome import LEGEND, SEVERITY, Outcome

SCHEMA = "replaysafe.crash-matrix/1"


def summary(cells: Iterable[dict[str, Any]]) -> dict[str, int]:
    counts = Counter(c["outcome"] for c in cells)
    return {str(o): counts.get(str(o), 0) for o in Outcome}


def to_json(cells: Sequence[dict[str, Any]], seed: int) -> dict[str, Any]:
    return {"schema": SCHEMA, "seed": seed, "cells": list(cells), "summary": summary(cells)}


def write_json(path: Path, cells: Sequence[dict[str, Any]], seed: int) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(to_json(cells, seed), indent=2) + "\n")


def _point_order(point: str) -> tuple[int, str]:
    """Rows in the order the points fire in a run (the crash-point table's order), your own points last."""
    from tenxgraph.core.crashpoints import POINTS

    order = [p.name for p in POINTS]
    return (order.index(point) if point in order else len(order), point)


def _grid(cells: Sequence[dict[str, Any]]) -> tuple[list[str], list[str], dict[tuple[str, str], str]]:
    """Points (in firing order), columns, and per square the count of each outcome, worst first (``"5+ 2g"``).
    A column whose every cell is not applicable is left out (see :func:`left_out`)."""
    points = sorted({c["point"] for c in cells}, key=_point_order)
    columns = sorted({f"{c['backend']}/{c['mode']}" for c in cells} - set(left_out(cells)))
    counts: dict[tuple[str, str], Counter[Outcome]] = {}
    for c in cells:
        counts.setdefault((c["point"], f"{c['backend']}/{c['mode']}"), Counter())[Outcome(c["outcome"])] += 1
    squares: dict[tuple[str, str], str] = {}
    for square, outcome_counts in counts.items():
        if set(outcome_counts) == {Outcome.NOT_APPLICABLE}:
            squares[square] = Outcome.NOT_APPLICABLE.symbol
            continue
        squares[square] = " ".join(
            f"{outcome_counts[o]}{o.symbol}" for o in SEVERITY if o != Outcome.NOT_APPLICABLE and outcome_counts[o]
        )
    return points, columns, squares


def left_out(cells: Sequence[dict[str, Any]]) -> list[str]:
    """Columns (``backend/mode``) in which no cell applies: in-memory storage with a killed process."""
    outcomes: dict[str, set[str]] = {}
    for c in cells:
        outcomes.setdefault(f"{c['backend']}/{c['mode']}", set()).add(c["outcome"])
    return sorted(column for column, seen in outcomes.items() if seen == {str(Outcome.NOT_APPLICABLE)})


def _left_out_line(cells: Sequence[dict[str, Any]]) -> list[str]:
    columns = left_out(cells)
    if not columns:
        return []
    return [f"not applicable, left out: {', '.join(columns)} (that storage does not survive a killed process)"]


def totals_line(cells: Sequence[dict[str, Any]]) -> str:
    return ", ".join(f"{n} {o}" for o, n in summary(cells).items() if n) or "no cells"


def text_grid(cells: Sequence[dict[str, Any]]) -> list[str]:
    points, columns, squares = _grid(cells)
    width = max(len(p) for p in points)
    col_w = [max([len(c)] + [len(squares.get((p, c), "")) for p in points]) for c in columns]
    lines = [" " * width + "  " + "  ".join(c.rjust(w) for c, w in zip(columns, col_w, strict=True))]
    for p in points:
        row = [squares.get((p, c), "") for c in columns]
        lines.append(p.ljust(width) + "  " + "  ".join(s.rjust(w) for s, w in zip(row, col_w, strict=True)))
    lines += _left_out_line(cells)
    lines.append(LEGEND)
    lines.append(f"cells: {len(cells)} ({totals_line(cells)})")
    return lines


def failure_lines(cells: Sequence[dict[str, Any]]) -> list[str]:
    lines = []
    for cell in cells:
        if Outcome(cell["outcome"]).failing:
            lines.append(f"{cell['outcome'].upper()} {cell['test']} hit {cell['hit']}: {cell['detail']}")
            if cell["repro"]:
                lines.append(f"  repro: {cell['repro']}")
    return lines


def markdown(cells: Sequence[dict[str, Any]], seed: int) -> str:
    points, columns, squares = _grid(cells)
    out = [f"### Crash matrix (seed {seed})", "", "| point | " + " | ".join(columns) + " |"]
    out.append("|---|" + "---|" * len(columns))
    for p in points:
        row = [squares.get((p, c), "") for c in columns]
        out.append(f"| `{p}` | " + " | ".join(row) + " |")
    out += ["", *_left_out_line(cells), LEGEND, "", f"**{len(cells)} cells:** {totals_line(cells)}", ""]
    gaps = sorted({(c["point"], c["gap"]) for c in cells if c["outcome"] == Outcome.KNOWN_GAP})
    if gaps:
        out.append("Known gaps shown: " + ", ".join(f"`{p}` ({g})" for p, g in gaps))
        out.append("")
    return "\n".join(out)
