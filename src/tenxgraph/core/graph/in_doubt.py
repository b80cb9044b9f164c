"""In-doubt policies: a call whose intent was recorded but whose result was not may or may not have happened.
``retry`` runs it again (with the same idempotency key), ``fail`` answers with an in-doubt error without running
it, ``reconcile`` asks the tool's ``reconcile`` function whether it happened."""

from __future__ import annotations

import inspect
import logging
from collections.abc import Awaitable, Callable

from tenxgraph.core.graph.context import RunContext
from tenxgraph.core.graph.ledger_record import RECORD_VERSION, ToolExecution, error_execution, execution_of
from tenxgraph.core.graph.tool_call import ToolCallInfo, notify
from tenxgraph.core.graph.tools import Tool
from tenxgraph.core.state.messages import JSON, ToolCallBlock
from tenxgraph.errors import IntentWriteError
from tenxgraph.utils.constants import LOGGER_NAME
from tenxgraph.utils.events import emit_event

log = logging.getLogger(LOGGER_NAME)
Record = Callable[[ToolExecution, str, RunContext, ToolCallInfo], Awaitable[ToolExecution]]


async def write_intent(call: ToolCallBlock, key: str, ctx: RunContext) -> None:
    """Before an opted-in tool runs: a ``started`` record, so a resume can tell the call is in doubt. If it cannot
    be written, the tool does not run (:class:`IntentWriteError` stops the run; the thread stays resumable): run
    without it, and a crash during the call, or a refused record write after it, would go undetected."""
    try:
        await ctx.checkpointer.aput_tool_intent(
            ctx.thread_id, key, {"v": RECORD_VERSION, "kind": "intent", "tool": call.name, "call_id": call.id}
        )
    except Exception as exc:
        raise IntentWriteError(call.name, key, ctx.thread_id, exc) from exc


async def resolve_in_doubt(
    tool: Tool,
    call: ToolCallBlock,
    key: str,
    args: dict[str, JSON],
    ctx: RunContext,
    info: ToolCallInfo,
    record: Record,
) -> ToolExecution | None:
    """The ledger holds an intent but no result: the call may or may not have happened. Apply the tool's policy;
    return the execution to use, or None to run the tool (again)."""
    notify("in_doubt", info)
    policy = tool.policy or "retry"
    where = f"(key {key!r}, thread {ctx.thread_id!r})"
    if policy == "retry":
        log.warning("tool %r was in doubt %s: running it again with the same idempotency key", call.name, where)
        return None
    if policy == "fail":
        emit_event("tool_in_doubt", tool=call.name, key=key, thread=ctx.thread_id, policy="fail")
        text = (
            f"tool {call.name!r} is in doubt: a previous attempt started but its outcome is unknown, so it was not "
            "run again; check with the provider before retrying"
        )
        return await record(error_execution(call, key, text, status="in_doubt"), key, ctx, info)
    try:
        assert tool.reconcile is not None
        found = tool.reconcile(info.idempotency_key, args)
        if inspect.isawaitable(found):
            found = await found
    except Exception as exc:
        log.error("reconcile of in-doubt tool %r failed %s: %s: %s", call.name, where, type(exc).__name__, exc)
        emit_event("tool_in_doubt", tool=call.name, key=key, thread=ctx.thread_id, policy="reconcile", error=str(exc))
        return error_execution(
            call, key, f"tool {call.name!r} is in doubt and reconcile failed: {exc}", status="in_doubt"
        )
    if found is None:
        log.warning("tool %r was in doubt %s; reconcile says it did not happen: running it", call.name, where)
        return None
    log.warning("tool %r was in doubt %s; reconcile found its result: using it", call.name, where)
    return await record(execution_of(call, key, found), key, ctx, info)
