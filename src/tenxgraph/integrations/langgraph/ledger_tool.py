"""One LangGraph tool call as the ledger sees it: LangGraph's own ``execute`` (the real tool) wrapped as the
ledger's :class:`~tenxgraph.ledger.Tool` (:func:`ledger_tool`), and the ``ToolMessage`` LangGraph gets back for
the call's execution, run here or replayed from its record (:func:`answer`)."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from typing import Any

from langchain_core.messages import ToolMessage
from langgraph.errors import GraphBubbleUp
from langgraph.prebuilt.tool_node import ToolCallRequest
from langgraph.types import Command

from tenxgraph.ledger import (
    TX_PARAM,
    Effect,
    Reconcile,
    Tool,
    ToolExecution,
    ToolOutput,
    Transaction,
    in_transaction,
    result_message_id,
    statements_done,
)
from tenxgraph.state.messages import JSON
from tenxgraph.utils.errors import ConfigError

__all__ = ["AsyncExecute", "Bubble", "Execute", "Policy", "Result", "answer", "ledger_tool", "rejecting"]

Result = ToolMessage | Command  # type: ignore[type-arg]
Execute = Callable[[ToolCallRequest], Result]
AsyncExecute = Callable[[ToolCallRequest], Awaitable[Result]]


@dataclass(frozen=True)
class Policy:
    """What was declared for the call's tool (checked), and how the ledger's store runs a transactional one
    (``"sync"``: SQLite, in the thread that holds the transaction; ``"async"``: PostgreSQL; None: it cannot)."""

    on_in_doubt: str | None
    reconcile: Reconcile | None
    effect: Effect | None
    transactions: str | None


class Bubble(BaseException):
    """Carries LangGraph's ``GraphBubbleUp`` (an ``interrupt()``, a command for the parent graph) through the ledger,
    which records what an ``Exception`` says; this is no result of the call."""

    def __init__(self, inner: GraphBubbleUp) -> None:
        super().__init__(str(inner))
        self.inner = inner


def ledger_tool(
    request: ToolCallRequest, execute: AsyncExecute, sync_execute: Execute | None, fresh: list[Result], policy: Policy
) -> Tool:
    """The call's tool as the ledger runs it: LangGraph's ``execute`` (the real tool), answering with the
    ``ToolMessage``'s content and status, which the ledger records; each result LangGraph returned is appended to
    *fresh*. A transactional tool's ``execute`` runs inside its record's transaction, which its body reads with
    ``current_transaction()`` (on SQLite *sync_execute*, in the thread that holds it)."""
    call, effect = request.tool_call, policy.effect

    def output(result: Result) -> ToolOutput:
        fresh.append(result)
        if not isinstance(result, ToolMessage):
            raise TypeError(
                f"tool {call['name']!r} returned a {type(result).__name__}, which the ledger cannot record yet: "
                "return a ToolMessage or plain content from tools that ReplaySafeToolNode protects"
            )
        return ToolOutput(as_json(result.content), is_error=result.status == "error")

    async def run(**args: Any) -> ToolOutput:  # (LangGraph validates and passes the arguments)
        try:
            if effect is not Effect.TRANSACTIONAL:
                return output(await execute(request))
            transaction = Transaction(args[TX_PARAM], asyncio.get_running_loop())  # PostgreSQL
            try:
                with in_transaction(transaction):
                    return output(await execute(request))
            finally:  # (cancelled while the tool's thread runs a statement: the transaction ends after it)
                await statements_done(transaction)
        except GraphBubbleUp as exc:  # an interrupt() in the tool: LangGraph's control flow, not a result
            raise Bubble(exc) from exc

    def run_in_thread(**args: Any) -> ToolOutput:  # SQLite: in the worker thread that holds the transaction
        assert sync_execute is not None
        try:
            with in_transaction(Transaction(args[TX_PARAM])):
                return output(sync_execute(request))
        except GraphBubbleUp as exc:
            raise Bubble(exc) from exc

    in_thread = effect is Effect.TRANSACTIONAL and policy.transactions == "sync"
    if in_thread and sync_execute is None:
        raise ConfigError(
            f"LangGraph tool {call['name']!r}: effect='transactional' on SQLite runs the tool in the thread "
            "that holds the ledger's transaction, which an async graph (ainvoke, astream) does not give: run "
            "the graph with invoke or stream, or keep the ledger on PostgreSQL (PgCheckpointer)"
        )
    return Tool(
        name=call["name"],
        description="",
        fn=run_in_thread if in_thread else run,
        parameters={"type": "object", "properties": {name: {} for name in call.get("args") or {}}},
        is_async=not in_thread,
        on_in_doubt=policy.on_in_doubt,
        reconcile=policy.reconcile,
        effect=effect,
    )


def rejecting(request: ToolCallRequest, text: str) -> tuple[AsyncExecute, Execute]:
    """LangGraph's ``execute`` pair for a rejected call: its answer, an error ``ToolMessage`` saying so."""
    call = request.tool_call

    def reject(_: ToolCallRequest) -> Result:
        return ToolMessage(content=text, tool_call_id=call.get("id") or "", name=call.get("name"), status="error")

    async def areject(req: ToolCallRequest) -> Result:
        return reject(req)

    return areject, reject


def as_json(content: Any) -> JSON:
    return content if isinstance(content, str) else json.loads(json.dumps(content, default=str))


def answer(execution: ToolExecution, call: Mapping[str, Any], fresh: list[Result]) -> Result:
    """The ``ToolMessage`` LangGraph gets: the tool's own (when it ran here), else one built from the record or
    from the ledger's answer (an in-doubt error, a timeout); its id derives from the ledger key."""
    message_id = result_message_id(execution.key)
    own = fresh[-1] if fresh and not execution.replayed else None
    if isinstance(own, ToolMessage) and (execution.result.output, execution.result.is_error) == (
        as_json(own.content),
        own.status == "error",
    ):
        return own if own.id else own.model_copy(update={"id": message_id})
    output = execution.result.output
    content = output if isinstance(output, str | list) else json.dumps(output)
    metadata = {"replayed": True} if execution.replayed else {}
    return ToolMessage(
        content=content,
        tool_call_id=call.get("id") or "",
        name=call.get("name"),
        status="error" if execution.result.is_error else "success",
        id=message_id,
        response_metadata=metadata,
    )
