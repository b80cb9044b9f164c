"""The matrix's own coverage: what its cells exercised, and what none of them reached.

A green matrix proves only what its cells reach. Each cell records what it exercised (:func:`of_cell`): whether
its crash fired, the sizes of the record groups (group commits) its runs wrote, the kinds of results its resumed
conversation was answered with (and which of them came from the ledger, so that their comparison with what the
body returned was made), its resume path, and the lock window a contest paused the lock holder at. The reports
sum them (:func:`summarize`) and list, per dimension, what no cell reached (:func:`lines`), in the terminal under
the grid, in the JSON report (``coverage``) and in the HTML report.
"""

from __future__ import annotations

import textwrap
from collections.abc import Iterable, Sequence
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from pytest_replaysafe.judge.verdict import HitEvidence

#: What a tool result can be, as the coverage counts it.
RESULT_KINDS = ("value", "error", "timeout", "in_doubt")
#: How a crashed run can be resumed: by the app again, by a stream, by runs contesting its lock, by the server's
#: recovery, and after the retention job ran.
RESUME_PATHS = ("app call", "stream", "contest", "recovery", "prune then resume")
_PATH_OF_MODE = {"stream": "stream", "concurrent": "contest", "recovery": "recovery", "prune": "prune then resume"}


def of_cell(evidence: HitEvidence, mode: str, window: str | None, framework: str = "tenxgraph") -> dict[str, Any]:
    """What one cell exercised (*window*: the lock window a contest paused the holder at, if one did; *framework*:
    what the test's app is built with, as its marker says)."""
    from pytest_replaysafe.judge.evidence import call_id_of

    groups = sorted({e.group or 1 for e in evidence.entries if e.event == "record"})
    doubted = {e.hid for e in evidence.entries if e.event == "in_doubt"}
    answered: set[str] = set()
    replayed: set[str] = set()
    by_call = {}
    for m in evidence.final_messages or []:
        for index, call in enumerate(m.tool_calls):
            by_call[str(call.id)] = call_id_of(m.message_id, index)
        if m.role != "tool":
            continue
        for r in m.tool_results:
            hid = by_call.get(str(r.call_id))
            kind = (
                "in_doubt"
                if hid in doubted
                else ("timeout" if r.status == "timeout" else ("error" if r.is_error else "value"))
            )
            answered.add(kind)
            if m.metadata.get("replayed"):
                replayed.add(kind)
    return {
        "crashed": evidence.crashed and not evidence.error,
        "groups": groups,
        "answered": sorted(answered),
        "replayed": sorted(replayed),
        "resume": _PATH_OF_MODE.get(mode, "app call"),
        "window": window,
        "framework": framework,
    }


def _split(reached: Iterable[str], every: Sequence[str]) -> dict[str, list[str]]:
    got = set(reached)
    return {"reached": [x for x in every if x in got], "not_reached": [x for x in every if x not in got]}


def summarize(cells: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """The coverage of a whole matrix (the JSON report's ``coverage``)."""
    from pytest_replaysafe.matrix.cells import LOCK_WINDOWS
    from tenxgraph.core.crashpoints import list_crash_points
    from tenxgraph.core.point_groups import APPROVAL_POINTS, FOREIGN_PREFIXES, FRAMEWORK_POINTS

    ran = [c for c in cells if c.get("coverage")]
    # what could have been reached depends on what the cells ran: our runtime, a LangGraph app or a Pydantic AI
    # agent (their points, and no run-lock contest, server recovery or retention job), or several
    frameworks = {c["coverage"].get("framework", "tenxgraph") for c in ran} or {"tenxgraph"}
    ours = "tenxgraph" in frameworks
    theirs = [points for name, points in FRAMEWORK_POINTS.items() if name in frameworks]
    points = [
        p.name
        for p in list_crash_points()
        if (ours and not p.name.startswith(FOREIGN_PREFIXES)) or any(p.name in t for t in theirs)
    ]
    if not any(c["point"] in APPROVAL_POINTS for c in cells):  # no test pauses for a person: nothing to reach there
        points = [p for p in points if p not in APPROVAL_POINTS]
    paths = RESUME_PATHS if ours else RESUME_PATHS[:2]
    largest: dict[str, int] = {}
    for c in ran:
        sizes = c["coverage"].get("groups") or [0]
        largest[c["backend"]] = max(largest.get(c["backend"], 0), max(sizes))
    crashed = {c["point"] for c in ran if c["coverage"].get("crashed")}
    crashed |= {str(c["then"]).rpartition("@")[0] for c in ran if c.get("then") and c["coverage"].get("crashed")}
    return {
        "crash_points": _split(crashed, points),
        "largest_record_group": dict(sorted(largest.items())),
        "results_answered": _split((k for c in ran for k in c["coverage"].get("answered", [])), RESULT_KINDS),
        "results_replayed": _split((k for c in ran for k in c["coverage"].get("replayed", [])), RESULT_KINDS),
        "resume_paths": _split((c["coverage"]["resume"] for c in ran if c["coverage"].get("crashed")), paths),
        "lock_windows": _split(
            (c["coverage"]["window"] for c in ran if c["coverage"].get("window")), LOCK_WINDOWS if ours else ()
        ),
    }


def lines(cov: dict[str, Any], width: int = 100) -> list[str]:
    """The coverage under the grid: per dimension what was reached, and what no cell reached."""

    def row(name: str, split: dict[str, list[str]]) -> str:
        total = len(split["reached"]) + len(split["not_reached"])
        missing = f"; not reached: {', '.join(split['not_reached'])}" if split["not_reached"] else ""
        return f"  {name:16} {len(split['reached'])} of {total}{missing}"

    def wrap(line: str) -> list[str]:
        return textwrap.wrap(line, width, subsequent_indent=" " * 19, break_on_hyphens=False)

    groups = cov["largest_record_group"]
    group_text = ", ".join(f"{b} {n}" for b, n in groups.items()) or "none written"
    single = [b for b, n in groups.items() if n < 2]
    group_note = f" (no group commit on {', '.join(single)})" if single else ""
    rows = [
        "coverage of this matrix (what its cells exercised; 'not reached': what no cell tested):",
        row("crash points", cov["crash_points"]),
        f"  {'record groups':16} largest per backend: {group_text}{group_note}",
        row("results answered", cov["results_answered"]),
        row("replayed+checked", cov["results_replayed"]),
        row("resume paths", cov["resume_paths"]),
        row("lock windows", cov["lock_windows"]),
    ]
    return [part for line in rows for part in wrap(line)]
