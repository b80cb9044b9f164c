"""One answer to a parked LangGraph ``interrupt()``, however many processes send it: :func:`resume_once`.

LangGraph lets every process that sends ``Command(resume=...)`` for one pause run the rest of the thread: under
``ReplaySafeToolNode`` the resumed tool step runs once (see :mod:`.pauses`), but each resumer then goes on to the
next steps, so a model turn after the pause runs k times and the calls it asks for are k new calls (new message
ids: the ledger cannot tell them apart). :func:`resume_once` sends the answer as our own runtime takes one:

1. under the thread's resume lock (the ledger's run lock: a PostgreSQL advisory lock, a byte of SQLite's lock
   file; released when its holder dies), waiting while another resumer holds it;
2. if the interrupts it answers are still pending, it records the answers (``decision`` records keyed by the
   interrupt and the checkpoint it paused at, first write wins) and resumes the thread with ``invoke``;
3. if another resumer answered them already, it runs nothing and returns the thread as it stands, or raises
   :class:`~tenxgraph.errors.InterruptDecidedError` if its answer differs from the one recorded (that one
   stands).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from tenxgraph.integrations.langgraph.pauses import call_lock, canonical
from tenxgraph.ledger import LedgerStore
from tenxgraph.utils.errors import ConfigError, InterruptDecidedError
from tenxgraph.utils.sync import run_sync, to_thread

__all__ = ["aresume_once", "resume_once"]

#: How far back a resumer that came late looks for the checkpoint its interrupt was pending at.
HISTORY = 50
#: How long a resumer waits for the one that holds the thread's resume lock (seconds).
RESUME_WAIT_S = 60.0


def resume_once(
    app: Any, command: Any, config: Mapping[str, Any], *, ledger: LedgerStore, wait: float = RESUME_WAIT_S,
    **kwargs: Any,
) -> Any:  # fmt: skip
    """Answer a paused thread of the compiled LangGraph graph *app* once across processes (see the module's
    docstring): *command* is ``Command(resume={interrupt_id: answer})``; *ledger* the checkpointer your
    ``ReplaySafeToolNode`` records in; *kwargs* go to ``invoke`` (``durability="sync"``). Returns what
    ``invoke`` returns, or the thread's values as they stand when another resumer answered first."""
    return run_sync(_resume_once(app, command, config, ledger, wait, kwargs, False))


async def aresume_once(
    app: Any, command: Any, config: Mapping[str, Any], *, ledger: LedgerStore, wait: float = RESUME_WAIT_S,
    **kwargs: Any,
) -> Any:  # fmt: skip
    """:func:`resume_once` for async graphs (``ainvoke``)."""
    return await _resume_once(app, command, config, ledger, wait, kwargs, True)


async def _resume_once(
    app: Any,
    command: Any,
    config: Mapping[str, Any],
    ledger: LedgerStore,
    wait: float,
    kwargs: dict[str, Any],
    is_async: bool,
) -> Any:
    answers = getattr(command, "resume", None)
    if not isinstance(answers, Mapping) or not answers:
        raise ConfigError(
            "resume_once takes Command(resume={interrupt_id: answer, ...}): the ids of the interrupts it answers "
            "(result['__interrupt__'][i].id), so that a resumer that comes late can tell whether they are answered"
        )
    thread_id = str((config.get("configurable") or {}).get("thread_id") or "")
    if not thread_id:
        raise ConfigError("resume_once: config has no configurable.thread_id; say which thread to resume")
    given = {str(i): canonical(a) for i, a in answers.items()}
    async with call_lock(ledger, thread_id, "\x00resume", wait):
        state = await to_thread(app.get_state, config)
        pending = {i.id for i in state.interrupts}
        if set(given) <= pending:  # the first to answer: record the answers, then go on
            checkpoint = str(state.config["configurable"]["checkpoint_id"])
            records = [(_key(i, checkpoint), {"v": 1, "kind": "decision", "interrupt": i, "value": v})
                       for i, v in given.items()]  # fmt: skip
            found = await ledger.aget_tool_results(thread_id, [k for k, _ in records])
            _check(thread_id, given, found, checkpoint)
            new = [(k, r) for k, r in records if k not in found]
            if new:
                await ledger.aput_tool_results(thread_id, new)
            if is_async:
                return await app.ainvoke(command, config, **kwargs)
            return await to_thread(app.invoke, command, config, **kwargs)
        recorded = await _recorded(app, ledger, config, thread_id, [i for i in given if i not in pending])
        for interrupt_id, value in given.items():
            if interrupt_id in recorded and recorded[interrupt_id] != value:
                raise InterruptDecidedError(thread_id, interrupt_id, recorded[interrupt_id], value)
        if set(given) & pending:
            raise ConfigError(
                f"resume_once on thread {thread_id!r}: of the interrupts answered, {sorted(set(given) & pending)} "
                f"are pending and {sorted(set(given) - pending)} are not: answer the pending ones "
                "(app.get_state(config).interrupts)"
            )
        return (await to_thread(app.get_state, config)).values


def _key(interrupt_id: str, checkpoint_id: str) -> str:
    return f"decision:{interrupt_id}:{checkpoint_id}"


def _check(thread_id: str, given: dict[str, Any], found: dict[str, Any], checkpoint: str) -> None:
    """A resumer that recorded its answers and died before LangGraph took them: the recorded ones stand."""
    for interrupt_id, value in given.items():
        record = found.get(_key(interrupt_id, checkpoint))
        if record is not None and record.get("value") != value:
            raise InterruptDecidedError(thread_id, interrupt_id, record.get("value"), value)


async def _recorded(
    app: Any, ledger: LedgerStore, config: Mapping[str, Any], thread_id: str, answered: list[str]
) -> dict[str, Any]:
    """The recorded answers to *answered* (interrupts no longer pending): each at the latest checkpoint of the
    thread's history where it was pending."""
    where: dict[str, str] = {}

    def look() -> None:
        for snapshot in app.get_state_history(config, limit=HISTORY):
            for interrupt in snapshot.interrupts:
                if interrupt.id in answered and interrupt.id not in where:
                    where[interrupt.id] = str(snapshot.config["configurable"]["checkpoint_id"])
            if len(where) == len(answered):
                return

    await to_thread(look)
    keys = {i: _key(i, c) for i, c in where.items()}
    found = await ledger.aget_tool_results(thread_id, list(keys.values()))
    return {i: found[k].get("value") for i, k in keys.items() if k in found}
