"""LangGraph's ``ToolNode`` with our ledger around each call: :class:`ReplaySafeToolCalls` (the
``wrap_tool_call`` / ``awrap_tool_call`` pair; :class:`~tenxgraph.integrations.langgraph.node.ReplaySafeToolNode`
is a ``ToolNode`` that uses it).

LangGraph runs the calls of one ``AIMessage`` concurrently and hands each to the wrapper on its own; the wrapper
calls the ledger's public entry (:func:`tenxgraph.ledger.invoke_tool_call`) with:

- the key: the persisted ``AIMessage.id`` + ``tool_call_id`` (``add_messages``, which ``MessagesState`` uses, gives
  every message an id when it is stored, so a resume sees the same id). A call without a ``tool_call_id``, or of
  an ``AIMessage`` without an id, runs without replay protection, with a WARNING naming it;
- the thread: the run's ``config["configurable"]["thread_id"]`` (no thread: a ``ConfigError``);
- the tool: LangGraph's ``execute(request)``, which validates, injects state and runs the real tool; its
  ``ToolMessage`` (content and status) is recorded as soon as it returns, before its siblings finish (siblings
  that return together are recorded in one write, the group commit of our own tool node: one ``RecordBatch`` per
  ``AIMessage`` and event loop, alive while a call of it is: :class:`tenxgraph.ledger.CallGroups`);
- the effect class, in-doubt policy and ``reconcile`` function of each tool, given by name to the constructor or
  in the tool's ``metadata`` (``{"effect": "read"}``, or the MCP annotations ``langchain-mcp-adapters`` puts there:
  ``{"readOnlyHint": true, ...}``), with the same meaning and checks as ``@tool(...)``; the
  call's idempotency key is :func:`current_idempotency_key` in the tool's body.

A recorded call is answered from its record: a ``ToolMessage`` with the recorded content and status,
``response_metadata={"replayed": True}``; every result message's id derives from the ledger key, so a replay
yields the same message. Not recorded: a tool's ``artifact`` (a replay has none) and a ``Command`` result (the
call is answered with an error naming it, recorded, and never runs again; see docs/langgraph.md).
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from typing import TypedDict

from langchain_core.messages import AIMessage
from langchain_core.tools import BaseTool
from langgraph.errors import GraphBubbleUp
from langgraph.prebuilt.tool_node import ToolCallRequest

from tenxgraph.core.tools.interrupts import ApprovalRule
from tenxgraph.integrations.langgraph.ledger_tool import (
    AsyncExecute,
    Bubble,
    Execute,
    Policy,
    Result,
    answer,
    ledger_tool,
    rejecting,
)
from tenxgraph.integrations.langgraph.messages import assistant_message, find_call, messages_of
from tenxgraph.integrations.langgraph.pauses import (
    Pause,
    check_rule,
    consume_once,
    needs_approval,
    resume_values,
    scratchpad,
)
from tenxgraph.ledger import (
    CallGroups,
    Effect,
    LedgerStore,
    Reconcile,
    Records,
    check_policy,
    current_idempotency_key,
    effect_from_hints,
    invoke_tool_call,
    ledger_key,
)
from tenxgraph.state.messages import Message
from tenxgraph.utils.constants import LOGGER_NAME, TOOL_TIMEOUT
from tenxgraph.utils.errors import ConfigError
from tenxgraph.utils.memo import IdentityMemo
from tenxgraph.utils.sync import run_sync, to_thread

__all__ = ["AsyncExecute", "Execute", "ReplaySafeToolCalls", "Result", "current_idempotency_key"]
log = logging.getLogger(LOGGER_NAME)

#: What was declared for a tool, checked: ``(on_in_doubt, reconcile, effect)``.
PolicyOf = tuple[str | None, Reconcile | None, Effect | None]

#: Where LangGraph keeps a run's ``durability`` in its config (absent: its default, ``"async"``).
DURABILITY_KEY = "__pregel_durability"


class ToolCallsOptions(TypedDict, total=False):
    """What :class:`ReplaySafeToolCalls` takes besides the ledger (its middleware passes them on)."""

    tool_timeout: float | None
    effects: Mapping[str, str] | None
    on_in_doubt: Mapping[str, str] | None
    reconcile: Mapping[str, Reconcile] | None
    approvals: Mapping[str, ApprovalRule] | None


class ReplaySafeToolCalls:
    """The ledger as LangGraph tool-call wrappers: ``ToolNode(tools, wrap_tool_call=calls.wrap_tool_call,
    awrap_tool_call=calls.awrap_tool_call)`` (sync and async graphs). *ledger*: the checkpointer that holds the
    records (``SqliteCheckpointer``, ``PgCheckpointer``, ``InMemoryCheckpointer``); LangGraph's own saver keeps
    the graph's state as before. *effects*, *on_in_doubt*, *reconcile*, *approvals*: per tool name, as
    ``@tool(...)`` takes them (a tool's ``metadata`` may say them too); a step LangGraph resumes is consumed once
    across resumers (:mod:`.pauses`)."""

    def __init__(
        self,
        ledger: LedgerStore,
        *,
        tool_timeout: float | None = TOOL_TIMEOUT,
        effects: Mapping[str, str] | None = None,
        on_in_doubt: Mapping[str, str] | None = None,
        reconcile: Mapping[str, Reconcile] | None = None,
        approvals: Mapping[str, ApprovalRule] | None = None,
        messages_key: str = "messages",
    ) -> None:
        if not isinstance(ledger, LedgerStore):
            raise ConfigError(
                f"ledger={ledger!r} is not a tenxgraph ledger store: pass SqliteCheckpointer(path), "
                "PgCheckpointer(...), InMemoryCheckpointer() or a store with tenxgraph.ledger.LedgerStore's methods "
                "(LangGraph's saver stays the graph's checkpointer)"
            )
        self.ledger = ledger
        self.tool_timeout = tool_timeout
        self.effects = dict(effects or {})
        self.on_in_doubt = dict(on_in_doubt or {})
        self.reconcile = dict(reconcile or {})
        self.approvals = dict(approvals or {})
        #: How long a resumer waits for the lock of a call another resumer of the same pause runs (pauses.py).
        self.lock_wait = (tool_timeout or TOOL_TIMEOUT) + 30.0
        self.messages_key = messages_key
        self._durability_warned = False
        self._groups = CallGroups()  # what each AIMessage's calls under way share (tenxgraph.ledger.CallGroups)
        # LangGraph hands every call of a step the same AIMessage and tool objects: each is converted and checked
        # once, not once per call (N calls of one message: N conversions of N calls each)
        self._messages: IdentityMemo[AIMessage, Message] = IdentityMemo(assistant_message, fingerprint=_shape)
        self._policies: IdentityMemo[BaseTool, PolicyOf] = IdentityMemo(self._check_policy)

    def check(self, tools: Sequence[BaseTool]) -> None:
        """Check every tool's effect class and in-doubt policy now (a ``ConfigError`` naming the tool)."""
        for tool in tools:
            self._policy(tool)
            self._approval(tool)

    # -- the wrappers ------------------------------------------------------------------------------------------
    def wrap_tool_call(self, request: ToolCallRequest, execute: Execute) -> Result:
        """``ToolNode(wrap_tool_call=...)``: called once per tool call, in LangGraph's worker thread."""

        async def run(req: ToolCallRequest) -> Result:
            return await to_thread(execute, req)

        return run_sync(self._through_ledger(request, run, execute))

    async def awrap_tool_call(self, request: ToolCallRequest, execute: AsyncExecute) -> Result:
        """``ToolNode(awrap_tool_call=...)``: the same, for ``ainvoke`` / ``astream``."""
        return await self._through_ledger(request, execute)

    # -- one call ------------------------------------------------------------------------------------------
    async def _through_ledger(
        self, request: ToolCallRequest, execute: AsyncExecute, sync_execute: Execute | None = None
    ) -> Result:
        """*sync_execute*: LangGraph's own ``execute`` in a sync graph (a transactional tool on SQLite runs it in
        the thread that holds its transaction)."""
        call = request.tool_call
        thread_id = _thread_of(request)
        found = find_call(messages_of(request.state, self.messages_key), call.get("id"))
        if found is None or found[0].id is None:
            why = "its AIMessage has no id" if found is not None else "no AIMessage in the state asked for it"
            log.warning(
                "tool call %r (%r) runs without replay protection: %s (keep add_messages on the messages "
                "channel, as MessagesState does: it gives every stored message an id) (thread %r)",
                call.get("name"), call.get("id"), why, thread_id,
            )  # fmt: skip
            return await execute(request)
        ai, index = found
        self._check_durability(request, thread_id)
        config = getattr(request.runtime, "config", None)
        answers = resume_values(config)  # (a step LangGraph resumes: its calls are consumed once, pauses.py)
        asks = request.tool is not None and needs_approval(self._approval(request.tool), call.get("args") or {})
        if not answers and not asks:
            return await self._record(request, execute, sync_execute, ai, index, thread_id)
        key = ledger_key(ai.id, call.get("id")) or ""
        pause = Pause(self.ledger, thread_id, str(ai.id), key, call, config, answers, asks, self.lock_wait)

        async def run(rejected: str | None, read: Records) -> Result:  # (read: the call's record, read just now)
            if rejected is None:
                return await self._record(request, execute, sync_execute, ai, index, thread_id, read)
            return await self._record(request, *rejecting(request, rejected), ai, index, thread_id, read)

        try:
            return await consume_once(pause, run)
        except GraphBubbleUp:  # it paused before the ledger (its approval): its siblings stop waiting for it
            self._groups.pass_over(self.ledger, thread_id, self._messages.get(ai), _execution(request), index)
            raise

    async def _record(
        self,
        request: ToolCallRequest,
        execute: AsyncExecute,
        sync_execute: Execute | None,
        ai: AIMessage,
        index: int,
        thread_id: str,
        read: Records | None = None,
    ) -> Result:
        """The call through the ledger: replayed from its record, or run and recorded. The calls of one execution
        of the step share one ledger read (LangGraph's task scratchpad names the execution), unless *read* gives
        this call's (made under the step's lock, or for its approval)."""
        fresh: list[Result] = []  # what LangGraph's execute returned, when the tool ran here
        lc_tool = request.tool
        declared = self._policy(lc_tool) if lc_tool is not None else (None, None, None)
        tool = ledger_tool(request, execute, sync_execute, fresh, Policy(*declared, self._transactions))
        message = self._messages.get(ai)
        group = self._groups.join(self.ledger, thread_id, message, _execution(request))
        config = getattr(request.runtime, "config", None)  # (resumed: its calls pass one at a time, unordered)
        try:
            execution = await invoke_tool_call(
                message, index, {tool.name: tool}, self.ledger, thread_id, tool_timeout=self.tool_timeout,
                group=group if read is None else group.reading(read, ordered=not resume_values(config)),
            )  # fmt: skip
        except Bubble as bubble:  # nothing is recorded: LangGraph runs the tool again when the run resumes
            raise bubble.inner from None
        finally:
            self._groups.passed(group)
        return answer(execution, request.tool_call, fresh)

    def _check_durability(self, request: ToolCallRequest, thread_id: str) -> None:
        """The first time a run's durability is not ``"sync"``, a WARNING. With LangGraph's default
        (``"async"``) a step's checkpoint is saved while the next step runs: a crash before the model's step is
        saved loses its AIMessage while that message's tools may have run, and the model, asked again, sends a new
        message with new ids, whose calls are new calls to the ledger."""
        if self._durability_warned:
            return
        configurable = (getattr(request.runtime, "config", None) or {}).get("configurable") or {}
        durability = configurable.get(DURABILITY_KEY, "async")
        if durability != "sync":
            self._durability_warned = True
            log.warning(
                "ReplaySafeToolNode runs with durability=%r (thread %r): a crash before the model's step is saved "
                "loses the AIMessage whose tools ran, and the model asks again with new ids, so those calls run "
                "again; invoke the graph with durability='sync' (see docs/langgraph.md)",
                durability, thread_id,
            )  # fmt: skip

    @property
    def _transactions(self) -> str | None:
        """How the ledger runs a tool's write in its record's transaction: ``"sync"`` (SQLite, in the thread that
        holds it), ``"async"`` (PostgreSQL), or None (a store that has none)."""
        return getattr(self.ledger, "transactions", None)

    def _approval(self, tool: BaseTool) -> ApprovalRule | None:
        """The tool's approval rule, given to the constructor or in its ``metadata`` (None: it needs none)."""
        return check_rule(tool.name, self.approvals.get(tool.name, (tool.metadata or {}).get("approval")))

    def _policy(self, tool: BaseTool) -> PolicyOf:
        """``(on_in_doubt, reconcile, effect)`` of a LangChain tool, checked (once per tool object)."""
        return self._policies.get(tool)

    def _check_policy(self, tool: BaseTool) -> PolicyOf:
        meta = tool.metadata or {}
        policy = self.on_in_doubt.get(tool.name, meta.get("on_in_doubt"))
        reconcile = self.reconcile.get(tool.name, meta.get("reconcile"))
        try:
            declared = self.effects.get(tool.name, meta.get("effect"))
            # a tool loaded from an MCP server (langchain-mcp-adapters puts its annotations in the metadata)
            effect = check_policy(policy, reconcile, declared if declared is not None else effect_from_hints(meta))
        except (TypeError, ValueError) as exc:
            raise ConfigError(f"LangGraph tool {tool.name!r}: {exc}") from None
        if effect is Effect.TRANSACTIONAL and self._transactions not in ("sync", "async"):
            raise ConfigError(
                f"LangGraph tool {tool.name!r}: effect='transactional' writes in the transaction of its ledger "
                f"record, which the {type(self.ledger).__name__} ledger does not run: keep the ledger on "
                "SqliteCheckpointer or PgCheckpointer, or say 'external' or 'idempotent'"
            )
        return policy, reconcile, effect


def _shape(ai: AIMessage) -> object:
    """What of an ``AIMessage`` its conversion depends on, checked on every reuse in constant time: a message
    given a new id, new calls or a new list of them in place is converted again."""
    return ai.id, id(ai.tool_calls), len(ai.tool_calls)


def _thread_of(request: ToolCallRequest) -> str:
    config = getattr(request.runtime, "config", None) or {}
    thread = (config.get("configurable") or {}).get("thread_id")
    if not thread:
        raise ConfigError(
            f"tool call {request.tool_call.get('name')!r}: the run has no thread, so its calls cannot be recorded: "
            "compile the graph with a checkpointer and invoke it with config={'configurable': {'thread_id': ...}}"
        )
    return str(thread)


def _execution(request: ToolCallRequest) -> object | None:
    """What names this execution of the step: LangGraph's task scratchpad (one per task run, shared by its
    calls; a resumed or re-run step has a new one). None: the calls read one by one."""
    return scratchpad(getattr(request.runtime, "config", None))
