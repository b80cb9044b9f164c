"""Crash-matrix reports: the terminal grid, ``--crash-report`` JSON (schema ``replaysafe.crash-matrix/1``) and the
same grid as Markdown (for ``$GITHUB_STEP_SUMMARY``). All built from the cells' JSON records."""

from __future__ import annotations

import json
import re
import textwrap
from collections import Counter
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

from pytest_replaysafe.judge.gaps import GAPS_DOC
from pytest_replaysafe.judge.outcome import LEGEND, Outcome
from pytest_replaysafe.report import grid
from pytest_replaysafe.report.replay import smallest_first

SCHEMA = "replaysafe.crash-matrix/1"


def plural(n: int, word: str) -> str:
    """``1 cell``, ``2 cells``."""
    return f"{n} {word}{'' if n == 1 else 's'}"


def summary(cells: Iterable[dict[str, Any]]) -> dict[str, int]:
    counts = Counter(c["outcome"] for c in cells)
    return {str(o): counts.get(str(o), 0) for o in Outcome}


def cell_order(cell: dict[str, Any]) -> tuple[Any, ...]:
    """The order of a report's cells: by test item, then hit and completion order (a run's and a merge's alike)."""
    return cell["test"], cell["point"], cell["backend"], cell["mode"], cell["hit"], cell.get("order", 0)


def matrix_lines(cells: Sequence[dict[str, Any]], exposure: dict[str, Any]) -> list[str]:
    """What the terminal shows of a matrix before its closing lines: the grid, the coverage, each failure with its
    repro (the smallest failing schedule first) and the exposure's rows (*exposure*: its rate and rows)."""
    from pytest_replaysafe.judge import coverage
    from pytest_replaysafe.judge.exposure import lines as exposure_lines

    lines = text_grid(cells) + coverage.lines(coverage.summarize(cells)) + failure_lines(cells)
    return lines + exposure_lines(exposure["rows"], exposure["rate"])


def failed_at_gap(cells: Iterable[dict[str, Any]]) -> int:
    """Cells whose test's own assertions failed where a documented gap re-ran a call (they keep the gap's name)."""
    return sum(1 for c in cells if c["outcome"] == Outcome.FAILED and c.get("gap"))


def to_json(
    cells: Sequence[dict[str, Any]],
    seed: int,
    exposure: dict[str, Any] | None = None,
    schedules: dict[str, int] | None = None,
) -> dict[str, Any]:
    from pytest_replaysafe.judge.coverage import summarize

    data = {"schema": SCHEMA, "seed": seed, "cells": list(cells), "summary": summary(cells)}
    data["failed_at_known_gap"] = failed_at_gap(cells)
    data["coverage"] = summarize(cells)
    if schedules is not None:  # depth 2: how many schedules ran of how many, enumerated and sampled
        data["schedules"] = schedules
    if exposure is not None:
        data["exposure"] = exposure
    return data


def write_json(
    path: Path,
    cells: Sequence[dict[str, Any]],
    seed: int,
    exposure: dict[str, Any] | None = None,
    schedules: dict[str, int] | None = None,
    shard: dict[str, Any] | None = None,
) -> None:
    """One cell per line: small enough to keep, still readable with ``grep`` and ``jq``. A shard's report
    (``--crash-shard``) carries its part of the plan under ``shard``."""
    path.parent.mkdir(parents=True, exist_ok=True)
    data = to_json(cells, seed, exposure, schedules)
    if shard is not None:
        data["shard"] = shard
    rows = ",\n".join("    " + json.dumps(c, separators=(",", ":")) for c in data.pop("cells"))
    head = json.dumps(data, indent=2)[:-2]  # without the closing brace
    path.write_text(f'{head},\n  "cells": [\n{rows}\n  ]\n}}\n')


def totals_line(cells: Sequence[dict[str, Any]]) -> str:
    return ", ".join(f"{n} {o}" for o, n in summary(cells).items() if n) or "no cells"


def text_grid(cells: Sequence[dict[str, Any]], width: int = grid.WIDTH) -> list[str]:
    """The grid (see :mod:`.grid`), the known gaps it shows with their reasons, and the totals."""
    lines = grid.text_grid(cells, width) + gap_notes(cells, width) + doubt_notes(cells, width)
    lines += textwrap.wrap(f"cells: {len(cells)} ({totals_line(cells)})", width, subsequent_indent="  ")
    return lines


def gap_notes(cells: Sequence[dict[str, Any]], width: int = grid.WIDTH) -> list[str]:
    """One footnote per known gap rule shown: the points it was seen at, and why the gap table expects a second
    execution there."""
    points: dict[tuple[str, str], list[str]] = {}
    for c in sorted(cells, key=lambda c: grid.point_order(c["point"])):
        if c["outcome"] == Outcome.KNOWN_GAP:
            for name, reason in (c.get("gap_reasons") or {}).items():
                seen = points.setdefault((name, reason), [])
                if c["point"] not in seen:
                    seen.append(c["point"])
    lines = []
    for (name, reason), where in points.items():
        lines += textwrap.wrap(f"g at {', '.join(where)}: {reason} (gap {name})", width, subsequent_indent="    ")
    return lines


def doubt_notes(cells: Sequence[dict[str, Any]], width: int = grid.WIDTH) -> list[str]:
    """One footnote per point where a call was settled in doubt by not running it and its effect never happened:
    ``d`` there means the model was told of a doubt and nothing was done (not that the effect was done once)."""
    points: Counter[str] = Counter()
    calls: dict[str, set[str]] = {}
    for c in cells:
        if c["outcome"] == Outcome.IN_DOUBT_HANDLED and c.get("not_applied"):
            points[c["point"]] += 1
            calls.setdefault(c["point"], set()).update(_ARGS.sub(r"\1", label) for label in c["not_applied"])
    lines = []
    for point in sorted(points, key=grid.point_order):
        text = (
            f"d at {point}: in {plural(points[point], 'cell')} {', '.join(sorted(calls[point]))} was not run again "
            "and had not taken effect: nothing was done, and the model was shown the in-doubt result (each "
            "cell's detail in --crash-report or --crash-html says what it was shown and answered)"
        )
        lines += textwrap.wrap(text, width, subsequent_indent="    ", break_on_hyphens=False)
    return lines


def test_name(nodeid: str) -> str:
    """``path::test_refund[point-backend-mode]`` -> ``test_refund`` (the cell's own fields name the rest)."""
    return nodeid.split("[")[0].rsplit("::", 1)[-1]


_RAN = re.compile(r" executed (\d+) times")
_ARGS = re.compile(r"(\w+)\((?:[^()']|'[^']*')*\)")


def what_happened(detail: str, room: int) -> str:
    """The first problem of a cell's detail, with call arguments left out, in at most *room* characters."""
    problems = [p for p in detail.split("; ") if p]
    short = _RAN.sub(r" ran \1 times", _ARGS.sub(r"\1", problems[0])) if problems else ""
    if len(problems) > 1:
        short += f" (+{len(problems) - 1} more)"
    if len(short) > room and ": " in short:  # the gist before the explanation (which follows in full)
        short = short.split(": ", 1)[0]
    return short if len(short) <= room else short[: max(room - 1, 0)] + "…"


def failure_lines(cells: Sequence[dict[str, Any]], width: int = grid.WIDTH) -> list[str]:
    """Per failing cell: one line naming outcome, test, point, hit, backend, mode and what happened (the tool
    and, say, "executed 2 times"), then the whole detail where it says more (wrapped, never cut), then the
    repro command on a line of its own (whole, so that it can be copied)."""
    lines = []
    for cell in sorted(cells, key=smallest_first):  # per test, its smallest failing schedule first
        if Outcome(cell["outcome"]).failing:
            then = f" then {cell['then']}" if cell.get("then") else ""
            head = (
                f"{cell['outcome'].upper()}{' (expected: xfail)' if cell.get('expected') else ''} "
                f"{test_name(cell['test'])} at {cell['point']} hit {cell['hit']}{then}, "
                f"{cell['backend']}/{cell['mode']}: "
            )
            if cell.get("expected"):  # a test marked xfail: one line each (--runxfail shows all of it)
                lines.append(head + what_happened(cell["detail"], width - len(head)))
                continue
            if cell["outcome"] == Outcome.FAILED and cell.get("gap"):  # the gist: where, not the assertion
                short = what_happened(f"at known gap {cell['gap']}", width - len(head))
            else:
                short = what_happened(cell["detail"], width - len(head))
            lines.append(head + short)
            if short != cell["detail"]:
                lines += textwrap.wrap(
                    cell["detail"],
                    width,
                    initial_indent="    ",
                    subsequent_indent="    ",
                    break_long_words=False,
                    break_on_hyphens=False,
                )
            if cell["repro"]:
                lines.append(f"    repro: {cell['repro']}")
    return lines


def closing_lines(
    cells: Sequence[dict[str, Any]], reports: Sequence[Path] = (), xfailed: int = 0, depth2: str | None = None
) -> list[str]:
    """Three lines a person reads last: what was proved, the known gaps (the xfailed tests), where the reports are
    (long paths wrap onto a fourth); with depth 2, how many schedules ran comes before the reports."""
    counts = summary(cells)
    names = {c["backend"] for c in cells if c["outcome"] != Outcome.NOT_APPLICABLE}
    backends = ", ".join(sorted(names, key=lambda b: grid.column_order((b, ""))))
    failing = {o: n for o, n in summary(c for c in cells if not c.get("expected")).items() if n and Outcome(o).failing}
    expected = {o: n for o, n in summary(c for c in cells if c.get("expected")).items() if n and Outcome(o).failing}
    held = counts[Outcome.PROTECTED] + counts[Outcome.IN_DOUBT_HANDLED] + counts[Outcome.EXACTLY_ONCE]
    if failing:
        what = ", ".join(f"{n} {o}" for o, n in failing.items())
        unit = "cell" if sum(failing.values()) == 1 else "cells"
        first = f"NOT PROVED: {what} {unit} (each one is above, with its repro command)"
    elif held:  # (protected, in doubt handled, exactly once: what the HTML headline counts too)
        first = f"proved: {plural(held, 'cell')} held on {backends}: no recorded tool call ran twice"
    else:
        first = "proved: nothing: no cell held (every cell was a known gap or not applicable)"
    gaps = counts[Outcome.KNOWN_GAP]
    tests = f" ({plural(xfailed, 'xfailed test')})" if xfailed else ""
    second = (
        f"known gaps: {plural(gaps, 'cell')}{tests} re-ran a call where documented: docs/replay-safe-tools.md"
        if gaps
        else "known gaps: none shown"
    )
    at_gap = failed_at_gap(cells)
    if at_gap:  # the test's own assertions saw the documented re-run: the remedy, not the runtime, is the fix
        second += (
            f"; failed at a known gap: {plural(at_gap, 'cell')} (the test's assertions saw a documented re-run; "
            f"each failure above names the call and the remedy: {GAPS_DOC})"
        )
    third = "reports: " + ("  ".join(str(p) for p in reports) if reports else "none written (see --crash-report)")
    before: list[str] = []
    if expected:  # a test marked xfail: the failures it shows on purpose (a "before"), listed above all the same
        what = ", ".join(f"{n} {o}" for o, n in expected.items())
        before = [
            f"expected to fail: {what} cells in tests marked xfail (one line each above; --runxfail shows their "
            "details and repro commands, and counts them)"
        ]
    return [
        line
        for text in (first, second, *before, *([depth2] if depth2 else []), third)
        for line in textwrap.wrap(
            text, grid.WIDTH, subsequent_indent="  ", break_long_words=False, break_on_hyphens=False
        )
    ]


def markdown(cells: Sequence[dict[str, Any]], seed: int) -> str:
    g = grid.Grid.of(cells)
    names = [f"{b}/{m}" for b, m in g.columns]
    out = [f"### Crash matrix (seed {seed})", "", "| point | " + " | ".join(names) + " |"]
    out.append("|---|" + "---|" * len(names))
    group = None
    for p in g.points:
        if grid.group_of(p) != group:
            group = grid.group_of(p)
            out.append(f"| *{group}* |" + " |" * len(names))
        out.append(f"| `{p}` | " + " | ".join(g.squares.get((p, c), "") for c in g.columns) + " |")
    out += ["", *grid.left_out_lines(cells), LEGEND, "", f"**{len(cells)} cells:** {totals_line(cells)}", ""]
    notes = gap_notes(cells, width=10_000)
    if notes:
        out += ["Known gaps shown:", "", *(f"- {line}" for line in notes), ""]
    from pytest_replaysafe.judge.coverage import lines, summarize

    head, *rows = lines(summarize(cells), width=10_000)
    out += [head[0].upper() + head[1:], "", *(f"- {row.strip()}" for row in rows), ""]
    return "\n".join(out)


def exposure_markdown(rows: Sequence[dict[str, Any]], rate: str) -> str:
    if not rows:
        return ""
    out = [
        f"#### Exposure at {rate} crashes per process",
        "",
        "| tool | backend | calls | in flight ms | after return ms | duplicates per million calls |",
        "|---|---|---|---|---|---|",
    ]
    for r in rows:
        out.append(
            f"| `{r['tool']}` | {r['backend']} | {r['calls']} | {r['in_flight_ms']} | {r['after_return_ms']} | "
            f"{r['duplicates_per_million_calls']:.4g} |"
        )
    return "\n".join(out) + "\n"
