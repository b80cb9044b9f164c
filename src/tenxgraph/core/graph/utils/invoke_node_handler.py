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

The ledger is called with everything it uses (the message, the tools, the checkpointer and the thread: our
``ToolNode`` passes its run's, an integration its own); each call travels through the steps as a
:class:`LedgerCall`. In-doubt policies, transactional calls, approvals and group commit are called from here and
never call back; what a test harness watches goes through one seam (:mod:`.instrument`). (Past the ~350-line
guide on purpose: the seed names this module, and its four steps read top to bottom here.)
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Mapping
from dataclasses import dataclass, replace

from tenxgraph.core.crashpoints import CrashInjected, crash_point
from tenxgraph.core.graph.utils.approvals import attempt_of, check_approvals
from tenxgraph.core.graph.utils.call_groups import CallGroup
from tenxgraph.core.graph.utils.in_doubt import resolve_in_doubt, write_intent
from tenxgraph.core.graph.utils.instrument import BatchTurns, batch_turns, finish_turn, notify, wait_turn
from tenxgraph.core.graph.utils.ledger_record import (
    RECORD_VERSION,
    LedgerCall,
    ToolExecution,
    decode_record,
    encode_record,
    error_execution,
    execution_of,
    result_message_id,
)
from tenxgraph.core.graph.utils.record_batch import RecordBatch, gather_calls
from tenxgraph.core.graph.utils.shared_read import SharedRead
from tenxgraph.core.graph.utils.transactional import run_transactional
from tenxgraph.core.graph.utils.watch import report, tool_span
from tenxgraph.core.tools.context import ToolCallInfo, current_run, running_call
from tenxgraph.core.tools.effects import Effect
from tenxgraph.core.tools.interrupts import GraphInterrupt, Pauses
from tenxgraph.core.tools.observe import RunObserver
from tenxgraph.core.tools.tool import Tool, ToolArgumentError, ToolOutput
from tenxgraph.core.tools.tracing import add_event
from tenxgraph.state.messages import JSON, Message
from tenxgraph.storage.ledger_store import LedgerStore
from tenxgraph.utils.constants import LOGGER_NAME, TOOL_TIMEOUT
from tenxgraph.utils.errors import (
    LedgerReadError,
    RunLockLostError,
    SerializationError,
    ToolTimeoutError,
    ToolUnavailableError,
)
from tenxgraph.utils.events import emit_event
from tenxgraph.utils.sync import to_thread_in

__all__ = [
    "RECORD_VERSION",
    "Batch",
    "LedgerCall",
    "ToolExecution",
    "call_keys",
    "decode_record",
    "encode_record",
    "invoke_tool_call",
    "invoke_tool_calls",
    "ledger_key",
    "result_message_id",
]
log = logging.getLogger(LOGGER_NAME)


@dataclass(frozen=True, slots=True)
class Batch:
    """The calls of one assistant message under way, and where their records go: the checkpointer and thread
    (given by the caller), the tools' timeout, the group commit of parallel calls (``records``) and, under a test
    harness, their completion order (``turns``)."""

    checkpointer: LedgerStore
    thread_id: str
    tool_timeout: float | None
    tool_names: tuple[str, ...] = ()  # the tools the model could call (for the error of an unknown one)
    records: RecordBatch | None = None
    turns: BatchTurns | None = None
    #: The run's stream and tracer (None: nobody watches).
    observer: RunObserver | None = None


# -- 1. the key ------------------------------------------------------------------------------------------------
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


def ledger_calls(
    message: Message, tools: Mapping[str, Tool], thread_id: str, only: int | None = None
) -> list[LedgerCall]:
    """The tool calls of *message* as the ledger carries them, keyed (warnings for ids the model got wrong);
    *only*: just the call at that index (warnings for it alone)."""
    keys = call_keys(message)
    calls = message.tool_calls
    repeated = sorted({str(c.id) for c, k in zip(calls, keys, strict=True) if k is not None and "#" in k})
    if only is not None:
        repeated = [r for r in repeated if r == str(calls[only].id)]
    if repeated:
        log.warning(
            "assistant message %r repeats tool_call_id(s) %s: each call runs and is recorded on its own (keys "
            "suffixed #2, #3...), and each result keeps the id the model gave (thread %r)",
            message.message_id, ", ".join(repeated), thread_id,
        )  # fmt: skip
    found: list[LedgerCall] = []
    for index, (block, key) in enumerate(zip(calls, keys, strict=True)):
        if only is not None and index != only:
            continue
        if key is None:
            log.warning(  # (a Message always has a message id: only the model can leave the call's id out)
                "tool call %r of message %r has no tool_call_id: it runs without replay protection (thread %r)",
                block.name, message.message_id, thread_id,
            )  # fmt: skip
        tool = tools.get(block.name)
        policy, effect = (tool.policy, tool.effect) if tool is not None else (None, None)
        info = ToolCallInfo(thread_id, message.message_id, block.id, block.name, index, key, policy, effect)
        found.append(LedgerCall(block, info, tool))
    return found


# -- the entry point: steps 1 to 4 for one assistant message ------------------------------------------------
async def invoke_tool_calls(
    message: Message,
    tools: Mapping[str, Tool],
    checkpointer: LedgerStore,
    thread_id: str,
    *,
    tool_timeout: float | None = TOOL_TIMEOUT,
    resumed: bool = False,
    pauses: Pauses | None = None,
    observer: RunObserver | None = None,
) -> list[ToolExecution]:
    """Run (or replay) every tool call of *message* on *thread_id*'s ledger in *checkpointer*; results come back in
    call order. *resumed*: the caller is re-running a node a crashed run left unfinished (its calls without a
    record are reported as run again). *pauses*: the run's answers to interrupts (approvals, ``interrupt()`` in
    tool bodies) and the node that runs; a call that waits for one raises :class:`GraphInterrupt`. *observer*: the
    run's stream (each result as it is recorded or replayed) and tracer (a span per call)."""
    if not message.tool_calls:
        return []
    pauses = pauses if pauses is not None else Pauses()
    node = pauses.node
    crash_point("tool.before_ledger_read")
    calls = [replace(c, attempt=attempt_of(c, pauses)) for c in ledger_calls(message, tools, thread_id)]
    batch = Batch(checkpointer, thread_id, tool_timeout, tuple(tools), observer=observer)
    records = await _read_ledger(batch, [c for c in calls if c.key is not None])  # 2. check
    answers: dict[int, ToolExecution] = {}
    to_run: list[LedgerCall] = []
    for call in calls:
        record = records.get(call.key) if call.key is not None else None
        if record is not None and call.key is not None and record.get("kind") != "intent":
            emit_event("tool_replayed", logging.INFO, thread_id=thread_id, tool=call.name, key=call.key)
            answers[call.info.index] = decode_record(call.block, call.key, record)  # recorded: the body never runs
            report(observer, call.info, answers[call.info.index])
            continue
        intent = records.get(call.intent_key) if call.intent_key is not None else None
        to_run.append(replace(call, in_doubt=intent is not None))
    approvals = check_approvals(to_run, pauses, node)  # 2b. a person says yes first, where a tool asks for it
    for call, rejected in approvals.rejected:  # never runs: its rejection is its recorded answer
        emit_event("tool_rejected", logging.INFO, thread_id=thread_id, tool=call.name, key=call.key)
        notify("rejected", call.info, rejected.result.output, True)
        answers[call.info.index] = await _record(batch, call, rejected) if call.key is not None else rejected
        report(observer, call.info, answers[call.info.index])
    if approvals.waiting:  # while one call waits, none of the batch runs
        emit_event("approval_waiting", logging.INFO, thread_id=thread_id, ids=[i.id for i in approvals.waiting])
        raise GraphInterrupt(approvals.waiting)
    to_run = approvals.runnable
    if resumed and to_run:  # a resumed node: a crashed run may have started these calls already
        again = [f"{c.name} ({c.key or 'no key'})" for c in to_run if not c.in_doubt]
        if again:
            emit_event(
                "calls_run_on_resume", logging.WARNING, thread_id=thread_id, node=node, calls=again,
                hint="they have no ledger record: if the interrupted run had started them, they run a second time "
                "(the in-flight and after-return gaps); give such tools an idempotency key or an in-doubt policy",
            )  # fmt: skip
    await _write_intents(batch, to_run)
    if len(to_run) > 1:  # 4. parallel calls: those that return together are recorded together
        batch = replace(
            batch, records=RecordBatch(checkpointer, thread_id), turns=batch_turns([c.info for c in to_run])
        )
    ran = await gather_calls([asyncio.ensure_future(_run_one(batch, call)) for call in to_run])
    paused = [i for r in ran if isinstance(r, GraphInterrupt) for i in r.interrupts]
    if paused:  # a body asked a person (interrupt()): its siblings are recorded, the run pauses
        raise GraphInterrupt(paused)
    for call, execution in zip(to_run, ran, strict=True):
        assert isinstance(execution, ToolExecution)
        answers[call.info.index] = execution
    return [answers[index] for index in range(len(calls))]


async def invoke_tool_call(
    message: Message,
    index: int,
    tools: Mapping[str, Tool],
    checkpointer: LedgerStore,
    thread_id: str,
    *,
    tool_timeout: float | None = TOOL_TIMEOUT,
    group: CallGroup | None = None,
    attempt: int = 0,
) -> ToolExecution:
    """Steps 1 to 4 for the one call at *index* of *message*, for a framework that runs each call of a message on
    its own (LangGraph's ``ToolNode`` calls its ``wrap_tool_call`` once per call, concurrently): its record is
    replayed, or the tool runs and its record is written as it returns. Parallel calls each come through here (in
    production, in no set order). *group*, shared by the message's calls (:class:`CallGroups`): one ledger read
    for all of them (else each reads its own), those that return together recorded in one write (else each alone)
    and, under a harness, their completion order (a crash here ends it for the siblings). *attempt*: answered
    pauses of its body (the attempt's own intent)."""
    records, turns, shared = (group.records, group.turns, group.reads) if group is not None else (None, None, None)
    if turns is not None:
        turns.start(index)
    try:
        crash_point("tool.before_ledger_read")
        (call,) = [replace(c, attempt=attempt) for c in ledger_calls(message, tools, thread_id, only=index)]
        batch = Batch(checkpointer, thread_id, tool_timeout, tuple(tools), records=records, turns=turns)
        found = await _read_ledger(batch, [call], shared, message) if call.key is not None else {}
        if call.key is not None and (record := found.get(call.key)) is not None and record.get("kind") != "intent":
            emit_event("tool_replayed", logging.INFO, thread_id=thread_id, tool=call.name, key=call.key)
            finish_turn(turns, index)
            return decode_record(call.block, call.key, record)
        call = replace(call, in_doubt=call.intent_key is not None and call.intent_key in found)
        await _write_intents(batch, [call])
        execution = await _run_one(batch, call)
    except BaseException as exc:
        if isinstance(exc, CrashInjected) and turns is not None:
            turns.abandon(exc)  # the process died here: no sibling records after it
        finish_turn(turns, index)  # (else its siblings would wait for it)
        raise
    if isinstance(execution, GraphInterrupt):
        raise execution  # (a body's interrupt(): LangGraph's own pass through its wrapper unrecorded)
    return execution


# -- 2. check: one batched read before anything runs -------------------------------------------------------
async def _read_ledger(
    batch: Batch, calls: list[LedgerCall], shared: SharedRead | None = None, message: Message | None = None
) -> dict[str, JSON]:
    """The records of *calls* in one read; *shared*: the read that the calls of their *message* share (the first
    one's runs, for every call of the message; the others answer from it)."""
    if not calls:
        return {}

    async def fetch() -> dict[str, JSON]:  # (shared: only the first caller's runs, for the whole message)
        siblings = call_keys(message) if shared is not None and message is not None else []
        keys = list(dict.fromkeys(k for c in calls for k in (c.key, c.intent_key, *siblings) if k is not None))
        crash_point("ledger.read_error")
        return await batch.checkpointer.aget_tool_results(batch.thread_id, keys)

    try:  # (a later attempt reads its own intent: the shared read has the first attempts' only)
        return await (fetch() if shared is None or calls[0].attempt else shared.get(fetch))
    except RunLockLostError:
        raise  # not a failed read: the thread is another run's now, and no tool may run
    except Exception as exc:
        watched = sorted({c.name for c in calls if c.tool is not None and c.tool.policy})
        if watched:  # they never run without knowing whether they ran: the run stops, the thread stays resumable
            raise LedgerReadError(watched, batch.thread_id, exc) from exc
        for call in calls:
            log.warning(
                "ledger read failed (%s: %s); running tool %r without replay protection (key %r, thread %r): "
                "skipping a tool that never ran is worse", type(exc).__name__, exc, call.name, call.key, batch.thread_id
            )  # fmt: skip
        return {}


async def _write_intents(batch: Batch, to_run: list[LedgerCall]) -> None:
    """The intents of the batch's opted-in calls, all before any call starts: one that cannot be written stops
    the node (:class:`IntentWriteError`) while nothing has run, so no sibling's effect is left unrecorded."""
    for call in to_run:
        if call.key is None or call.in_doubt or call.tool is None or call.tool.policy is None:
            continue
        try:
            call.tool.parse_args(call.block.args)
        except ToolArgumentError:
            continue  # answered with an error without running: nothing to be in doubt about
        await write_intent(call, batch.checkpointer)


# -- 3. invoke, and record as soon as the tool returns ----------------------------------------------------
async def _run_one(batch: Batch, call: LedgerCall) -> ToolExecution | GraphInterrupt:
    """The call's execution, or the pause its body asked for (its siblings go on and are recorded)."""
    index = call.info.index
    try:
        with running_call(call.info), tool_span(batch.observer, call) as traced:  # seen by the body, crash points
            execution = await _execute(batch, call)
            report(batch.observer, call.info, execution, traced)
    except GraphInterrupt as paused:
        finish_turn(batch.turns, index)
        return paused
    except Exception:
        finish_turn(batch.turns, index)
        raise
    # (a BaseException such as a crash passes no turn on: a dying process lets no sibling record after it)
    finish_turn(batch.turns, index)
    return execution


async def _execute(batch: Batch, call: LedgerCall) -> ToolExecution:
    tool, block, key = call.tool, call.block, call.key
    if tool is None:
        names = ", ".join(batch.tool_names) or "none"
        return error_execution(block, key, f"unknown tool {block.name!r}; available tools: {names}")
    try:
        args = tool.parse_args(block.args)
    except ToolArgumentError as exc:
        return error_execution(block, key, str(exc))
    if key is not None and call.in_doubt:
        decision = await resolve_in_doubt(call, args)
        if decision.execution is not None:
            return await _record(batch, call, decision.execution) if decision.record else decision.execution
    await batch.checkpointer.acheck_run_lock(batch.thread_id)  # fencing: never invoke a tool without the lock
    crash_point("tool.before_invoke")
    if tool.effect is Effect.TRANSACTIONAL and key is not None:  # its writes commit with its record (no timeout)
        decision = await run_transactional(call, args, batch.checkpointer, batch.tool_timeout)
        assert decision.execution is not None
        return await _record(batch, call, decision.execution) if decision.record else decision.execution
    try:
        value = await _invoke(batch, call, args)
    except (GraphInterrupt, ToolUnavailableError):
        raise  # a person was asked, or the tool's server is gone: no answer to record; the node stops here
    except TimeoutError:
        err = ToolTimeoutError(block.name, batch.tool_timeout or 0)
        log.warning("%s (thread %r, key %r); nothing recorded", err, batch.thread_id, key)
        return error_execution(block, key, f"{type(err).__name__}: {err}", status="timeout")
    except Exception as exc:  # the model sees the error and can act on it; it is recorded like a result
        log.info("tool %r raised %s: %s (thread %r, key %r)", block.name, type(exc).__name__, exc, batch.thread_id, key)
        execution = error_execution(block, key, f"{type(exc).__name__}: {exc}")
    else:
        execution = execution_of(block, key, value)
    crash_point("tool.after_return")
    if key is None or not tool.recorded:  # a read tool may simply run again: no record, no commit
        return execution
    return await _record(batch, call, execution)


async def _invoke(batch: Batch, call: LedgerCall, args: dict[str, JSON]) -> JSON:
    tool, info = call.tool, call.info
    assert tool is not None
    notify("start", info)
    if tool.injected:
        args = {**args, **tool.injected_args(info)}
    try:
        value = await _call(tool, args, batch.tool_timeout)
    except GraphInterrupt:
        await wait_turn(batch.turns, info.index)
        notify("paused", info)
        raise
    except ToolUnavailableError:
        raise  # its outcome is unknown: no "end" (to an observer, the call was in flight)
    except TimeoutError:
        await wait_turn(batch.turns, info.index)
        notify("timeout", info)
        raise
    except Exception as exc:
        returned = time.monotonic()
        await wait_turn(batch.turns, info.index)
        notify("end", info, f"{type(exc).__name__}: {exc}", True, at=returned)
        raise
    returned = time.monotonic()  # (observers learn when the body returned, not when its turn came)
    await wait_turn(batch.turns, info.index)
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
        # Sync tools run off the event loop (within the run's share of threads, a server's per owner). A timed-out
        # thread cannot be stopped; its result is discarded, and it is counted until it returns.
        run = current_run()
        return await to_thread_in(run.config.thread_share if run is not None else None, tool.fn, **args)


async def _record(batch: Batch, call: LedgerCall, execution: ToolExecution) -> ToolExecution:
    key = call.key
    assert key is not None
    name = execution.call.name
    try:
        crash_point("ledger.write_error")
        # The checkpointer encodes the record once; an unserialisable result raises SerializationError there.
        if batch.records is not None:  # parallel calls: those that return together are recorded together
            await batch.records.put(key, encode_record(execution))
        else:
            await batch.checkpointer.aput_tool_result(batch.thread_id, key, encode_record(execution))
    except SerializationError as exc:
        log.error(
            "tool %r returned a value that cannot be stored (key %r, thread %r): %s. Its error result is recorded "
            "instead; return JSON values (no NUL characters, valid UTF-8) from tools",
            name, key, batch.thread_id, exc.__cause__ or exc,
        )  # fmt: skip
        text = f"tool {name!r} returned a value that cannot be stored: {exc.__cause__ or exc}"
        return await _record(batch, call, error_execution(execution.call, key, text))  # storable: never re-run
    except Exception as exc:
        log.error(
            "tool %r completed but its result was not recorded in the ledger (key %r, thread %r): %s: %s. "
            "The call may run again on replay",
            name, key, batch.thread_id, type(exc).__name__, exc,
        )  # fmt: skip
        emit_event("ledger_write_failed", logging.DEBUG, thread_id=batch.thread_id, tool=name, key=key)
        add_event("tenxgraph.ledger.write_failed", {"tenxgraph.ledger.key": key, "error.type": type(exc).__name__})
        return execution
    notify("recorded", call.info)
    crash_point("tool.after_record")
    return ToolExecution(execution.call, key, execution.result, execution.update, recorded=True)
