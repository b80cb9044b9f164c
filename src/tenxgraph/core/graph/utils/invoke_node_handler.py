"""The replay-safe tool ledger. This module is the only place its logic lives.

For the tool calls of one assistant message:

1. Each call's ledger key is ``"{message_id}:{tool_call_id}"`` (:func:`ledger_key`). ``call_1`` repeats every
   turn; the pair does not. A call without either id has no key: it runs unprotected, with a warning.
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
import contextvars
import hashlib
import inspect
import logging
import uuid
from collections.abc import Callable, Mapping
from dataclasses import dataclass

from tenxgraph.core.crashpoints import crash_point
from tenxgraph.core.graph.context import RunContext
from tenxgraph.core.graph.tools import Tool, ToolArgumentError, ToolOutput
from tenxgraph.core.state.messages import JSON, Message, ToolCallBlock, ToolResultBlock
from tenxgraph.errors import RunLockLostError, SerializationError, ToolTimeoutError
from tenxgraph.utils.constants import LOGGER_NAME
from tenxgraph.utils.events import emit_event
from tenxgraph.utils.sync import to_thread

log = logging.getLogger(LOGGER_NAME)

RECORD_VERSION = 1


@dataclass(frozen=True, slots=True)
class ToolCallInfo:
    """The tool call being executed: what a tool body (or an observer) may know about itself."""

    thread_id: str
    message_id: str
    call_id: str | None
    tool: str
    index: int
    key: str | None
    use_ledger: bool
    #: The tool's in-doubt policy ("retry", "fail", "reconcile"), None when it did not opt in.
    on_in_doubt: str | None = None

    @property
    def idempotency_key(self) -> str:
        """A key for external APIs: the same on every replay and in every process, different for every other call.

        Derived from (thread_id, assistant message id, tool_call_id); pass it to payment or email providers.
        """
        digest = hashlib.sha256(f"{self.thread_id}\x00{self.execution_id}".encode()).hexdigest()
        return f"tenx-{digest[:40]}"

    @property
    def execution_id(self) -> str:
        """The ledger key, or (unprotected call) a stand-in that is still stable across replays of the message."""
        return self.key or f"unkeyed:{self.message_id}:{self.index}:{self.tool}"


ToolContext = ToolCallInfo
"""Declare a parameter of this type in a tool to receive the call's context (never shown to the model)."""


@dataclass(frozen=True, slots=True)
class ToolEvent:
    """What a :data:`ToolObserver` is told. ``kind`` is ``"start"`` (the body is about to run), ``"end"`` (it
    returned or raised: ``output`` is what it returned, or the error text, with ``is_error``), ``"recorded"`` (its
    ledger record is written), ``"timeout"`` (it was cancelled) or ``"in_doubt"`` (a resume found its intent
    without a result). After a crash, a call whose last event is ``start`` was in flight, and one whose last event
    is ``end`` was between return and record."""

    kind: str
    call: ToolCallInfo
    output: object = None
    is_error: bool = False


ToolObserver = Callable[[ToolEvent], None]
"""Called with every :class:`ToolEvent` of executed (not replayed) calls."""
_observers: list[ToolObserver] = []
_current_call: contextvars.ContextVar[ToolCallInfo | None] = contextvars.ContextVar("tenxgraph_tool", default=None)

CompletionOrder = Callable[[list[ToolCallInfo]], list[int]]
"""Given the calls of a batch that are about to run, the order (a permutation of their ``index``) in which they may
pass from their return to their record. Installed by test harnesses only (:func:`set_completion_order`)."""
_completion_order: CompletionOrder | None = None


def current_tool_call() -> ToolCallInfo | None:
    """Inside a tool body: the call being executed (thread, message id, tool_call_id, ledger key)."""
    return _current_call.get()


def add_tool_observer(observer: ToolObserver) -> Callable[[], None]:
    """Call *observer* with the :class:`ToolEvent` of every executed call (not of replays).

    Returns a function that removes it. Instrumentation for test harnesses; observers must be quick."""
    _observers.append(observer)
    return lambda: _observers.remove(observer) if observer in _observers else None


def _notify(kind: str, info: ToolCallInfo, output: object = None, is_error: bool = False) -> None:
    if _observers:
        event = ToolEvent(kind, info, output, is_error)
        for observer in list(_observers):
            observer(event)


def set_completion_order(order: CompletionOrder | None) -> None:
    """Make parallel calls pass from return to record one at a time, in the order *order* gives (None: as they
    come). Bodies still run concurrently; a returned call waits for its turn before it is reported and recorded.
    The crash-matrix harness installs a seeded order so that which siblings have returned or been recorded when a
    crash fires is decided by the seed, not by timing."""
    global _completion_order
    _completion_order = order


class _Turns:
    """The seeded completion order of one batch: a call may pass once every call before it in the order is done."""

    def __init__(self, order: list[int]) -> None:
        self.order = order
        self.done = {index: asyncio.Event() for index in order}

    async def wait(self, index: int) -> None:
        for before in self.order[: self.order.index(index)]:
            await self.done[before].wait()

    def finish(self, index: int) -> None:
        self.done[index].set()


_turns: contextvars.ContextVar[_Turns | None] = contextvars.ContextVar("tenxgraph_turns", default=None)


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


def result_message_id(key: str | None) -> str:
    """A tool result's message id: derived from the ledger key, so a replay yields the same message."""
    return f"tool_{uuid.uuid5(uuid.NAMESPACE_URL, key).hex}" if key else f"tool_{uuid.uuid4().hex}"


@dataclass(frozen=True, slots=True)
class ToolExecution:
    """What one tool call produced, and how."""

    call: ToolCallBlock
    key: str | None
    result: ToolResultBlock
    update: dict[str, JSON] | None = None
    replayed: bool = False
    recorded: bool = False

    def message(self) -> Message:
        metadata: dict[str, JSON] = {"tool": self.call.name}
        if self.replayed:
            metadata["replayed"] = True
        return Message.tool(self.result, message_id=result_message_id(self.key), metadata=metadata)


def encode_record(execution: ToolExecution) -> dict[str, JSON]:
    return {
        "v": RECORD_VERSION,
        "kind": "value",
        "tool": execution.call.name,
        "call_id": execution.call.id,
        "output": execution.result.output,
        "is_error": execution.result.is_error,
        "status": execution.result.status,
        "update": execution.update,
    }


def decode_record(call: ToolCallBlock, key: str, record: Mapping[str, JSON]) -> ToolExecution:
    result = ToolResultBlock(
        call_id=call.id,
        output=record.get("output"),
        is_error=bool(record.get("is_error", False)),
        status=str(record.get("status", "success")),
    )
    return ToolExecution(call, key, result, update=record.get("update"), replayed=True, recorded=True)


def _error(call: ToolCallBlock, key: str | None, text: str, status: str = "error") -> ToolExecution:
    return ToolExecution(call, key, ToolResultBlock(call.id, text, is_error=True, status=status))


async def _invoke(tool: Tool, info: ToolCallInfo, args: dict[str, JSON], timeout: float | None) -> JSON:
    _notify("start", info)
    if tool.injected:
        args = {**args, **{p: info if kind == "context" else info.idempotency_key for p, kind in tool.injected.items()}}
    turns = _turns.get()
    try:
        value = await _call(tool, args, timeout)
    except TimeoutError:
        if turns is not None:
            await turns.wait(info.index)
        _notify("timeout", info)
        raise
    except Exception as exc:
        if turns is not None:
            await turns.wait(info.index)
        _notify("end", info, f"{type(exc).__name__}: {exc}", True)
        raise
    if turns is not None:
        await turns.wait(info.index)
    if isinstance(value, ToolOutput):
        _notify("end", info, value.content, value.is_error)
    else:
        _notify("end", info, value)
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
    token = _current_call.set(info)  # visible to the tool body and to crash points of this call
    turns = _turns.get()
    try:
        execution = await _execute(call, key, tools, ctx, info, in_doubt)
    except Exception:
        if turns is not None:
            turns.finish(info.index)
        raise
    # (a BaseException such as a crash passes no turn on: a dying process lets no sibling record after it)
    finally:
        _current_call.reset(token)
    if turns is not None:
        turns.finish(info.index)
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
        return _error(call, key, f"unknown tool {call.name!r}; available tools: {', '.join(tools) or 'none'}")
    try:
        args = tool.parse_args(call.args)
    except ToolArgumentError as exc:
        return _error(call, key, str(exc))
    if key is not None and ctx.use_ledger:
        if in_doubt:
            resolved = await _resolve_in_doubt(tool, call, key, args, ctx, info)
            if resolved is not None:
                return resolved
        elif tool.on_in_doubt is not None:
            await _write_intent(call, key, ctx)
    await ctx.checkpointer.acheck_run_lock(ctx.thread_id)  # fencing: never invoke a tool without the thread's lock
    crash_point("tool.before_invoke")
    timeout = ctx.config.tool_timeout
    try:
        value = await _invoke(tool, info, args, timeout)
    except TimeoutError:
        err = ToolTimeoutError(call.name, timeout or 0)
        log.warning("%s (thread %r, key %r); nothing recorded", err, ctx.thread_id, key)
        return _error(call, key, f"{type(err).__name__}: {err}", status="timeout")
    except Exception as exc:  # the model sees the error and can act on it; it is recorded like a result
        log.info(
            "tool %r raised %s: %s (thread %r, key %r)",
            call.name,
            type(exc).__name__,
            exc,
            ctx.thread_id,
            key,
        )
        execution = _error(call, key, f"{type(exc).__name__}: {exc}")
    else:
        if isinstance(value, ToolOutput):
            result = ToolResultBlock(call.id, value.content, value.is_error, "error" if value.is_error else "success")
            execution = ToolExecution(call, key, result, update=value.update)
        else:
            execution = ToolExecution(call, key, ToolResultBlock(call.id, value))
    crash_point("tool.after_return")
    if key is None or not ctx.use_ledger:
        return execution
    return await _record(execution, key, ctx)


async def _write_intent(call: ToolCallBlock, key: str, ctx: RunContext) -> None:
    """Before an opted-in tool runs: a ``started`` record, so a resume can tell the call is in doubt."""
    try:
        await ctx.checkpointer.aput_tool_intent(
            ctx.thread_id, key, {"v": RECORD_VERSION, "kind": "intent", "tool": call.name, "call_id": call.id}
        )
    except Exception as exc:
        log.warning(
            "could not write the intent of tool %r (key %r, thread %r): %s: %s; it runs without in-doubt detection",
            call.name,
            key,
            ctx.thread_id,
            type(exc).__name__,
            exc,
        )


async def _resolve_in_doubt(
    tool: Tool, call: ToolCallBlock, key: str, args: dict[str, JSON], ctx: RunContext, info: ToolCallInfo
) -> ToolExecution | None:
    """The ledger holds an intent but no result: the call may or may not have happened. Apply the tool's policy;
    return the execution to use, or None to run the tool (again)."""
    _notify("in_doubt", info)
    policy = tool.on_in_doubt or "retry"
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
        return await _record(_error(call, key, text, status="in_doubt"), key, ctx)
    try:
        assert tool.reconcile is not None
        found = tool.reconcile(info.idempotency_key, args)
        if inspect.isawaitable(found):
            found = await found
    except Exception as exc:
        log.error("reconcile of in-doubt tool %r failed %s: %s: %s", call.name, where, type(exc).__name__, exc)
        emit_event("tool_in_doubt", tool=call.name, key=key, thread=ctx.thread_id, policy="reconcile", error=str(exc))
        return _error(call, key, f"tool {call.name!r} is in doubt and reconcile failed: {exc}", status="in_doubt")
    if found is None:
        log.warning("tool %r was in doubt %s; reconcile says it did not happen: running it", call.name, where)
        return None
    log.warning("tool %r was in doubt %s; reconcile found its result: using it", call.name, where)
    if isinstance(found, ToolOutput):
        result = ToolResultBlock(call.id, found.content, found.is_error, "error" if found.is_error else "success")
        return await _record(ToolExecution(call, key, result, update=found.update), key, ctx)
    return await _record(ToolExecution(call, key, ToolResultBlock(call.id, found)), key, ctx)


async def _record(execution: ToolExecution, key: str, ctx: RunContext) -> ToolExecution:
    name = execution.call.name
    try:
        crash_point("ledger.write_error")
        # The checkpointer encodes the record once; an unserialisable result raises SerializationError there.
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
        return await _record(_error(execution.call, key, text), key, ctx)  # storable: recorded, never re-run
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
        return execution
    info = _current_call.get()
    if info is not None:
        _notify("recorded", info)
    crash_point("tool.after_record")
    return ToolExecution(execution.call, key, execution.result, execution.update, recorded=True)


async def _read_ledger(keys: list[str], calls: dict[str, ToolCallBlock], ctx: RunContext) -> dict[str, JSON]:
    if not keys:
        return {}
    try:
        crash_point("ledger.read_error")
        return await ctx.checkpointer.aget_tool_results(ctx.thread_id, keys)
    except RunLockLostError:
        raise  # not a failed read: the thread is another run's now, and no tool may run
    except Exception as exc:
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
            log.warning(
                "tool call %r of message %r has no %s: it runs without replay protection (thread %r)",
                call.name,
                message.message_id,
                "tool_call_id" if message.message_id else "message id",
                ctx.thread_id,
            )
    records: Mapping[str, JSON] = {}
    if ctx.use_ledger:
        protected = {k: c for k, c in zip(keys, calls, strict=True) if k is not None}
        records = await _read_ledger(list(dict.fromkeys(protected)), protected, ctx)
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
            policy = tool.on_in_doubt if tool is not None else None
            info = ToolCallInfo(
                ctx.thread_id, message.message_id, call.id, call.name, index, key, ctx.use_ledger, policy
            )
            to_run.append((call, key, info, in_doubt))
    order = _completion_order
    batch = [info for _, _, info, _ in to_run]
    token = _turns.set(_Turns(order(batch)) if order is not None and len(batch) > 1 else None)
    try:  # each task copies the context as it is created, so every call of the batch sees the batch's turns
        tasks = [asyncio.ensure_future(_run_one(c, k, tools, ctx, i, d)) for c, k, i, d in to_run]
    finally:
        _turns.reset(token)
    ran = iter(await _gather(tasks)) if tasks else iter(())
    return [r if r is not None else next(ran) for r in results]
