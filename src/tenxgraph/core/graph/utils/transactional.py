"""Transactional tools (``@tool(effect="transactional")``): the tool's writes to the checkpointer's database and
its ledger record commit in one transaction, so a crash anywhere before the commit leaves neither and the
resumed call makes them once: exactly once, at every crash point. The checkpointer runs the transaction
(:meth:`LedgerStore.atransact`); this module is the call's side of it. Called by the ledger
(:mod:`.invoke_node_handler`); an error result it does not commit itself goes back to the ledger to record."""

from __future__ import annotations

import asyncio
import logging
import time
from typing import Any

from tenxgraph.core.crashpoints import crash_point
from tenxgraph.core.graph.utils.instrument import notify
from tenxgraph.core.graph.utils.ledger_record import (
    Decision,
    LedgerCall,
    ToolExecution,
    decode_record,
    encode_record,
    error_execution,
    execution_of,
)
from tenxgraph.core.tools.tool import TX_PARAM
from tenxgraph.state.messages import JSON
from tenxgraph.storage.ledger_store import LedgerStore
from tenxgraph.utils.constants import LOGGER_NAME
from tenxgraph.utils.errors import SerializationError, ToolTimeoutError

log = logging.getLogger(LOGGER_NAME)


class _ToolRaised(Exception):
    """The tool body raised inside the transaction (rolled back); its error is recorded like any tool's."""


async def run_transactional(
    call: LedgerCall, args: dict[str, JSON], checkpointer: LedgerStore, timeout: float | None
) -> Decision:
    """Run *call*'s tool inside the transaction of its record; the execution to answer with (recorded already when
    the transaction committed; ``record`` set for an error result the ledger is to record)."""
    tool, block, key, info = call.tool, call.block, call.key, call.info
    assert tool is not None and key is not None

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
            async with asyncio.timeout(timeout):  # over time: cancelled, and rolled back
                value = await tool.fn(**started(connection))
        except TimeoutError:
            notify("timeout", info)
            raise
        except Exception as exc:
            raise raised(exc) from exc
        return finish(value)

    def finish(value: object) -> dict[str, JSON]:
        execution = execution_of(block, key, value)
        result = execution.result
        notify("end", info, result.output, result.is_error, at=time.monotonic(), update=execution.update)
        crash_point("tool.after_return")  # inside the transaction: a crash here takes the tool's writes along
        crash_point("ledger.write_error")  # a failed record write fails the transaction: the writes roll back too
        return encode_record(execution)

    try:
        stored, wrote = await checkpointer.atransact(info.thread_id, key, awork if tool.is_async else work)
    except TimeoutError:  # (PostgreSQL) rolled back, writes and all, and not recorded: it runs again on replay
        err = ToolTimeoutError(block.name, timeout or 0)
        log.warning("%s (thread %r, key %r); rolled back, nothing recorded", err, info.thread_id, key)
        return Decision(error_execution(block, key, f"{type(err).__name__}: {err}", status="timeout"))
    except _ToolRaised as failure:  # rolled back, writes and all: the error result is recorded, as for any tool
        return Decision(error_execution(block, key, str(failure)), record=True)
    except SerializationError as exc:
        text = f"tool {block.name!r} returned a value that cannot be stored: {exc.__cause__ or exc} (rolled back)"
        return Decision(error_execution(block, key, text), record=True)
    except Exception as exc:  # the transaction failed (its record write, its commit): nothing of it is stored
        log.error(
            "the transaction of tool %r failed and was rolled back, its writes with it (key %r, thread %r): %s: %s. "
            "The call may run again on replay",
            block.name,
            key,
            info.thread_id,
            type(exc).__name__,
            exc,
        )
        text = f"{type(exc).__name__}: {exc} (rolled back: nothing was written)"
        return Decision(error_execution(block, key, text))
    execution = decode_record(block, key, stored)
    if not wrote:  # recorded already, by another run: its writes are not made again
        return Decision(execution)
    notify("recorded", info)
    crash_point("tool.after_record")
    return Decision(ToolExecution(execution.call, key, execution.result, execution.update, recorded=True))
