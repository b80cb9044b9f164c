"""Verdicts for crash-matrix cells, from the recorded history of tool executions and the final state."""

from __future__ import annotations

import json
import os
from collections import Counter
from collections.abc import Iterable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from pytest_replaysafe.gaps import GapRule, find_gap
from tenxgraph.core.graph.utils.invoke_node_handler import ToolCallInfo
from tenxgraph.core.state.messages import Message

OUTCOMES = ("protected", "in_doubt_handled", "known_gap", "violation", "vacuous", "not_applicable", "error")
FAILING = frozenset({"violation", "vacuous", "error"})


@dataclass
class CellResult:
    """One (point, hit, backend, mode) of one test, as the JSON report's ``cells`` entries."""

    test: str
    point: str
    hit: int
    backend: str
    mode: str
    outcome: str
    gap: str | None = None
    executions: dict[str, int] = field(default_factory=dict)
    duration_s: float = 0.0
    repro: str = ""
    detail: str = ""
    #: Effects the provider simulator actually applied on the cell's thread, per kind (when the test uses it).
    effects_applied: dict[str, int] = field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


class ExecutionLog:
    """Append-only record of every tool-body execution. Each event is one ``write(2)`` to an O_APPEND file before
    the code goes on, so it survives a kill -9 of the writing process (the kernel holds it); no fsync is needed
    because the matrix kills processes, not the machine."""

    def __init__(self, path: Path) -> None:
        self.path = path

    def observe(self, info: ToolCallInfo, event: str) -> None:
        condition = None
        if event == "timeout":
            condition = "timeout"
        elif info.key is None:
            condition = "missing_id"
        line = json.dumps(
            {
                "thread": info.thread_id,
                "id": info.execution_id,
                "tool": info.tool,
                "event": event,
                "cond": condition,
                "policy": info.on_in_doubt,
            }
        )
        fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        try:
            os.write(fd, (line + "\n").encode())
        finally:
            os.close(fd)

    def entries(self, thread_id: str) -> list[dict[str, Any]]:
        if not self.path.exists():
            return []
        rows = [json.loads(line) for line in self.path.read_text().splitlines() if line.strip()]
        return [r for r in rows if r["thread"] == thread_id]

    def unfinished(self, thread_id: str) -> dict[str, str]:
        """Right after a crash: calls whose body was running (``in_flight``) or had returned without its record
        written yet (``after_return``), from each call's last event. A recorded call is never in this map."""
        last: dict[str, str] = {}
        for row in self.entries(thread_id):
            if row["event"] != "in_doubt":
                last[row["id"]] = row["event"]
        states = {"start": "in_flight", "end": "after_return"}
        return {eid: states[event] for eid, event in last.items() if event in states}

    def handled_in_doubt(self, thread_id: str) -> set[str]:
        """Calls a resume found in doubt and settled without running them (policy fail or reconcile)."""
        return {
            r["id"]
            for r in self.entries(thread_id)
            if r["event"] == "in_doubt" and r.get("policy") in ("fail", "reconcile")
        }

    def history(
        self, thread_id: str, tools: Iterable[str] | None = None, unfinished: dict[str, str] | None = None
    ) -> tuple[Counter[str], dict[str, str]]:
        """Executions per execution id, and each id's gap condition: how it was unfinished at the crash
        (in_flight, after_return), or timeout, missing_id."""
        allowed = set(tools) if tools is not None else None
        counts: Counter[str] = Counter()
        conditions: dict[str, str] = dict(unfinished or {})
        for row in self.entries(thread_id):
            if allowed is not None and row["tool"] not in allowed:
                continue
            if row["event"] == "start":
                counts[row["id"]] += 1
            if row["cond"] and row["id"] not in conditions:
                conditions[row["id"]] = row["cond"]
        return counts, conditions


def result_problems(messages: Sequence[Message]) -> list[str]:
    """Every tool call must have exactly one result, right after its assistant message; no stray results."""
    problems: list[str] = []
    i = 0
    while i < len(messages):
        message = messages[i]
        i += 1
        if message.role == "tool":
            ids = [r.call_id for r in message.tool_results]
            problems.append(f"tool result(s) {ids} do not follow an assistant message asking for them")
            continue
        if message.role != "assistant" or not message.tool_calls:
            continue
        asked = Counter(str(c.id) for c in message.tool_calls)
        got: Counter[str] = Counter()
        while i < len(messages) and messages[i].role == "tool":
            got.update(str(r.call_id) for r in messages[i].tool_results)
            i += 1
        if asked != got:
            lost = sorted((asked - got).elements())
            extra = sorted((got - asked).elements())
            problems.append(f"assistant message {message.message_id}: lost results for {lost}, extra results {extra}")
    return problems


@dataclass
class HitEvidence:
    crashed: bool
    window: str | None  # execution id of the call in the crash window; "*" = any call of the re-run node
    executions: Counter[str]
    conditions: dict[str, str]
    final_messages: Sequence[Message] | None
    final_text: str | None
    clean_text: str
    resume_error: str | None = None
    error: str | None = None
    in_doubt_handled: set[str] = field(default_factory=set)


def verdict(
    evidence: HitEvidence, rules: Iterable[GapRule], point: str, mode: str, backend: str
) -> tuple[str, str | None, str]:
    """``(outcome, gap name, detail)`` for one hit."""
    rules = list(rules)
    if evidence.error:
        return "error", None, evidence.error
    if not evidence.crashed:
        return "vacuous", None, f"the run finished without reaching {point} at this hit"
    if evidence.resume_error:
        return "violation", None, f"resume failed: {evidence.resume_error}"
    problems = result_problems(evidence.final_messages or [])
    if evidence.final_text != evidence.clean_text:
        problems.append(f"final answer {evidence.final_text!r} differs from the clean run's {evidence.clean_text!r}")
    gaps: set[str] = set()
    for eid, n in sorted(evidence.executions.items()):
        if n < 2:
            continue
        rule = None
        if evidence.window in ("*", eid):  # the call the crash (or fault) hit: the point's own gap, if any
            rule = find_gap(rules, point, None, mode, backend)
        condition = evidence.conditions.get(eid)
        if rule is None and condition is not None:  # a call left unfinished, or unprotected by its nature
            rule = find_gap(rules, point, condition, mode, backend)
        if rule is None:
            problems.append(f"{eid} executed {n} times")
        else:
            gaps.add(rule.name)
    if problems:
        return "violation", None, "; ".join(problems)
    if gaps:
        return "known_gap", ",".join(sorted(gaps)), "duplicate where the gap table expects one"
    if evidence.in_doubt_handled and evidence.window in ({"*"} | evidence.in_doubt_handled):
        return "in_doubt_handled", None, "the call in the crash window was in doubt and settled without a re-run"
    return "protected", None, "every recorded call executed at most once"
