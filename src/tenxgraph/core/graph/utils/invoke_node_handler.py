"""The replay-safe tool ledger. This module is the only place its logic lives.

For the tool calls of one assistant message:

1. Each call's ledger key is ``"{message_id}:{tool_call_id}"`` (:func:`ledger_key`, :func:`call_keys`). ``call_1``
   repeats every turn; the pair does not. A message always has an id; a call the model sent without a
   ``tool_call_id`` has no key: it runs unprotected, with a warning.
2. Before invoking anything, the records of all keys are read in one batched call. A call with a record is not
   invoked: its recorded result (output, error flag, state update) is returned, flagged ``replayed``.
3. Calls without a record run concurrently. Each one's record is written as soon as that tool returns, before
   its siblings finish and before the node completes, so a crash later skips the finished ones on replay.
4. First write wins (the checkpointer's contract).

Recorded: a tool that returned, and a tool that raised (its error result). Not recorded: a timeout (the call is
cancelled, the model gets a ``ToolTimeoutError`` result) and a call that never ran (bad arguments, unknown tool).

Failures, as documented: a failed ledger read logs a WARNING and runs the tools (skipping a tool that never ran
is worse); a failed record write logs an ERROR that the call completed but was not recorded and may run again on
replay, and the run continues. A result no backend can store (not JSON, a NUL character, invalid UTF-8) becomes
an error result naming the tool, and that is recorded: the call never runs again.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Mapping

from tenxgraph.core.crashpoints import crash_point
from tenxgraph.core.graph.context import RunContext
from tenxgraph.core.graph.in_doubt import resolve_in_doubt, write_intent
from tenxgraph.core.graph.ledger_record import (
    RECORD_VERSION,
    ToolExecution,
    decode_record,
    encode_record,
    error_execution,
    execution_of,
    result_message_id,
)
from tenxgraph.core.graph.record_batch import RecordBatch, batch_var
from tenxgraph.core.graph.tool_call import (
    BatchTurns,
    ToolCallInfo,
    ToolContext,
    ToolEvent,
    ToolObserver,
    add_tool_observer,
    completion_order,
    current_call_var,
    current_tool_call,
    finish_turn,
    notify,
    set_completion_order,
    turns_var,
    wait_for_turn,
)
from tenxgraph.core.graph.tools import Tool, ToolArgumentError, ToolOutput
from tenxgraph.core.graph.transactional import run_transactional
from tenxgraph.core.state.messages import JSON, Message, ToolCallBlock
from tenxgraph.errors import LedgerReadError, RunLockLostError, SerializationError, ToolTimeoutError
from tenxgraph.utils.constants import LOGGER_NAME
from tenxgraph.utils.events import emit_event
from tenxgraph.utils.sync import to_thread

__all__ = [  # the ledger itself, and what older imports of this module name (now in tool_call / ledger_record)
    "RECORD_VERSION",
    "ToolCallInfo",
    "ToolContext",
    "ToolEvent",
    "ToolExecution",
    "ToolObserver",
    "add_tool_observer",
    "call_keys",
    "current_tool_call",
    "decode_record",
    "encode_record",
    "invoke_tool_calls",
    "ledger_key",
    "result_message_id",
    "set_completion_order",
]
log = logging.getLogger(LOGGER_NAME)


def ledger_key(message_id: str | None, tool_call_id: str | None) -> str | None:
    """The stable identity of a tool call, or None when either id is missing (the call is unprotected)."""
    if not message_id or not tool_call_id:
        return None
    return f"{message_id}:{tool_call_id}"


def call_keys(message: Message) -> list[str | None]:
    """The ledger key of each tool call of *message*, in order. A ``tool_call_id`` repeated within one message (a
    model bug seen in practice) gets its occurrence appended from the second time on (``msg:call_1#2``): two calls
    never share a key, a record or a result message, and each key is as stable as the message."""
    seen: dict[str, int] = {}
    keys: list[str | None] = []
    for call in message.tool_calls:
        key = ledger_key(message.message_id, call.id)
        if key is not None:
            seen[key] = seen.get(key, 0) + 1
            if seen[key] > 1:
                key = f"{key}#{seen[key]}"
        keys.append(key)
    return keys


async def _invoke(tool: Tool, info: ToolCallInfo, args: dict[str, JSON], timeout: float | None) -> JSON:
    notify("start", info)
    if tool.injected:
        args = {**args, **tool.injected_args(info)}
    try:
        value = await _call(tool, args, timeout)
    except TimeoutError:
        await wait_for_turn(info.index)
        notify("timeout", info)
        raise
    except Exception as exc:
        returned = time.monotonic()
        await wait_for_turn(info.index)
        notify("end", info, f"{type(exc).__name__}: {exc}", True, at=returned)
        raise
    returned = time.monotonic()  # (observers learn when the body returned, not when its turn came)
    await wait_for_turn(info.index)
    if isinstance(value, ToolOutput):
        notify("end", info, value.content, value.is_error, at=returned, update=value.update)
    else:
        notify("end", info, value, at=returned)
    return value


async def _call(tool: Tool, args: dict[str, JSON], timeout: float | None) -> JSON:
    # asyncio.timeout, not wait_for: on Python 3.11 wait_for drops a cancellation that arrives as the body
    # completes, and a cancelled call (its run crashed or timed out) would go on to record and run.
    async with asyncio.timeout(timeout):
        if tool.is_async:
            return await tool.fn(**args)
        # Sync tools run off the event loop. A timed-out thread cannot be stopped; its result is discarded.
        return await to_thread(tool.fn, **args)


async def _run_one(
    call: ToolCallBlock,
    key: str | None,
    tools: Mapping[str, Tool],
    ctx: RunContext,
    info: ToolCallInfo,
    in_doubt: bool = False,
) -> ToolExecution:
    token = current_call_var.set(info)  # visible to the tool body and to crash points of this call
    try:
        execution = await _execute(call, key, tools, ctx, info, in_doubt)
    except Exception:
        finish_turn(info.index)
        raise
    # (a BaseException such as a crash passes no turn on: a dying process lets no sibling record after it)
    finally:
        current_call_var.reset(token)
    finish_turn(info.index)
    return execution


async def _execute(
    call: ToolCallBlock,
    key: str | None,
    tools: Mapping[str, Tool],
    ctx: RunContext,
    info: ToolCallInfo,
    in_doubt: bool,
) -> ToolExecution:
    tool = tools.get(call.name)
    if tool is None:
        return error_execution(call, key, f"unknown tool {call.name!r}; available tools: {', '.join(tools) or 'none'}")
    try:
        args = tool.parse_args(call.args)
    except ToolArgumentError as exc:
        return error_execution(call, key, str(exc))
    if key is not None and in_doubt:
        resolved = await resolve_in_doubt(tool, call, key, args, ctx, info, _record)
        if resolved is not None:
            return resolved
    await ctx.checkpointer.acheck_run_lock(ctx.thread_id)  # fencing: never invoke a tool without the thread's lock
    crash_point("tool.before_invoke")
    if tool.effect == "transactional" and key is not None:  # its writes commit with its record (no timeout)
        return await run_transactional(tool, call, key, args, ctx, info, _record)
    timeout = ctx.config.tool_timeout
    try:
        value = await _invoke(tool, info, args, timeout)
    except TimeoutError:
        err = ToolTimeoutError(call.name, timeout or 0)
        log.warning("%s (thread %r, key %r); nothing recorded", err, ctx.thread_id, key)
        return error_execution(call, key, f"{type(err).__name__}: {err}", status="timeout")
    except Exception as exc:  # the model sees the error and can act on it; it is recorded like a result
        log.info(
            "tool %r raised %s: %s (thread %r, key %r)",
            call.name,
            type(exc).__name__,
            exc,
            ctx.thread_id,
            key,
        )
        execution = error_execution(call, key, f"{type(exc).__name__}: {exc}")
    else:
        execution = execution_of(call, key, value)
    crash_point("tool.after_return")
    if key is None or not tool.recorded:  # a read tool may simply run again: no record, no commit
        return execution
    return await _record(execution, key, ctx, info)


async def _record(execution: ToolExecution, key: str, ctx: RunContext, info: ToolCallInfo) -> ToolExecution:
    name = execution.call.name
    try:
        crash_point("ledger.write_error")
        # The checkpointer encodes the record once; an unserialisable result raises SerializationError there.
        batch = batch_var.get()
        if batch is not None:  # step 4 for parallel calls: those that return together are recorded together
            await batch.put(key, encode_record(execution))
        else:
            await ctx.checkpointer.aput_tool_result(ctx.thread_id, key, encode_record(execution))
    except SerializationError as exc:
        log.error(
            "tool %r returned a value that cannot be stored (key %r, thread %r): %s. Its error result is recorded "
            "instead; return JSON values (no NUL characters, valid UTF-8) from tools",
            name,
            key,
            ctx.thread_id,
            exc.__cause__ or exc,
        )
        text = f"tool {name!r} returned a value that cannot be stored: {exc.__cause__ or exc}"
        return await _record(error_execution(execution.call, key, text), key, ctx, info)  # storable: never re-run
    except Exception as exc:
        log.error(
            "tool %r completed but its result was not recorded in the ledger (key %r, thread %r): %s: %s. "
            "The call may run again on replay",
            name,
            key,
            ctx.thread_id,
            type(exc).__name__,
            exc,
        )
        emit_event("ledger_write_failed", logging.DEBUG, thread_id=ctx.thread_id, tool=name, key=key)
        return execution
    notify("recorded", info)
    crash_point("tool.after_record")
    return ToolExecution(execution.call, key, execution.result, execution.update, recorded=True)


async def _read_ledger(
    keys: list[str], calls: dict[str, ToolCallBlock], ctx: RunContext, tools: Mapping[str, Tool]
) -> dict[str, JSON]:
    if not keys:
        return {}
    try:
        crash_point("ledger.read_error")
        return await ctx.checkpointer.aget_tool_results(ctx.thread_id, keys)
    except RunLockLostError:
        raise  # not a failed read: the thread is another run's now, and no tool may run
    except Exception as exc:
        watched = sorted({c.name for c in calls.values() if (t := tools.get(c.name)) is not None and t.policy})
        if watched:  # they never run without knowing whether they ran: the run stops, the thread stays resumable
            raise LedgerReadError(watched, ctx.thread_id, exc) from exc
        for key in keys:
            log.warning(
                "ledger read failed (%s: %s); running tool %r without replay protection (key %r, thread %r): "
                "skipping a tool that never ran is worse",
                type(exc).__name__,
                exc,
                calls[key].name,
                key,
                ctx.thread_id,
            )
        return {}


async def _gather(jobs: list[asyncio.Task[ToolExecution]]) -> list[ToolExecution]:
    """Wait for all calls; if one dies with a BaseException (a crash), stop the others as a dying process would."""
    try:
        await asyncio.wait(jobs, return_when=asyncio.FIRST_EXCEPTION)
        for job in jobs:
            if job.done() and not job.cancelled() and job.exception() is not None:
                raise job.exception()  # type: ignore[misc]
        return [job.result() for job in jobs]
    finally:
        pending = [job for job in jobs if not job.done()]
        for job in pending:
            job.cancel()
        if pending:
            await asyncio.wait(pending)


async def _write_intents(
    to_run: list[tuple[ToolCallBlock, str | None, ToolCallInfo, bool]], tools: Mapping[str, Tool], ctx: RunContext
) -> None:
    """The intents of the batch's opted-in calls, all before any call starts: one that cannot be written stops
    the node (:class:`IntentWriteError`) while nothing has run, so no sibling's effect is left unrecorded."""
    for call, key, _, in_doubt in to_run:
        tool = tools.get(call.name)
        if key is None or in_doubt or tool is None or tool.policy is None:
            continue
        try:
            tool.parse_args(call.args)
        except ToolArgumentError:
            continue  # answered with an error without running: nothing to be in doubt about
        await write_intent(call, key, ctx)


async def invoke_tool_calls(message: Message, tools: Mapping[str, Tool], ctx: RunContext) -> list[ToolExecution]:
    """Run (or replay) every tool call of *message*; results come back in call order."""
    calls = message.tool_calls
    if not calls:
        return []
    crash_point("tool.before_ledger_read")
    keys = call_keys(message)
    repeated = sorted({str(c.id) for c, k in zip(calls, keys, strict=True) if k is not None and "#" in k})
    if repeated:
        log.warning(
            "assistant message %r repeats tool_call_id(s) %s: each call runs and is recorded on its own (keys "
            "suffixed #2, #3...), and each result keeps the id the model gave (thread %r)",
            message.message_id,
            ", ".join(repeated),
            ctx.thread_id,
        )
    for call, key in zip(calls, keys, strict=True):
        if key is None:
            log.warning(  # (a Message always has a message id: only the model can leave the call's id out)
                "tool call %r of message %r has no tool_call_id: it runs without replay protection (thread %r)",
                call.name,
                message.message_id,
                ctx.thread_id,
            )
    protected = {k: c for k, c in zip(keys, calls, strict=True) if k is not None}
    records: Mapping[str, JSON] = await _read_ledger(list(dict.fromkeys(protected)), protected, ctx, tools)
    results: list[ToolExecution | None] = []
    to_run: list[tuple[ToolCallBlock, str | None, ToolCallInfo, bool]] = []
    for index, (call, key) in enumerate(zip(calls, keys, strict=True)):
        record = records.get(key) if key is not None else None
        in_doubt = record is not None and record.get("kind") == "intent"
        if record is not None and key is not None and not in_doubt:
            emit_event("tool_replayed", logging.INFO, thread_id=ctx.thread_id, tool=call.name, key=key)
            results.append(decode_record(call, key, record))
        else:
            results.append(None)
            tool = tools.get(call.name)
            policy = tool.policy if tool is not None else None
            effect = tool.effect if tool is not None else None
            info = ToolCallInfo(ctx.thread_id, message.message_id, call.id, call.name, index, key, policy, effect)
            to_run.append((call, key, info, in_doubt))
    if ctx.resumed and to_run:  # a resumed node: a crashed run may have started these calls already
        again = [f"{c.name} ({k or 'no key'})" for c, k, _, in_doubt in to_run if not in_doubt]
        if again:
            emit_event(
                "calls_run_on_resume", logging.WARNING, thread_id=ctx.thread_id, node=ctx.node, calls=again,
                hint="they have no ledger record: if the interrupted run had started them, they run a second time "
                "(the in-flight and after-return gaps); give such tools an idempotency key or an in-doubt policy",
            )  # fmt: skip
    await _write_intents(to_run, tools, ctx)
    order = completion_order()
    batch = [info for _, _, info, _ in to_run]
    token = turns_var.set(BatchTurns(order(batch)) if order is not None and len(batch) > 1 else None)
    group = batch_var.set(RecordBatch(ctx.checkpointer, ctx.thread_id) if len(batch) > 1 else None)
    try:  # each task copies the context as it is created, so every call sees the batch's turns and records
        tasks = [asyncio.ensure_future(_run_one(c, k, tools, ctx, i, d)) for c, k, i, d in to_run]
    finally:
        batch_var.reset(group)
        turns_var.reset(token)
    ran = iter(await _gather(tasks)) if tasks else iter(())
    return [r if r is not None else next(ran) for r in results]
