"""Deliberately broken LangGraph wrappers: each breaks one promise of ``ReplaySafeToolNode`` (not of the ledger it
calls, whose mutants are in tests/mutants.py). ``apply(name)`` patches this process; tests/test_langgraph_gate.py
runs the crash matrix over the LangGraph example against each and requires cells failing for its own reason."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import replace
from typing import Any


def lg_ledger_read_ignored() -> None:
    """The wrapper runs and records each call without reading the ledger first: a replay runs it again."""
    from tenxgraph.core.graph.utils import invoke_node_handler as handler
    from tenxgraph.integrations.langgraph import tools

    async def no_read(message: Any, index: int, tool_map: Any, checkpointer: Any, thread_id: str, **kw: Any) -> Any:
        (call,) = handler.ledger_calls(message, tool_map, thread_id, only=index)
        batch = handler.Batch(checkpointer, thread_id, kw.get("tool_timeout"), tuple(tool_map))
        return await handler._run_one(batch, call)

    tools.invoke_tool_call = no_read  # type: ignore[assignment]


def lg_key_from_call_id() -> None:
    """The wrapper keys each call by its tool_call_id alone (the AIMessage's id left out): a later turn's
    ``call_0`` is answered with the first turn's record."""
    from tenxgraph.core.graph.utils import invoke_node_handler as handler
    from tenxgraph.integrations.langgraph import tools

    async def short_key(message: Any, index: int, tool_map: Any, checkpointer: Any, thread_id: str, **kw: Any) -> Any:
        (call,) = handler.ledger_calls(message, tool_map, thread_id, only=index)
        call = replace(call, info=replace(call.info, key=call.block.id))
        batch = handler.Batch(checkpointer, thread_id, kw.get("tool_timeout"), tuple(tool_map))
        record = (await handler._read_ledger(batch, [call])).get(call.key)
        if record is not None:
            return handler.decode_record(call.block, call.key, record)
        return await handler._run_one(batch, call)

    tools.invoke_tool_call = short_key  # type: ignore[assignment]


def lg_record_never_written() -> None:
    """The wrapper hands the ledger a checkpointer whose record writes go nowhere (the ledger believes them)."""
    from tenxgraph.integrations.langgraph import tools
    from tenxgraph.storage.checkpointer.delegating import DelegatingCheckpointer

    class Forgetful(DelegatingCheckpointer):
        async def aput_tool_result(self, thread_id: str, key: str, result: Any) -> bool:
            return True

        async def aput_tool_results(self, thread_id: str, records: Any) -> list[bool]:
            return [True] * len(records)  # (a group of siblings that returned together: all "written")

    original = tools.ReplaySafeToolCalls.__init__

    def init(self: Any, ledger: Any, **kw: Any) -> None:
        original(self, ledger, **kw)
        self.ledger = Forgetful(ledger)

    tools.ReplaySafeToolCalls.__init__ = init  # type: ignore[method-assign]


def lg_body_key_unstable() -> None:
    """``current_idempotency_key()`` in a tool's body is a new key at every call, not the call's ledger key: the
    provider sees a new key after a crash (the ledger's account still names the call's own)."""
    import uuid

    import tenxgraph.integrations.langgraph as package
    from tenxgraph.integrations.langgraph import tools

    def fresh() -> str:
        return f"tenx-{uuid.uuid4().hex}"

    package.current_idempotency_key = tools.current_idempotency_key = fresh  # type: ignore[assignment]


def lg_declarations_dropped() -> None:
    """The wrapper reads no tool's declaration (``effects=``, ``on_in_doubt=``, the tool's ``metadata``): every
    call is handled as undeclared (an in-doubt policy the user set is never applied)."""
    from tenxgraph.integrations.langgraph import tools

    def undeclared(self: Any, tool: Any) -> tuple[None, None, None]:
        return None, None, None

    tools.ReplaySafeToolCalls._policy = undeclared  # type: ignore[method-assign]


def lg_error_recorded_as_success() -> None:
    """The wrapper records every call as a success, whatever the ``ToolMessage``'s status said: a replay answers a
    failed call as if it had worked (the first run still shows LangGraph's own error message)."""
    from tenxgraph.core.tools.tool import ToolOutput
    from tenxgraph.integrations.langgraph import ledger_tool

    def succeeded(content: Any, is_error: bool = False) -> ToolOutput:
        return ToolOutput(content, is_error=False)

    setattr(ledger_tool, "ToolOutput", succeeded)  # noqa: B010 (the module's name the wrapper calls)


def lg_tool_commits_alone() -> None:
    """A transactional tool's writes are committed as soon as its body returns, and its record written after, in
    a transaction of its own (SQLite): a crash between the two leaves the writes without their record, and the
    resumed call writes them again."""
    import sqlite3
    from contextlib import contextmanager

    from tenxgraph.integrations.langgraph import ledger_tool

    original = ledger_tool.in_transaction

    @contextmanager
    def committing(tx: Any) -> Iterator[None]:
        with original(tx):
            yield
        if isinstance(tx.connection, sqlite3.Connection):
            tx.connection.commit()

    ledger_tool.in_transaction = committing  # type: ignore[assignment]


def lg_prune_forgets_unseen_threads() -> None:
    """The ledger's retention job deletes the records of a thread with no row in our ``threads`` table (as it did
    before it kept what it cannot see finished): a LangGraph thread's records go between its crash and its resume
    (SQLite)."""
    from tenxgraph.storage.checkpointer import sqlite

    sqlite.PRUNE = sqlite.PRUNE.replace(  # type: ignore[attr-defined]
        "OR EXISTS (", "OR NOT EXISTS ("
    ).replace("NOT IN (?, ?, ?)", "IN (?, ?, ?)")


def lg_resume_once_unlocked() -> None:
    """``resume_once`` takes no lock: every resumer that finds the pause pending goes on with the rest of the
    thread (the paused step itself still runs once, under its own lock)."""
    from contextlib import asynccontextmanager

    from tenxgraph.integrations.langgraph import answering

    @asynccontextmanager
    async def unlocked(*args: Any) -> Any:
        yield

    answering.call_lock = unlocked  # type: ignore[assignment]


LG_MUTANTS: dict[str, Callable[[], None]] = {
    f.__name__: f
    for f in (
        lg_ledger_read_ignored,
        lg_key_from_call_id,
        lg_record_never_written,
        lg_body_key_unstable,
        lg_declarations_dropped,
        lg_error_recorded_as_success,
        lg_tool_commits_alone,
        lg_prune_forgets_unseen_threads,
        lg_resume_once_unlocked,
    )
}


def apply(name: str | None) -> None:
    if name:
        LG_MUTANTS[name]()
