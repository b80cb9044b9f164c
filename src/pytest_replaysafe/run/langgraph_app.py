"""A LangGraph app in a crash-matrix cell: the saver the harness gives it (crash points around LangGraph's
``put`` / ``put_writes``), the watcher of tool calls no ledger guards (a bare ``ToolNode``), and how a run is
started, resumed and read back. LangGraph is imported only when a test drives a LangGraph app.

- :func:`crash_point_saver`: the public ``CrashPointSaver`` (``tenxgraph.integrations.langgraph.saver``) around the
  cell's real saver (``InMemorySaver``, ``SqliteSaver``, ``PostgresSaver``, one per process: a forked child opens
  its own connection); it fires ``langgraph.after_put_writes`` once a task's writes are saved,
  ``langgraph.before_put`` before a step's checkpoint is saved and ``langgraph.after_put`` after.
  Its ``put_writes`` fires ``langgraph.late_put_writes`` too, LangGraph's background-save race played on purpose
  (:mod:`.langgraph_race`).
- The watcher of tool calls no ledger guards (:mod:`.langgraph_watch`), a LangChain callback handler passed with
  each run.
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
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest

from pytest_replaysafe.judge.evidence import Entry, ExecutionLog
from pytest_replaysafe.run.langgraph_pauses import answer_interrupts
from pytest_replaysafe.run.langgraph_race import late_kill_held
from pytest_replaysafe.run.langgraph_watch import tool_watch
from pytest_replaysafe.run.witness import langgraph_declarations, ledger_of
from tenxgraph.core.crashpoints import CrashInjected, crash_point
from tenxgraph.core.graph.results import RunResult
from tenxgraph.integrations.langgraph.resuming import resume_input
from tenxgraph.ledger import probe
from tenxgraph.state.state import AgentState
from tenxgraph.storage.checkpointer.base import BaseCheckpointer
from tenxgraph.utils.sync import run_sync

if TYPE_CHECKING:
    from langgraph.checkpoint.base import BaseCheckpointSaver

    from pytest_replaysafe.run.approvals import Approvals, AtOnce

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
            return followed in the same run of the app (only those can play the race): the saves up to the first
            with no return after it before the run ended (LangGraph waits for its saves then) or a person's answer
            began the next (``answered`` in *entries*)."""
            ends = [e.t for e in entries if e.event == "end" and e.t is not None]
            answers = sorted(e.t for e in entries if e.event == "answered" and e.t is not None)
            reached = 0
            for t in self.saved_writes.get(thread, []):
                until = min((a for a in answers if a > t), default=float("inf"))
                if not any(t < end < until for end in ends):
                    break
                reached += 1
            return reached

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


def _alive() -> None:
    """A crash point has fired in this process (an in-process crash): the process is dead, and writes nothing more
    (LangGraph saves a failed task's error as it unwinds; a killed process would not)."""
    from tenxgraph.core.crashpoints import CrashInjected, fired

    done = [] if late_kill_held() else fired()
    if done:
        raise CrashInjected(*done[0])


async def _in_thread(fn: Callable[..., Any], *args: Any) -> Any:
    from tenxgraph.utils.sync import to_thread

    return await to_thread(fn, *args)


# -- one drive of a LangGraph app -----------------------------------------------------------------------------
class LangGraphApp:
    """A LangGraph app as the cell driver runs it: started, resumed and read back on a thread."""

    def __init__(self, app: Any, input: Mapping[str, Any], log: ExecutionLog, durability: str | None) -> None:
        self.app, self.input, self.log, self.durability = app, dict(input), log, durability
        self.declarations = langgraph_declarations(app)  # the witness's own reading of each tool's declaration
        #: The ledger of the app's ``ReplaySafeToolNode`` (None: a bare LangGraph app).
        self.ledger = ledger_of(app)
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

    def run(
        self,
        input: Mapping[str, Any] | None,
        thread: str,
        config: Mapping[str, Any],
        stream: bool,
        approvals: Approvals | None = None,
        at_once: AtOnce | None = None,
    ) -> Any:
        """Start the run (*input*), or resume the thread (None), as a LangGraph user would; with *approvals*, its
        pauses are answered until it stands unpaused (*at_once*: each answer from many processes first)."""
        cfg = self._config(thread, config)
        if input is None:  # a resume, the user's way: invoke(None), or the input again if nothing was saved
            input = resume_input(self.app, self.input, cfg)
        self._send(input, cfg, stream)
        if approvals is not None:
            answer_interrupts(self.app, cfg, lambda command: self._answer(command, cfg, stream), approvals,
                              self.log, at_once)  # fmt: skip
        return self.result(thread)

    def _answer(self, command: Any, cfg: dict[str, Any], stream: bool) -> None:
        """Send a person's answer: through ``resume_once`` over the ledger its ``ReplaySafeToolNode`` records in
        (what the docs tell a user of it to do), else as a bare LangGraph app's user does (``invoke``)."""
        from tenxgraph.integrations.langgraph.answering import aresume_once, resume_once

        if self.ledger is None:
            self._send(command, cfg, stream)
            return
        if self.is_async:
            run_sync(aresume_once(self.app, command, cfg, ledger=self.ledger, **self._kw()))
        else:
            resume_once(self.app, command, cfg, ledger=self.ledger, **self._kw())

    def _kw(self) -> dict[str, Any]:
        """What LangGraph's ``invoke`` takes besides the input and config: the test's durability, if it chose."""
        return {"durability": self.durability} if self.durability else {}

    def _send(self, input: Any, cfg: dict[str, Any], stream: bool) -> None:
        """One run of the app (``invoke``, ``stream``, or their async forms for an async graph)."""
        kw = self._kw()
        if self.is_async:
            run_sync(self._arun(input, cfg, stream, kw))
        elif stream:
            for _ in self.app.stream(input, cfg, stream_mode="values", **kw):
                pass
        else:
            self.app.invoke(input, cfg, **kw)

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
        except BaseException as exc:
            if isinstance(exc, CrashInjected):
                probe.crashed(exc)  # (the orders of the dead run's batches end: the resume makes its own)
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
