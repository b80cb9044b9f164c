"""A LangGraph app in a crash-matrix cell: the saver the harness gives it (crash points around LangGraph's
``put`` / ``put_writes``), the watcher of tool calls no ledger guards (a bare ``ToolNode``), and how a run is
started, resumed and read back. LangGraph is imported only when a test drives a LangGraph app.

- :func:`crash_point_saver`: the public ``CrashPointSaver`` (``tenxgraph.integrations.langgraph.saver``) around the
  cell's real saver (``InMemorySaver``, ``SqliteSaver``, ``PostgresSaver``, one per process: a forked child opens
  its own connection); it fires ``langgraph.after_put_writes`` once a task's writes are saved,
  ``langgraph.before_put`` before a step's checkpoint is saved and ``langgraph.after_put`` after.
- :class:`ToolWatch`, a LangChain callback handler the harness passes with each run: a tool call that runs outside
  our ledger (LangGraph's own ``ToolNode``) is logged as it starts and returns, as unrecorded, with the harness's
  call identity (its ``AIMessage`` and index), and fires ``tool.before_invoke`` / ``tool.after_return`` around it.
  Calls that go through the ledger (``ReplaySafeToolNode``) are logged by the ledger itself.
- :class:`LangGraphApp`: one ``crash_run.invoke`` of a LangGraph app. Resuming a crashed thread is what a LangGraph
  user does: ``invoke(None)`` when the thread has a checkpoint (LangGraph goes on from it and from the writes saved
  after it), the input again when the crash came before the first checkpoint was saved.
"""

from __future__ import annotations

import asyncio
import os
import sqlite3
import threading
import time
from collections.abc import AsyncIterator, Callable, Mapping, Sequence
from contextlib import ExitStack
from pathlib import Path
from typing import TYPE_CHECKING, Any
from uuid import UUID

import pytest

from pytest_replaysafe.judge.evidence import (
    UNDECLARED,
    UNRECORDED,
    Entry,
    ExecutionLog,
    call_id_of,
    fingerprint,
    preview,
)
from pytest_replaysafe.run.witness import langgraph_declarations
from tenxgraph.core.crashpoints import crash_point
from tenxgraph.core.graph.results import RunResult
from tenxgraph.core.tools.context import ToolCallInfo, current_tool_call, running_call
from tenxgraph.integrations.langgraph.resuming import resume_input
from tenxgraph.state.state import AgentState
from tenxgraph.storage.checkpointer.base import BaseCheckpointer
from tenxgraph.utils.sync import run_sync

if TYPE_CHECKING:
    from langgraph.checkpoint.base import BaseCheckpointSaver

LANGGRAPH_EXTRA = "pip install 'tenxgraph[langgraph]'"


def is_langgraph_app(app: object) -> bool:
    """A compiled LangGraph graph (a ``Pregel``), told without importing LangGraph."""
    return any(c.__module__.startswith("langgraph.pregel") for c in type(app).__mro__)


def _import_langgraph() -> None:
    from tenxgraph.integrations.langgraph import require_langgraph

    require_langgraph()


# -- the saver ------------------------------------------------------------------------------------------------
def saver_factory(ledger: BaseCheckpointer, workdir: Path) -> Callable[[], tuple[BaseCheckpointSaver[Any], Any]]:
    """How to open the LangGraph saver on the same backend as *ledger*: ``(saver, what to close)``."""
    _import_langgraph()
    from tenxgraph.storage.checkpointer import InMemoryCheckpointer, SqliteCheckpointer
    from tenxgraph.storage.checkpointer.pg import PgCheckpointer

    if isinstance(ledger, InMemoryCheckpointer):
        from langgraph.checkpoint.memory import InMemorySaver

        return lambda: (InMemorySaver(), None)
    if isinstance(ledger, SqliteCheckpointer):
        from langgraph.checkpoint.sqlite import SqliteSaver

        path = workdir / "langgraph.db"

        def sqlite_saver() -> tuple[BaseCheckpointSaver[Any], Any]:
            conn = sqlite3.connect(path, check_same_thread=False, timeout=30)
            conn.execute("PRAGMA journal_mode=WAL")
            return SqliteSaver(conn), conn

        return sqlite_saver
    if isinstance(ledger, PgCheckpointer):
        import psycopg
        from langgraph.checkpoint.postgres import PostgresSaver
        from psycopg.rows import dict_row

        dsn, schema = ledger.postgres_dsn, ledger.schema
        if dsn is None:
            raise TypeError(
                "crash_run.langgraph_checkpointer: the PostgreSQL ledger was built on a pool of yours; "
                "give it postgres_dsn= so that the harness can open LangGraph's PostgresSaver beside it"
            )

        def pg_saver() -> tuple[BaseCheckpointSaver[Any], Any]:
            conn = psycopg.Connection.connect(
                dsn, autocommit=True, prepare_threshold=0, row_factory=dict_row, options=f"-c search_path={schema}"
            )
            conn.execute(f'CREATE SCHEMA IF NOT EXISTS "{schema}"')
            saver = PostgresSaver(conn)
            saver.setup()
            return saver, conn

        return pg_saver
    raise TypeError(
        f"crash_run.langgraph_checkpointer: no LangGraph saver for a {type(ledger).__name__} backend (memory, "
        "sqlite and postgres have one); give the cell one of those backends"
    )


def crash_point_saver(factory: Callable[[], tuple[BaseCheckpointSaver[Any], Any]]) -> BaseCheckpointSaver[Any]:
    """The saver a LangGraph app under the matrix is compiled with: the public
    :class:`~tenxgraph.integrations.langgraph.saver.CrashPointSaver` (which fires the ``langgraph.*`` points) around
    this process's own saver, opened by *factory* (a forked child opens its own connection)."""
    from langgraph.checkpoint.base import BaseCheckpointSaver

    from tenxgraph.integrations.langgraph.saver import CrashPointSaver

    class PerProcessSaver(CrashPointSaver):
        """Writes nothing once a crash fired in this process; async methods run the sync ones in a thread (the
        SQLite and PostgreSQL savers here are sync)."""

        def __init__(self) -> None:
            self._pid = -1
            self._closers: list[tuple[int, Any]] = []
            self._lock = threading.Lock()
            #: When each task's writes were saved, per thread (CLOCK_MONOTONIC, as the execution log's times).
            self.saved_writes: dict[str, list[float]] = {}
            BaseCheckpointSaver.__init__(self)  # (the saver is opened on first use, by the process that uses it)

        @property
        def inner(self) -> BaseCheckpointSaver[Any]:
            with self._lock:
                if self._pid != os.getpid():
                    self._saver, closer = factory()
                    self._pid = os.getpid()
                    self._closers.append((self._pid, closer))
                    self.serde = self._saver.serde
                return self._saver

        def writing(self) -> None:
            _alive()

        def with_allowlist(self, extra_allowlist: Any) -> BaseCheckpointSaver[Any]:
            return self  # (each process's saver is opened by the factory, with LangGraph's default serde)

        def put_writes(self, config: Any, writes: Sequence[tuple[str, Any]], task_id: str, task_path: str = "") -> None:
            super().put_writes(config, writes, task_id, task_path)
            thread = str((config.get("configurable") or {}).get("thread_id"))
            self.saved_writes.setdefault(thread, []).append(time.monotonic())
            crash_point("langgraph.late_put_writes")  # (the kill is held: see late_kill)

        def late_reach(self, thread: str, entries: Sequence[Entry]) -> int:
            """The hits of ``langgraph.late_put_writes`` in the clean run on *thread* that a later tool call's
            return followed (only those can play the race): the saves before the last return in *entries*."""
            returns = [e.t for e in entries if e.event == "end" and e.t is not None]
            return sum(1 for t in self.saved_writes.get(thread, []) if returns and t < max(returns))

        def close(self) -> None:
            for pid, closer in self._closers:
                if closer is not None and pid == os.getpid():
                    closer.close()
            self._closers.clear()
            self._pid = -1

        async def aget_tuple(self, config: Any) -> Any:
            return await _in_thread(self.get_tuple, config)

        async def alist(self, config: Any, **kw: Any) -> AsyncIterator[Any]:
            for item in await _in_thread(lambda: list(self.list(config, **kw))):
                yield item

        async def aput(self, config: Any, checkpoint: Any, metadata: Any, new_versions: Any) -> Any:
            return await _in_thread(self.put, config, checkpoint, metadata, new_versions)

        async def aput_writes(
            self, config: Any, writes: Sequence[tuple[str, Any]], task_id: str, task_path: str = ""
        ) -> None:
            await _in_thread(self.put_writes, config, writes, task_id, task_path)

        async def adelete_thread(self, thread_id: str) -> None:
            await _in_thread(self.delete_thread, thread_id)

    return PerProcessSaver()


#: How long the kill at ``langgraph.late_put_writes`` waits for a later tool call to return, in seconds.
LATE_HOLD_S = 60.0


def late_kill(
    crash: Callable[[str, int], None], window: dict[str, str], settle: Callable[[], None] | None = None
) -> Callable[[str, int], None]:
    """The action at ``langgraph.late_put_writes``: LangGraph's race, played on purpose. LangGraph saves a task's
    writes in a background thread, even with ``durability="sync"``, and goes on with the next steps; a kill in
    that thread can land while a later step's tool runs. Here the saving thread holds the kill (*crash*) until the
    next tool call has returned (``tool.after_return``: its effect done, its record not written), and that call
    holds until the kill, then dies with the process: the call is the cell's *window*."""
    from tenxgraph.core import crashpoints
    from tenxgraph.core.crashpoints import CrashInjected

    def fire(name: str, n: int) -> None:
        returned, killed = threading.Event(), threading.Event()
        _late_holding.set()  # (the point has fired; the process lives on until the kill)

        def at_return(point: str, arrival: int) -> None:
            call = current_tool_call()
            window.setdefault("id", call_id_of(call.message_id, call.index) if call else "*")
            if settle is not None:
                settle()
            returned.set()
            killed.wait(LATE_HOLD_S)
            raise CrashInjected(point, arrival)  # (in-process: this call dies with the process)

        crashpoints.arm("tool.after_return", 1, at_return)
        try:
            if not returned.wait(LATE_HOLD_S):
                raise RuntimeError(
                    f"{name} (hit {n}): no later tool call returned within {LATE_HOLD_S:g}s, although one did in "
                    "the clean run: the crashing run went another way than the clean run"
                )
        finally:
            _late_holding.clear()
        try:
            crash(name, n)
        finally:
            killed.set()

    return fire


#: Set while the kill at ``langgraph.late_put_writes`` is held (see :func:`late_kill`): the process still lives.
_late_holding = threading.Event()


def _alive() -> None:
    """A crash point has fired in this process (an in-process crash): the process is dead, and writes nothing more
    (LangGraph saves a failed task's error as it unwinds; a killed process would not)."""
    from tenxgraph.core.crashpoints import CrashInjected, fired

    done = [] if _late_holding.is_set() else fired()
    if done:
        raise CrashInjected(*done[0])


async def _in_thread(fn: Callable[..., Any], *args: Any) -> Any:
    from tenxgraph.utils.sync import to_thread

    return await to_thread(fn, *args)


# -- the watcher of unguarded tool calls ---------------------------------------------------------------------------
def tool_watch(log: ExecutionLog, thread: str, declarations: Mapping[str, tuple[str | None, str | None]]) -> Any:
    """A LangChain callback handler for one run on *thread* (see :class:`ToolWatch`); *declarations*: each guarded
    tool's effect class and in-doubt policy, as the witness read them from the app
    (:func:`~pytest_replaysafe.run.witness.langgraph_declarations`)."""
    from langchain_core.callbacks import BaseCallbackHandler

    from tenxgraph.integrations.langgraph.messages import find_call, messages_of

    class ToolWatch(BaseCallbackHandler):
        """Logs the calls no ledger guards, and fires the tool crash points around them."""

        run_inline = True  # in the tool's own thread and context, before and after its body
        raise_error = True

        def __init__(self) -> None:
            self.inputs: dict[UUID, Any] = {}
            self.parents: dict[UUID, UUID | None] = {}
            self.calls: dict[UUID, tuple[ToolCallInfo, ExitStack]] = {}
            self.bodies: dict[UUID, Entry] = {}  # ledger-guarded calls under way: their witness's body event

        def on_chain_start(self, serialized: Any, inputs: Any, *, run_id: UUID, **kw: Any) -> None:
            self.inputs[run_id], self.parents[run_id] = inputs, kw.get("parent_run_id")

        def _find(self, parent: UUID | None, tool_call_id: str | None) -> tuple[str, int] | None:
            while parent is not None:
                found = find_call(messages_of(self.inputs.get(parent)), tool_call_id)
                if found is not None and found[0].id is not None:
                    return found[0].id, found[1]
                parent = self.parents.get(parent)
            return None

        def on_tool_start(self, serialized: Any, input_str: str, *, run_id: UUID, **kw: Any) -> None:
            name, call_id = str((serialized or {}).get("name")), kw.get("tool_call_id")
            found = self._find(kw.get("parent_run_id"), call_id)
            if found is None:
                return  # a tool called outside a tool node: not a call the model asked for
            guarded = current_tool_call()
            if guarded is not None:  # a ReplaySafeToolNode call: the ledger logs it; the witness sees its body
                self.bodies[run_id] = self._witness(guarded, found, name)
                return
            message_id, index = found
            info = ToolCallInfo(thread, message_id, call_id, name, index, None)  # no ledger key: none guards it
            stack = ExitStack()
            stack.enter_context(running_call(info))  # the call's crash window; its effects are attributed to it
            try:
                crash_point("tool.before_invoke")
            except BaseException:
                stack.close()
                raise
            self._log(info, "start")
            self.calls[run_id] = (info, stack)

        def on_tool_end(self, output: Any, *, run_id: UUID, **kw: Any) -> None:
            self._ended(run_id, getattr(output, "content", output), getattr(output, "status", None) == "error")

        def on_tool_error(self, error: BaseException, *, run_id: UUID, **kw: Any) -> None:
            self._ended(run_id, f"{type(error).__name__}: {error}", True)

        def _witness(self, info: ToolCallInfo, found: tuple[str, int], name: str) -> Entry:
            """The harness's own view of a body the ledger runs: the key it gets (``current_idempotency_key()``
            in its context) and, at its end, its outcome (LangGraph's ``ToolMessage.status``, or its error)."""
            from tenxgraph.integrations.langgraph import current_idempotency_key

            call, key = call_id_of(*found), current_idempotency_key()
            if name in declarations:
                effect, policy = declarations[name]
                body = Entry(info.thread_id, info.execution_id, "body", name, policy=policy, effect=effect, ikey=key,
                             call=call, via="langgraph")  # fmt: skip
            else:
                body = Entry(info.thread_id, info.execution_id, "body", name, ikey=key, call=call, via=UNDECLARED)
            log.write(body)
            return body

        def _ended(self, run_id: UUID, output: Any, error: bool) -> None:
            body = self.bodies.pop(run_id, None)
            if body is not None:
                log.write(Entry(body.thread, body.id, "body_end", body.tool, error=error, call=body.call, via=body.via))
            found = self.calls.pop(run_id, None)
            if found is None:
                return
            info, stack = found
            self._log(info, "end", output, error)
            with stack:
                crash_point("tool.after_return")

        def _log(self, info: ToolCallInfo, event: str, output: Any = None, error: bool = False) -> None:
            ended = event == "end"
            log.write(
                Entry(
                    thread=info.thread_id,
                    id=info.execution_id,
                    event=event,
                    tool=info.tool,
                    fp=fingerprint(output) if ended else None,
                    error=error,
                    cond=UNRECORDED,
                    call=call_id_of(info.message_id, info.index),
                    t=round(time.monotonic(), 6),
                    out=preview(output) if ended else None,
                )
            )

    return ToolWatch()


# -- one drive of a LangGraph app -----------------------------------------------------------------------------
class LangGraphApp:
    """A LangGraph app as the cell driver runs it: started, resumed and read back on a thread."""

    def __init__(self, app: Any, input: Mapping[str, Any], log: ExecutionLog, durability: str | None) -> None:
        self.app, self.input, self.log, self.durability = app, dict(input), log, durability
        self.declarations = langgraph_declarations(app)  # the witness's own reading of each tool's declaration
        #: A graph with a node that has only an async function runs through ``ainvoke`` / ``astream``.
        self.is_async = any(
            getattr(node.bound, "func", "") is None and getattr(node.bound, "afunc", None) is not None
            for node in getattr(app, "nodes", {}).values()
        )

    def _config(self, thread: str, config: Mapping[str, Any]) -> dict[str, Any]:
        configurable = {**(config.get("configurable") or {}), "thread_id": thread}
        callbacks = [*(config.get("callbacks") or []), tool_watch(self.log, thread, self.declarations)]
        rest = {k: v for k, v in config.items() if k not in ("configurable", "callbacks", "lock_timeout")}
        return {**rest, "configurable": configurable, "callbacks": callbacks}

    def run(self, input: Mapping[str, Any] | None, thread: str, config: Mapping[str, Any], stream: bool) -> Any:
        """Start the run (*input*), or resume the thread (None), as a LangGraph user would."""
        cfg = self._config(thread, config)
        if input is None:  # a resume, the user's way: invoke(None), or the input again if nothing was saved
            input = resume_input(self.app, self.input, cfg)
        kw = {"durability": self.durability} if self.durability else {}
        if self.is_async:
            run_sync(self._arun(input, cfg, stream, kw))
        elif stream:
            for _ in self.app.stream(input, cfg, stream_mode="values", **kw):
                pass
        else:
            self.app.invoke(input, cfg, **kw)
        return self.result(thread)

    async def _arun(self, input: Any, cfg: dict[str, Any], stream: bool, kw: dict[str, Any]) -> None:
        """An async graph's run: ``astream`` or ``ainvoke``, on the loop of tenxgraph's sync wrappers. After an
        in-process crash the run's tasks still pending are cancelled and awaited, as a dead process's would stop
        (LangGraph's ``ToolNode`` gathers a batch's calls: a call that crashed leaves its siblings running)."""
        before = asyncio.all_tasks()
        try:
            if stream:
                async for _ in self.app.astream(input, cfg, stream_mode="values", **kw):
                    pass
            else:
                await self.app.ainvoke(input, cfg, **kw)
        except BaseException:
            await _stop_leftovers(before)
            raise

    def result(self, thread: str) -> RunResult[Any]:
        """The thread's stored conversation, as tenxgraph messages (what the verdict reads)."""
        from tenxgraph.integrations.langgraph.messages import messages_of, to_messages

        snapshot = self.app.get_state({"configurable": {"thread_id": thread}})
        if not snapshot.values:
            raise RuntimeError(f"thread {thread!r} has no LangGraph checkpoint after the run")
        return RunResult(thread, AgentState(messages=to_messages(messages_of(snapshot.values))), 0)


OURS = ("langgraph", "langchain", "tenxgraph")


def _module_of(task: asyncio.Task[Any]) -> str:
    """The module of the coroutine a task runs ("" once it finished, or for a task that runs no coroutine)."""
    frame = getattr(task.get_coro(), "cr_frame", None)
    return str(frame.f_globals.get("__name__", "")) if frame is not None else ""


async def _stop_leftovers(before: set[asyncio.Task[Any]]) -> None:
    """Cancel and await the tasks of a crashed async run (those made since *before*, by LangGraph, LangChain or
    our ledger: a database pool's own tasks stay)."""
    me = asyncio.current_task()
    left = [t for t in asyncio.all_tasks() - before if t is not me and _module_of(t).startswith(OURS)]
    for task in left:
        task.cancel()
    await asyncio.gather(*left, return_exceptions=True)


#: The tests already told that their marker is not for a LangGraph app (told once each: their other cells skip).
_told: set[str] = set()


def framework_matches(nodeid: str, framework: str, in_a_cell: bool) -> None:
    """A LangGraph app driven by a test whose marker expanded our runtime's cells (points LangGraph never reaches,
    modes it has not): one clear failure naming the marker's argument, then its other cells skip, instead of
    dozens of cells failing with raw crash tracebacks."""
    if framework == "langgraph" or not in_a_cell:
        return
    test = nodeid.split("[", 1)[0]
    said = (
        f"{test}: crash_run.invoke got a LangGraph app, but its @pytest.mark.crash_matrix expands tenxgraph's cells "
        '(points and modes LangGraph never reaches): mark it @pytest.mark.crash_matrix(framework="langgraph")'
    )
    if test in _told:
        pytest.skip(f"{said} (said once, in this test's first cell)")
    _told.add(test)
    pytest.fail(said, pytrace=False)
