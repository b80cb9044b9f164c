"""A cell's story in order, for the HTML report: each tool execution and ledger record before the crash, the
crash, and what the resume ran again or answered from the ledger (the report adds the verdict and the gap rule).
Built from the execution log (:mod:`pytest_replaysafe.judge.evidence`), so it shows what happened, not what the runtime
says happened."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from pytest_replaysafe.judge.evidence import Entry

Event = dict[str, str]

_WORDS = {
    "start": "started",
    "end": "returned",
    "timeout": "timed out and was cancelled",
    "in_doubt": "was found in doubt",
    "recorded": "ledger record written",
    "record_failed": "ledger record write FAILED (the store refused it)",
}
_HOW = {
    "inprocess": "crash (in-process)",
    "sigkill": "kill -9 of the run's process",
    "stream": "crash while streaming",
    "concurrent": "the lock holder stops; a second run contests the thread",
    "drop": "every PostgreSQL connection of the run's process dropped",
    "outage": "PostgreSQL unreachable",
    "redis-down": "Redis unreachable",
    "readonly": "SQLite storage read-only",
}


def crash_text(point: str, hit: int, mode: str) -> str:
    """What the harness did: a crash at the point, or a fault there and a crash at the node's end."""
    from tenxgraph.core.crashpoints import get_crash_point

    how = _HOW.get(mode, mode)
    if point == "ledger.read_error":
        return f"{how} at node.after_complete (after ledger read {hit}); the resume's ledger read fails"
    if get_crash_point(point).kind == "fault":
        return f"{point} fails (hit {hit}), then {how} at node.after_complete"
    return f"{how} at {point}, hit {hit}"


def _calls_of(entries: Sequence[Entry]) -> dict[str, str]:
    """Runtime key -> the harness's call id (records carry only the key)."""
    return {e.id: e.call for e in entries if e.call is not None}


def _line(entry: Entry, label: str, again: bool) -> str:
    if entry.event == "start" and again:
        return f"{label} started AGAIN: its body runs a second time"
    text = f"{label} {_WORDS.get(entry.event, entry.event)}"
    if entry.event == "end" and entry.error:
        text += " an error"
    if entry.event == "in_doubt" and entry.policy:
        text += f" (policy {entry.policy})"
    return text


@dataclass(frozen=True, slots=True)
class Schedule:
    """What was done to a hit's run: the crash (or fault) at *point*'s *hit*-th arrival in *mode* (*crashed*:
    whether it fired), what a fault did before the resume (*before_resume*), the second crash of a depth-2
    schedule (*second*: how many log entries were written before it, and what it was), and (a fault the run
    outlived) where its resume began, when not at the fault (*resume_from*)."""

    point: str
    hit: int
    mode: str
    crashed: bool
    before_resume: str | None = None
    second: tuple[int, str] | None = None
    resume_from: int | None = None


def build(
    entries: Sequence[Entry],
    crashed_at: int,
    labels: Mapping[str, str],
    schedule: Schedule,
    resume_error: str | None = None,
) -> list[Event]:
    """*entries*: the hit thread's log after the resume; *crashed_at*: how many of them were written before the
    crash; *labels*: call id -> ``tool(args)``; *schedule*: what was done to the run."""
    point, hit, mode, crashed = schedule.point, schedule.hit, schedule.mode, schedule.crashed
    before_resume, second = schedule.before_resume, schedule.second
    resume_from = crashed_at if schedule.resume_from is None else schedule.resume_from
    calls = _calls_of(entries)
    tools = {e.call or calls.get(e.id, e.id): e.tool for e in entries if e.tool}
    events: list[Event] = []
    started: set[str] = set()
    recorded: set[str] = set()
    again: set[str] = set()
    for i, entry in enumerate(entries):
        if i == crashed_at and crashed:
            events.append({"phase": "crash", "kind": "crash", "text": crash_text(point, hit, mode)})
            if before_resume:
                events.append({"phase": "crash", "kind": "fault", "text": before_resume})
        if second is not None and i == second[0]:
            events.append({"phase": "crash", "kind": "crash", "text": second[1]})
        hid = calls.get(entry.id, entry.id) if entry.call is None else entry.call
        label = labels.get(hid, entry.tool or hid)
        phase = "run" if i < resume_from or not crashed else "resume"
        if entry.event == "record":  # the write's start; "recorded" says it finished
            continue
        event = {"phase": phase, "kind": entry.event, "text": _line(entry, label, hid in started)}
        if entry.tool:
            event["tool"] = entry.tool
        events.append(event)
        if entry.event == "start":
            started.add(hid)
            if phase == "resume":
                again.add(hid)
        elif entry.event == "recorded" and phase == "run":
            recorded.add(hid)
    if crashed and crashed_at >= len(entries):
        events.append({"phase": "crash", "kind": "crash", "text": crash_text(point, hit, mode)})
        if before_resume:
            events.append({"phase": "crash", "kind": "fault", "text": before_resume})
    if second is not None and second[0] >= len(entries):
        events.append({"phase": "crash", "kind": "crash", "text": second[1]})
    if not crashed:
        return events
    for hid in sorted(recorded - again):
        events.append(
            {
                "phase": "resume",
                "kind": "replay",
                "tool": tools.get(hid, ""),
                "text": f"{labels.get(hid, hid)} answered from its ledger record (not run again)",
            }
        )
    if resume_error:
        events.append({"phase": "resume", "kind": "error", "text": f"the resume failed: {resume_error}"})
    return events
