"""LangGraph's ``interrupt()`` consumed once: a tool step that LangGraph resumes (``Command(resume=...)``) runs
each of its calls under the step's lock, and the answers it brings are recorded in the ledger first.

LangGraph itself lets every process that resumes one parked interrupt run the resumed step: k resumers, k
refunds. Under :class:`~tenxgraph.integrations.langgraph.tools.ReplaySafeToolCalls` a resumed step (LangGraph's
scratchpad holds answers for it) goes, call by call:

1. under the step's lock (the ledger's own run lock, named after the thread and the AIMessage: a PostgreSQL
   advisory lock, a byte of SQLite's lock file; released when its process dies), waiting while another resumer
   holds it (the step's calls take it in turn, so a resumed step runs its calls one at a time);
2. its answers are recorded under ``decision:{message id}:{n}`` (the step's n-th answer), first write wins: a
   resumer whose answer differs from the recorded one is refused with ``InterruptDecidedError`` before anything
   runs (the recorded one stands); the same answer again goes on;
3. then through the ledger as any call: the one resumer that runs it records its result, and every later one
   (it waited for the lock) replays that record: one effect, one stored ``ToolMessage``, agreeing with the ledger.

A fresh step pays nothing of this. And approvals: a tool declared ``approval`` (``approvals={"refund": True}`` on
the node or middleware, or ``metadata={"approval": True}``, or a predicate on the call's arguments) asks with
LangGraph's own ``interrupt({"kind": "approval", ...})`` before it runs, unless its call was recorded; ``True``
approves, ``False`` or a reason string rejects (an error ``ToolMessage`` naming it, recorded: it never runs).
"""

from __future__ import annotations

import hashlib
import json
import logging
from collections.abc import Awaitable, Callable, Mapping, Sequence
from contextlib import AbstractAsyncContextManager
from dataclasses import dataclass
from typing import Any, TypeVar

from tenxgraph.core.tools.interrupts import APPROVAL, ApprovalRule, is_approved, rejection_text
from tenxgraph.core.tools.tool import check_approval
from tenxgraph.ledger import LedgerStore, Records, record_first_answers, waiting_lock
from tenxgraph.state.messages import JSON
from tenxgraph.utils.constants import LOGGER_NAME
from tenxgraph.utils.errors import ConfigError

log = logging.getLogger(LOGGER_NAME)
R = TypeVar("R")

#: Where LangGraph keeps a task's scratchpad (its answers to the task's interrupts) in the task's config.
SCRATCHPAD_KEY = "__pregel_scratchpad"


def scratchpad(config: Mapping[str, Any] | None) -> object | None:
    """The running task's scratchpad (None outside a task): one per execution of the task, shared by its calls."""
    return ((config or {}).get("configurable") or {}).get(SCRATCHPAD_KEY)


def resume_values(config: Mapping[str, Any] | None) -> list[Any]:
    """The answers LangGraph holds for the running task's interrupts, in order (the ones it answered before, then
    the new one of ``Command(resume=...)``); empty in a fresh step."""
    pad: Any = scratchpad(config)
    if pad is None:
        return []
    values = list(getattr(pad, "resume", None) or [])
    get_null_resume = getattr(pad, "get_null_resume", None)
    new = get_null_resume(False) if get_null_resume is not None else None
    return values if new is None else [*values, new]


def decision_key(message_id: str, index: int) -> str:
    """Where the step of AIMessage *message_id* records the answer to its *index*-th interrupt."""
    return f"decision:{message_id}:{index}"


def canonical(value: Any) -> JSON:
    """An answer as the ledger stores it (JSON, keys sorted): what two answers are compared by."""
    loaded: JSON = json.loads(json.dumps(value, sort_keys=True, default=str))
    return loaded


async def settle_answers(
    ledger: LedgerStore, thread_id: str, message_id: str, answers: Sequence[Any], found: dict[str, dict[str, JSON]]
) -> None:
    """Record *answers* as the decisions of the step (those not recorded yet, in one write); raise
    :class:`InterruptDecidedError` if one differs from the decision recorded before it (that one stands).
    *found*: the ledger's records, read under the step's lock, of at least the step's decision keys."""
    keys = [decision_key(message_id, i) for i in range(len(answers))]
    records = {
        key: (key, {"v": 1, "kind": "decision", "value": canonical(a)}) for key, a in zip(keys, answers, strict=True)
    }
    await record_first_answers(ledger, thread_id, records, found)


def lock_name(thread_id: str, message_id: str) -> str:
    """The run-lock name of one resumed step (a digest: it fits every backend's thread-id rule)."""
    return "langgraph-step-" + hashlib.sha256(f"{thread_id}\x00{message_id}".encode()).hexdigest()[:40]


def call_lock(ledger: LedgerStore, thread_id: str, message_id: str, wait: float) -> AbstractAsyncContextManager[None]:
    """Hold the lock of the step of AIMessage *message_id* (waiting up to *wait* seconds while another resumer
    holds it; then :class:`ThreadBusyError`). The step's calls take it in turn within a process
    (:func:`tenxgraph.ledger.waiting_lock`)."""
    return waiting_lock(ledger, lock_name(thread_id, message_id), thread_id, wait, "one LangGraph interrupt")


def check_rule(tool: str, rule: object) -> ApprovalRule | None:
    """An approval rule as given (None: no approval), checked as ``@tool(approval=...)`` is, or a ``ConfigError``
    naming the tool."""
    if rule is None:
        return None
    try:
        return check_approval(tool, rule) or None
    except TypeError:
        raise ConfigError(
            f"LangGraph tool {tool!r}: approval={rule!r} is not a rule: say True (always), False (never) or a "
            "function of the call's arguments that returns whether a person must approve it"
        ) from None


def needs_approval(rule: ApprovalRule | None, args: dict[str, Any]) -> bool:
    if rule is None or isinstance(rule, bool):
        return bool(rule)
    return bool(rule(args))


def approval_question(call: Mapping[str, Any]) -> dict[str, JSON]:
    """What the approval interrupt shows the person (its value in ``result["__interrupt__"]``)."""
    return {"kind": APPROVAL, "tool": call["name"], "args": canonical(call.get("args") or {}),
            "tool_call_id": call.get("id")}  # fmt: skip


def ask_approval(config: Mapping[str, Any] | None, question: dict[str, JSON]) -> Any:
    """LangGraph's own ``interrupt(question)`` in the task of *config* (from any thread), whose answer must be a
    bool or a string (its ``response_schema``: LangGraph checks an answer before it keeps it, so a bad one is
    refused with a ``ConfigError`` and the question can be answered again); LangGraph's ``GraphInterrupt`` when
    the step has no answer yet."""
    from langchain_core.runnables.config import var_child_runnable_config
    from langgraph.types import interrupt
    from pydantic import StrictBool, StrictStr, ValidationError

    token = var_child_runnable_config.set(dict(config or {}))  # type: ignore[arg-type]
    try:
        return interrupt(question, response_schema=StrictBool | StrictStr)  # type: ignore[arg-type]
    except ValidationError as exc:
        raise ConfigError(
            f"the approval of LangGraph tool {question['tool']!r} takes Command(resume=True) (approve), False or "
            f"a reason string (reject); the answer given is neither, and nothing was kept: answer again ({exc})"
        ) from exc
    finally:
        var_child_runnable_config.reset(token)


def rejection(tool: str, answer: bool | str) -> str | None:
    """None if *answer* approves the call, else what the model is told."""
    return None if is_approved(answer) else rejection_text(tool, answer)


@dataclass(frozen=True)
class Pause:
    """One call of a step that may pause: what :func:`consume_once` needs."""

    ledger: LedgerStore
    thread_id: str
    message_id: str
    key: str
    call: Mapping[str, Any]
    config: Mapping[str, Any] | None
    answers: list[Any]
    asks: bool
    wait: float


async def consume_once(pause: Pause, run: Callable[[str | None, Records], Awaitable[R]]) -> R:
    """The call of *pause* through the ledger, once across resumers: ``run(None, read)`` runs it through the
    ledger, ``run(text, read)`` records its rejection *text* instead; *read*: the ledger's records of the call,
    read here (under the step's lock when resumed), which the ledger answers from."""
    ledger, thread_id, key = pause.ledger, pause.thread_id, pause.key
    if not pause.answers:  # a fresh step: a call that needs approval asks, unless it was recorded
        found = await ledger.aget_tool_results(thread_id, [key])
        if pause.asks and not _is_result(found.get(key)):
            ask_approval(pause.config, approval_question(pause.call))
        return await run(None, found)
    async with call_lock(ledger, thread_id, pause.message_id, pause.wait):
        decisions = [decision_key(pause.message_id, i) for i in range(len(pause.answers))]
        found = await ledger.aget_tool_results(thread_id, [key, *decisions])  # (the call's record too: one read)
        rejected: str | None = None
        if pause.asks and not _is_result(found.get(key)):
            rejected = rejection(pause.call["name"], ask_approval(pause.config, approval_question(pause.call)))
        await settle_answers(ledger, thread_id, pause.message_id, pause.answers, found)
        return await run(rejected, found)


def _is_result(record: dict[str, JSON] | None) -> bool:
    return record is not None and record.get("kind") != "intent"
