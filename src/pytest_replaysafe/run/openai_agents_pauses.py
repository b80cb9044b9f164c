"""The ``approvals`` fixture on an OpenAI Agents SDK run: a run function that returns the SDK's result with
``interruptions`` (a function tool with ``needs_approval``) paused; the harness answers it as the SDK's docs answer
one, from its ``RunState``: ``state.approve(item)`` or ``state.reject(item)`` for each interrupted call, then the
answered state saved as a string (``state.to_string()``) and the run function called again with it
(``run(thread_id=..., state=saved, **input)``), as the process that gets a person's answer does: it loads the
state (``RunState.from_string(agent, state)``) and resumes the run from it, until the run no longer pauses.

Each interrupted call is shown to the person as a :class:`~tenxgraph.Interrupt` of kind ``approval`` (id: its
``call_id``; its tool and arguments), so that one ``approvals.answer(rule)`` serves every runtime: ``True``
approves, ``False`` or a reason string rejects (the reason is the SDK's ``rejection_message``). The harness logs
what it was asked (``asked``, ``via="openai_agents"``) and, for a bare agent (one whose model ``replay_safe`` did
not journal: no ledger to record the answer in), what it answered (``answered``); a replay-safe run's decisions
are the ledger writes the harness's checkpointer wrapper sees (``decided``). The answered state is kept in the
cell's folder: a resume of the cell sends it again (a person's answer, retried), and in the ``resumers`` mode it is
sent by k processes at once first; in ``double-resume``, each answer is sent twice, and a resume first sends the
other answer, which must be refused (:func:`contradict`). The pause's crash points: ``approval.after_pause``
(the run came back paused; nobody has answered), fired here, and ``approval.after_decision`` (the answers are
recorded; the run that takes them has not begun), fired by ``run_replay_safe``."""

from __future__ import annotations

import inspect
import json
import os
from collections.abc import Callable
from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest

from pytest_replaysafe.judge.evidence import Entry, ExecutionLog, call_id_of
from pytest_replaysafe.run.approvals import MAX_ROUNDS
from tenxgraph.core.crashpoints import crash_point
from tenxgraph.core.tools.interrupts import APPROVAL, Interrupt

if TYPE_CHECKING:
    from pytest_replaysafe.run.approvals import Approvals, AtOnce
    from tenxgraph.state.messages import JSON

#: The ``via`` of what the harness logs about an OpenAI Agents SDK run's pauses (see the verdict's pauses).
VIA = "openai_agents"
#: The keyword a run function takes the answered state by.
STATE = "state"


def is_sdk_result(returned: object) -> bool:
    """The SDK's ``RunResult`` (or ``RunResultStreaming``), told without importing the SDK."""
    return any(c.__name__ in ("RunResult", "RunResultStreaming") and c.__module__ == "agents.result"
               for c in type(returned).__mro__)  # fmt: skip


def is_paused(returned: object) -> bool:
    """A run function's result that is a pause: the SDK's result with interruptions."""
    return is_sdk_result(returned) and bool(getattr(returned, "interruptions", None))


def takes_state(loop: Callable[..., Any]) -> bool:
    """Whether the run function takes the answered state (``state=``, or any keyword)."""
    params = inspect.signature(loop).parameters.values()
    return any(p.name == STATE or p.kind is inspect.Parameter.VAR_KEYWORD for p in params)


def is_bare(result: Any) -> bool:
    """A run of an agent whose model ``replay_safe`` did not journal (the harness's own view of its agent)."""
    from tenxgraph.integrations.openai_agents.journal import JournaledModel

    return not isinstance(getattr(result.last_agent, "model", None), JournaledModel)


def as_interrupt(item: Any) -> tuple[Interrupt, str]:
    """An interrupted call (``ToolApprovalItem``) as the person is shown it, with the harness's identity of its
    call (its response item, as the harness's watch of the call's body names it)."""
    from tenxgraph.integrations.openai_agents.tools import call_message_id

    raw = item.raw_item
    call_id = getattr(raw, "call_id", None)
    if not isinstance(call_id, str):
        raise pytest.UsageError(
            f"the OpenAI Agents SDK run paused on {item.tool_name!r}, which is not a function call: the approvals "
            "fixture answers function tools' approvals (needs_approval) only"
        )
    try:
        args: JSON = json.loads(getattr(raw, "arguments", None) or "{}")
    except ValueError:
        args = getattr(raw, "arguments", None)
    message_id = call_message_id(getattr(raw, "id", None), call_id)
    asked = Interrupt(call_id, APPROVAL, value={"tool": item.tool_name, "args": args}, tool=item.tool_name,
                      args=args, message_id=message_id, call_id=call_id)  # fmt: skip
    return asked, call_id_of(message_id, 0)


def answered_state(result: Any, decisions: dict[str, JSON]) -> str:
    """*result*'s ``RunState`` with each interrupted call answered as *decisions* says, saved as a string."""
    state = result.to_state()
    for item in state.get_interruptions():
        decision = decisions[item.raw_item.call_id]
        if decision is True:
            state.approve(item)
        elif decision is False or isinstance(decision, str):
            state.reject(item, rejection_message=decision if isinstance(decision, str) else None)
        else:
            raise pytest.UsageError(
                "approvals.answer: an OpenAI Agents SDK approval is answered True, False or a reason string; got "
                f"{decision!r}"
            )
    saved: str = state.to_string()
    return saved


def answer_interruptions(
    returned: object,
    send: Callable[[str], object],
    where: tuple[str, Path],
    approvals: Approvals,
    log: ExecutionLog,
    at_once: AtOnce | None = None,
    twice: bool = False,
) -> None:
    """Answer a run that came back paused (*returned*), and every pause after it, until the run ends: *send(state)*
    calls the run function with the answered state and returns what it returned. *where*: the thread, and the file
    the answered state is kept in (:func:`kept`). *twice* (``double-resume``): each answered state is sent a
    second time (a double click: it must change nothing, which the bodies the witness counts show), and the other
    answer is kept beside it for a resume to send first (:func:`contradict`)."""
    thread, path = where
    for _ in range(MAX_ROUNDS):
        if not is_paused(returned):
            return
        crash_point("approval.after_pause")
        result: Any = returned
        asked = [as_interrupt(item) for item in result.interruptions]
        decisions = approvals.ask(thread, asked, log, VIA, is_bare(result))
        saved = answered_state(result, decisions)
        if twice:  # (double-resume: the other answer, which a resume sends first and must see refused)
            flipped = {i: d is not True for i, d in decisions.items()}
            other = {"ids": sorted(decisions), "state": answered_state(result, flipped)}
            keep(path.with_suffix(".other"), json.dumps(other))
        keep(path, saved)
        if at_once is not None:
            at_once(partial(send, saved))
        returned = send(saved)
        if twice:
            send(saved)
    raise RuntimeError(f"thread {thread!r} paused {MAX_ROUNDS} times in one drive: a pause that never ends?")


def keep(path: Path, saved: str) -> None:
    """Keep the answered state where a resume in another process finds it (atomic: a kill leaves the last one
    kept, or this one)."""
    part = path.with_name(f"{path.name}.{os.getpid()}.part")
    part.write_text(saved)
    os.replace(part, path)


def kept(path: Path) -> str | None:
    """The last answered state of the thread, to send again (a person's answer retried), if one was kept."""
    return path.read_text() if path.exists() else None


def contradict(send: Callable[[str], object], path: Path, thread: str, log: ExecutionLog) -> None:
    """``double-resume``: before the kept answer is sent again, send the other one (each decision flipped: a
    second person, a stale tab), when every decision of its pause was seen written (``decided``): it must be
    refused (``InterruptDecidedError``) before anything runs; a runtime that takes it acts on an answer that
    does not stand. Another failure is the run's own."""
    from tenxgraph.utils.errors import InterruptDecidedError

    other = path.with_suffix(".other")
    if not other.exists():
        return
    kept_other = json.loads(other.read_text())
    decided = {e.id for e in log.entries(thread) if e.event == "decided"}
    if not set(kept_other["ids"]) <= decided:  # (a decision not recorded yet: the other answer would be the first)
        return
    try:
        send(kept_other["state"])
    except InterruptDecidedError:
        return  # refused, as it must be
    log.write(Entry(thread, "resume", "pause_problem", out=(
        f"a RunState answering {kept_other['ids']} otherwise than the recorded decisions was accepted: one "
        "decision per interrupt, a second, different one must be refused"
    )))  # fmt: skip
