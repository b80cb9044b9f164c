"""Exposure: how long each tool's calls sit in the windows where a crash makes them run twice, and what that means
at a given crash rate.

For every clean run the harness makes (one per matrix item), the execution log gives each call's *in-flight*
window (its body started, not yet returned) and its *after-return* window (returned, record not yet durable; the
record write, measured from its start, since the harness's turn-taking between the two is not production's).
A crash that lands in either window makes the call run again on resume (the in_flight and after_return gaps),
unless the tool uses an idempotency key or an in-doubt policy. With crashes arriving at random at rate λ per
process, the expected duplicates per million calls are ``1e6 x λ x (in-flight + after-return)``: a number to put
next to an SLO. It is only as true as the test's tools are slow: a scripted tool returns at once, a real one
may take seconds, and its in-flight window with it.
"""

from __future__ import annotations

import re
import statistics
from collections.abc import Iterable, Sequence
from typing import Any

from pytest_replaysafe.judge.evidence import Entry

EXPOSURE_PROPERTY = "replaysafe_exposure"
UNITS = {"s": 1.0, "sec": 1.0, "min": 60.0, "h": 3600.0, "hour": 3600.0, "day": 86400.0, "week": 7 * 86400.0}
_RATE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*/\s*(\d+(?:\.\d+)?)?\s*([a-z]+)\s*$")
DEFAULT_RATE = "1/day"


def parse_rate(text: str) -> float:
    """``"1/day"``, ``"3/week"``, ``"1/12h"`` -> crashes per second. ValueError names the accepted forms."""
    found = _RATE.match(text.lower())
    unit = found.group(3) if found else ""
    unit = unit if unit in UNITS else unit.rstrip("s")  # days, hours, weeks
    if found is None or unit not in UNITS:
        raise ValueError(
            f"crash rate {text!r}: give crashes per period such as 1/day, 3/week, 1/12h or 2/min "
            f"(units: {', '.join(sorted(UNITS))})"
        )
    return float(found.group(1)) / (float(found.group(2) or 1) * UNITS[unit])


def windows(entries: Sequence[Entry]) -> dict[str, list[tuple[float, float]]]:
    """Per tool, each call's ``(in_flight_s, after_return_s)`` in one run's log: from its start to the moment its
    body returned, and the write of its record (from its start to durable). The wait for a turn that the harness's
    completion order puts between the two is left out: production has no such wait. A call without a durable
    record is left out."""
    calls = {e.id: e.call for e in entries if e.call is not None}
    start: dict[str, float] = {}
    end: dict[str, float] = {}
    writing: dict[str, float] = {}
    tool: dict[str, str] = {}
    out: dict[str, list[tuple[float, float]]] = {}
    for e in entries:
        if e.t is None:
            continue
        hid = e.call or calls.get(e.id, e.id)
        if e.tool:
            tool.setdefault(hid, e.tool)
        if e.event in ("start", "end", "record"):
            {"start": start, "end": end, "record": writing}[e.event].setdefault(hid, e.t)
        elif e.event == "recorded" and all(hid in d for d in (start, end, writing, tool)):
            out.setdefault(tool[hid], []).append((end[hid] - start[hid], max(e.t - writing[hid], 0.0)))
    return out


def summarize(samples: Iterable[dict[str, Any]], rate_per_s: float) -> list[dict[str, Any]]:
    """One row per (tool, backend) over every clean run's windows: medians, calls measured, expected duplicates
    per million calls at *rate_per_s*."""
    grouped: dict[tuple[str, str], list[tuple[float, float]]] = {}
    for sample in samples:
        for tool, pairs in sample["windows"].items():
            grouped.setdefault((tool, sample["backend"]), []).extend((a, b) for a, b in pairs)
    rows = []
    for (tool, backend), pairs in sorted(grouped.items()):
        in_flight = statistics.median(a for a, _ in pairs)
        after = statistics.median(b for _, b in pairs)
        rows.append(
            {
                "tool": tool,
                "backend": backend,
                "calls": len(pairs),
                "in_flight_ms": round(in_flight * 1000, 3),
                "after_return_ms": round(after * 1000, 3),
                "duplicates_per_million_calls": round(1e6 * rate_per_s * (in_flight + after), 6),
            }
        )
    return rows


def lines(rows: Sequence[dict[str, Any]], rate: str) -> list[str]:
    """The terminal table (within 100 columns)."""
    if not rows:
        return []
    out = [
        f"exposure at {rate} crashes per process: median windows of the clean runs (a real tool's in-flight",
        "window is its latency) and the duplicates a crash there causes without an idempotency key:",
        f"  {'tool':24} {'backend':15} {'calls':>6} {'in flight':>10} {'after return':>13} {'dups / 1M calls':>16}",
    ]
    for r in rows:
        out.append(
            f"  {r['tool'][:24]:24} {r['backend'][:15]:15} {r['calls']:>6} {r['in_flight_ms']:>8.3f}ms "
            f"{r['after_return_ms']:>11.3f}ms {r['duplicates_per_million_calls']:>16.4g}"
        )
    return out
