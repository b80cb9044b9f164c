"""The execution log: what really happened in every process of a cell, for the verdict to judge.

Two independent sources write to it: the runtime's tool events (a body started, returned with this output,
timed out, was found in doubt) and the harness's own wrapper around the checkpointer (a ledger record was
written, with this output). Each event is one ``write(2)`` to an ``O_APPEND`` file before the code goes on, so it
survives a kill -9 of the writing process and keeps the order in which the processes wrote.
"""

from __future__ import annotations

import hashlib
import json
import os
import time
from collections import Counter
from dataclasses import dataclass, fields
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from tenxgraph.core.graph.utils.instrument import ToolEvent
    from tenxgraph.core.tools.context import ToolCallInfo


def fingerprint(value: object) -> str | None:
    """A short digest of a JSON value (None for a value JSON cannot hold: the runtime turns it into an error)."""
    try:
        text = json.dumps(value, sort_keys=True, allow_nan=False)
    except (TypeError, ValueError):
        return None
    return hashlib.sha256(text.encode()).hexdigest()[:16]


PREVIEW_CHARS = 120


def preview(value: object) -> str:
    """The start of an output as text, for messages (the fingerprint is what the verdict compares)."""
    text = value if isinstance(value, str) else json.dumps(value, sort_keys=True, default=repr)
    return text if len(text) <= PREVIEW_CHARS else text[: PREVIEW_CHARS - 1] + "…"


#: The ``cond`` of a call no ledger guards (LangGraph's own ``ToolNode``, seen by the harness's watcher): once it has
#: returned, nothing records it, so running it again is a violation, not the after-return gap.
UNRECORDED = "unrecorded"


def call_id_of(message_id: str, index: int) -> str:
    """The harness's own identity of a tool call: its assistant message and its position there. Independent of
    the runtime's ledger key, so a broken key (say, ``tool_call_id`` alone) cannot blind the verdict."""
    return f"{message_id}:{index}"


@dataclass(frozen=True, slots=True)
class Entry:
    thread: str
    id: str  # the runtime's execution id: its ledger key (or its stand-in for a call without one)
    #: start, end, timeout, in_doubt, paused, rejected (runtime) | record, recorded, decided, journaled (a model
    #: turn's, by the checkpointer wrapper) | asked, pause_problem (the harness's person) | body, body_end,
    #: body_paused (the harness's witness inside the tool body: run.witness, run.pydantic_ai_watch)
    event: str
    tool: str | None = None
    fp: str | None = None  # fingerprint of the output (end, record; body_end of a Pydantic AI tool)
    ufp: str | None = None  # fingerprint of the state update, where there is one (end, record)
    group: int | None = None  # record: the size of the group commit it was written in (None: alone)
    error: bool = False
    cond: str | None = None  # timeout, missing_id, unrecorded
    policy: str | None = None  # the tool's in-doubt policy
    ikey: str | None = None  # the idempotency key the body was given (start)
    call: str | None = None  # the harness's call identity (runtime events; see call_id_of)
    effect: str | None = None  # the tool's effect class (read, idempotent, external), if it says one
    t: float | None = None  # when it was written: CLOCK_MONOTONIC, one clock for every process of the machine
    out: str | None = None  # the start of the output as text (end): what a person compares two runs by
    #: body events: "mcp" when the witness saw the request its MCP server received; "langgraph" when it saw a
    #: LangGraph tool's body through LangChain's callbacks; "pydantic_ai" a Pydantic AI agent's function tool
    #: (UNDECLARED: a tool whose declaration it could not read, or a bare agent's)
    via: str | None = None

    def answer(self) -> str:
        """The output's start, as a person reads it (an error result says so)."""
        text = repr(self.out) if self.out is not None else "an output"
        return f"the error {text}" if self.error else text

    @property
    def hid(self) -> str:
        """The call this entry is about: the harness's identity where known, else the runtime's key."""
        return self.call or self.id


#: ``via`` of a LangGraph tool's body events when the witness found no declaration for it (a tool node it cannot
#: read): its effect class and policy are then not judged against the runtime's.
UNDECLARED = "langgraph:undeclared"

#: Events that carry a call's answer: its body returned (``end``), or a person rejected it (``rejected``).
ANSWERS = ("end", "rejected")


def unrecorded(info: ToolCallInfo, event: str, output: object = None, error: bool = False) -> Entry:
    """A call no ledger guards, as a harness's watch of a bare framework logs it: its ``start``, or its ``end``
    with what it returned (*error*: it raised); with the declaration *info* carries (none: the framework's tool
    declares nothing the watch can read)."""
    ended = event == "end"
    return Entry(thread=info.thread_id, id=info.execution_id, event=event, tool=info.tool,
                 policy=info.on_in_doubt, effect=info.effect,
                 fp=fingerprint(output) if ended else None, error=error, cond=UNRECORDED,
                 call=call_id_of(info.message_id, info.index), t=round(time.monotonic(), 6),
                 out=preview(output) if ended else None)  # fmt: skip


def body_runs(entries: list[Entry], by_key: bool = False) -> Counter[str]:
    """How often each call's body ran (by the harness's call identity, or *by_key* the runtime's): its starts,
    less those that paused for a person (``interrupt()``), which run again once answered by design; counted from
    the runtime's events and from the harness's witness inside the body, the larger of the two."""
    runs: Counter[str] = Counter()
    seen: Counter[str] = Counter()  # the same, as the harness's witness saw the bodies (run.witness)
    for e in entries:
        if e.event in ("start", "paused"):
            runs[e.id if by_key else e.hid] += 1 if e.event == "start" else -1
        elif e.event in ("body", "body_paused"):
            seen[e.id if by_key else e.hid] += 1 if e.event == "body" else -1
    return +runs | +seen  # the larger account: a body the runtime ran without saying so still counts


_ENTRY_FIELDS = tuple(f.name for f in fields(Entry))  # (every one a scalar: no deep copy to make)


class ExecutionLog:
    def __init__(self, path: Path) -> None:
        self.path = path

    def write(self, entry: Entry) -> None:
        row = {k: v for k in _ENTRY_FIELDS if (v := getattr(entry, k)) not in (None, False)}
        row.setdefault("t", round(time.monotonic(), 6))
        line = json.dumps(row)
        fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        try:
            os.write(fd, (line + "\n").encode())
        finally:
            os.close(fd)

    def observe(self, event: ToolEvent) -> None:
        """The runtime's tool observer (``add_tool_observer``). Its ``recorded`` events are left out: records are
        logged by the harness's own checkpointer wrapper (:mod:`pytest_replaysafe.run.spy`)."""
        if event.kind == "recorded":
            return
        info = event.call
        cond = "timeout" if event.kind == "timeout" else ("missing_id" if info.key is None else None)
        self.write(
            Entry(
                thread=info.thread_id,
                id=info.execution_id,
                event=event.kind,
                tool=info.tool,
                fp=fingerprint(event.output) if event.kind in ANSWERS else None,
                ufp=fingerprint(event.update) if event.kind == "end" and event.update is not None else None,
                error=event.is_error,
                cond=cond,
                policy=info.on_in_doubt,
                ikey=info.idempotency_key if event.kind == "start" else None,
                call=call_id_of(info.message_id, info.index),
                t=round(event.at, 6),
                effect=info.effect,
                out=preview(event.output) if event.kind in ANSWERS else None,
            )
        )

    def entries(self, thread: str) -> list[Entry]:
        if not self.path.exists():
            return []
        # (only whole lines: a run's leftover thread may be writing one right now, and a read can see half of it)
        whole = self.path.read_text().rpartition("\n")[0]
        rows = (json.loads(line) for line in whole.splitlines() if line.strip())
        return [Entry(**row) for row in rows if row["thread"] == thread]


def unfinished(entries: list[Entry]) -> dict[str, str]:
    """Right after a crash: calls whose body was running (``in_flight``) or had returned without a durable record
    (``after_return``), from each call's last event. A call whose record write completed is not in this map."""
    last: dict[str, str] = {}
    calls_of: dict[str, set[str]] = {}  # runtime key -> harness call ids (records carry only the key)
    for e in entries:
        if e.call is not None:
            calls_of.setdefault(e.id, set()).add(e.call)
        if e.event in ("start", "end", "timeout", "paused"):
            last[e.hid] = e.event
        elif e.event in ("record", "recorded"):
            for call in calls_of.get(e.id, {e.id}):
                last[call] = e.event
    states = {"start": "in_flight", "end": "after_return", "record": "after_return"}
    return {call: states[event] for call, event in last.items() if event in states}


def unfinished_since(entries: list[Entry], start: int) -> dict[str, str]:
    """Right after a later crash: the calls :func:`unfinished` finds that also ran (started or returned) after
    ``entries[start]``, the previous crash; a call the resume never reached was already counted at that crash."""
    touched = {e.hid for e in entries[start:] if e.event in ("start", "end", "timeout")}
    return {call: state for call, state in unfinished(entries).items() if call in touched}
