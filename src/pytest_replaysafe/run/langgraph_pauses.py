"""The ``approvals`` fixture on a LangGraph app: a run that comes back paused at an ``interrupt()`` (LangGraph's
own, or the approval ``ReplaySafeToolNode`` asks with) is answered with ``Command(resume={id: answer})``, as a
LangGraph user answers one, until the thread stands unpaused.

Each pause is shown to the person as a :class:`~tenxgraph.Interrupt` (so that one ``approvals.answer(rule)``
serves both runtimes): an approval asked by ``ReplaySafeToolNode`` (``{"kind": "approval", "tool", "args",
"tool_call_id"}``) as ``kind="approval"`` with the call's tool, arguments, assistant message and call id; any
other ``interrupt(value)`` as ``kind="interrupt"`` with its value. The harness logs what it was asked
(``asked``) and what it answered (``answered``), for the verdict (:mod:`pytest_replaysafe.judge.pauses`)."""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Mapping, Sequence
from functools import partial
from typing import TYPE_CHECKING, Any

from pytest_replaysafe.judge.evidence import Entry, ExecutionLog, call_id_of, fingerprint, preview
from pytest_replaysafe.run.approvals import MAX_ROUNDS, AtOnce
from tenxgraph.core.tools.interrupts import APPROVAL, QUESTION, Interrupt

if TYPE_CHECKING:
    from pytest_replaysafe.run.approvals import Approvals
    from tenxgraph.state.messages import JSON


def as_interrupt(interrupt_id: str, value: Any, messages: Sequence[Any]) -> tuple[Interrupt, str | None]:
    """A LangGraph interrupt as the person is shown it, and the harness's identity of the call it is about (an
    approval's: its assistant message and position in *messages*, the thread's LangChain messages)."""
    from tenxgraph.integrations.langgraph.messages import find_call

    plain: JSON = json.loads(json.dumps(value, default=str))
    if not (isinstance(value, Mapping) and value.get("kind") == APPROVAL and value.get("tool_call_id")):
        return Interrupt(interrupt_id, QUESTION, value=plain), None
    found = find_call(messages, value["tool_call_id"])
    message_id = found[0].id if found is not None else None
    asked = Interrupt(interrupt_id, APPROVAL, value=plain, tool=value.get("tool"), args=plain["args"],
                      message_id=message_id, call_id=value["tool_call_id"])  # fmt: skip
    return asked, (call_id_of(message_id, found[1]) if found is not None and message_id else None)


def answer_interrupts(
    app: Any,
    cfg: dict[str, Any],
    send: Callable[[Any], object],
    approvals: Approvals,
    log: ExecutionLog,
    at_once: AtOnce | None = None,
) -> None:
    """Answer the pauses of the LangGraph *app*'s thread (*cfg*) until it stands unpaused: *send(command)* runs
    the app once with a ``Command``; *at_once* (``resumers``): each answer from many processes first."""
    from langgraph.types import Command

    from tenxgraph.integrations.langgraph.messages import messages_of

    thread = str(cfg["configurable"]["thread_id"])
    for _ in range(MAX_ROUNDS):
        snapshot = app.get_state(cfg)
        if not snapshot.interrupts:
            return
        messages = messages_of(snapshot.values)
        asked: list[Interrupt] = []
        for pending in snapshot.interrupts:
            interrupt, call = as_interrupt(pending.id, pending.value, messages)
            asked.append(interrupt)
            log.write(Entry(thread, interrupt.id, "asked", interrupt.tool, call=call, cond=interrupt.kind,
                            out=preview(interrupt.value), via="langgraph"))  # fmt: skip
        decisions = {i.id: approvals.decide(i) for i in asked}
        approvals.keep(thread, asked, decisions)
        for interrupt_id, answer in decisions.items():
            log.write(Entry(thread, interrupt_id, "answered", fp=fingerprint(answer), out=preview(answer),
                            t=round(time.monotonic(), 6)))  # fmt: skip
        command: Any = Command(resume=decisions)
        if at_once is not None:
            at_once(partial(send, command))
        send(command)
    raise RuntimeError(f"thread {thread!r} paused {MAX_ROUNDS} times in one drive: a pause that never ends?")
