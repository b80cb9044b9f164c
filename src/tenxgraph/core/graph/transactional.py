"""Transactional tools (``@tool(effect="transactional")``): the tool's writes to the checkpointer's database and
its ledger record commit in one transaction, so a crash anywhere before the commit leaves neither and the
resumed call makes them once: exactly once, at every crash point. The checkpointer runs the transaction
(:meth:`BaseCheckpointer.atransact`); this module is the call's side of it."""

from __future__ import annotations

import asyncio
import logging
import time
from typing import Any

from tenxgraph.core.crashpoints import crash_point
from tenxgraph.core.graph.context import RunContext
from tenxgraph.core.graph.in_doubt import Record
from tenxgraph.core.graph.ledger_record import (
    ToolExecution,
    decode_record,
    encode_record,
    error_execution,
    execution_of,
)
from tenxgraph.core.graph.tool_call import ToolCallInfo, notify
from tenxgraph.core.graph.tools import TX_PARAM, Tool
from tenxgraph.core.state.messages import JSON, ToolCallBlock
from tenxgraph.errors import SerializationError, ToolTimeoutError
from tenxgraph.utils.constants import LOGGER_NAME

log = logging.getLogger(LOGGER_NAME)


class _ToolRaised(Exception):
    """The tool body raised inside the transaction (rolled back); its error is recorded like any tool's."""


async def run_transactional(
    tool: Tool,
    call: ToolCallBlock,
    key: str,
    args: dict[str, JSON],
    ctx: RunContext,
    info: ToolCallInfo,
    record: Record,
) -> ToolExecution:
    def started(connection: Any) -> dict[str, Any]:
        notify("start", info)
        return {**args, **tool.injected_args(info), TX_PARAM: connection}

    def raised(exc: Exception) -> _ToolRaised:
        notify("end", info, f"{type(exc).__name__}: {exc}", True, at=time.monotonic())
        return _ToolRaised(f"{type(exc).__name__}: {exc}")

    def work(connection: Any) -> dict[str, JSON]:  # a plain function: SQLite, in a worker thread
        try:
            value = tool.fn(**started(connection))
        except Exception as exc:
            raise raised(exc) from exc
        return finish(value)

    async def awork(connection: Any) -> dict[str, JSON]:  # a coroutine: PostgreSQL
        try:
            async with asyncio.timeout(ctx.config.tool_timeout):  # over time: cancelled, and rolled back
                value = await tool.fn(**started(connection))
        except TimeoutError:
            notify("timeout", info)
            raise
        except Exception as exc:
            raise raised(exc) from exc
        return finish(value)

    def finish(value: object) -> dict[str, JSON]:
        execution = execution_of(call, key, value)
        result = execution.result
        notify("end", info, result.output, result.is_error, at=time.monotonic(), update=execution.update)
        crash_point("tool.after_return")  # inside the transaction: a crash here takes the tool's writes along
        crash_point("ledger.write_error")  # a failed record write fails the transaction: the writes roll back too
        return encode_record(execution)

    try:
        stored, wrote = await ctx.checkpointer.atransact(ctx.thread_id, key, awork if tool.is_async else work)
    except TimeoutError:  # (PostgreSQL) rolled back, writes and all, and not recorded: it runs again on replay
        err = ToolTimeoutError(call.name, ctx.config.tool_timeout or 0)
        log.warning("%s (thread %r, key %r); rolled back, nothing recorded", err, ctx.thread_id, key)
        return error_execution(call, key, f"{type(err).__name__}: {err}", status="timeout")
    except _ToolRaised as failure:  # rolled back, writes and all: the error result is recorded, as for any tool
        return await record(error_execution(call, key, str(failure)), key, ctx, info)
    except SerializationError as exc:
        text = f"tool {call.name!r} returned a value that cannot be stored: {exc.__cause__ or exc} (rolled back)"
        return await record(error_execution(call, key, text), key, ctx, info)
    except Exception as exc:  # the transaction failed (its record write, its commit): nothing of it is stored
        log.error(
            "the transaction of tool %r failed and was rolled back, its writes with it (key %r, thread %r): %s: %s. "
            "The call may run again on replay",
            call.name,
            key,
            ctx.thread_id,
            type(exc).__name__,
            exc,
        )
        return error_execution(call, key, f"{type(exc).__name__}: {exc} (rolled back: nothing was written)")
    execution = decode_record(call, key, stored)
    if not wrote:  # recorded already, by another run: its writes are not made again
        return execution
    notify("recorded", info)
    crash_point("tool.after_record")
    return ToolExecution(execution.call, key, execution.result, execution.update, recorded=True)
