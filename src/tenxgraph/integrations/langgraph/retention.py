"""The ledger's retention job for LangGraph apps: prune the records of the threads LangGraph shows finished.

Our ``threads`` table has no row for a LangGraph thread, so the ledger's prune cannot see whether its run is over,
and keeps its records (a thread paused at an ``interrupt()`` for longer than the retention period would otherwise
re-run its finished calls when resumed). :func:`prune_ledger` asks the app's own saver instead: a thread whose
latest checkpoint has no task left to run (``StateSnapshot.next`` empty: not paused, not cut short by a crash) is
finished, and its records older than *older_than* go, with those of our own finished threads::

    prune_ledger(ledger, app, older_than=timedelta(days=7))     # from a scheduled job; aprune_ledger in async code
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import timedelta
from typing import Any, Protocol

from tenxgraph.utils.sync import run_sync

__all__ = ["aprune_ledger", "prune_ledger"]


class Prunable(Protocol):
    """The ledger's retention job, as every checkpointer has it (``BaseCheckpointer.aprune_tool_executions``)."""

    async def aprune_tool_executions(
        self,
        older_than: timedelta,
        *,
        include_resumable: bool = ...,
        finished: Sequence[str] = ...,
        batch_size: int = ...,
    ) -> int: ...


def _saver(app: Any) -> Any:
    saver = getattr(app, "checkpointer", None)
    if saver is None or saver is True or saver is False:
        raise TypeError(
            f"prune_ledger(ledger, app): {type(app).__name__} has no saver of its own: give the graph compiled with "
            "its checkpointer (graph.compile(checkpointer=...)), whose threads LangGraph can read back"
        )
    return saver


def finished_threads(app: Any) -> list[str]:
    """The threads of *app*'s saver whose latest checkpoint has nothing left to run."""
    threads = {c.config["configurable"]["thread_id"] for c in _saver(app).list(None)}
    return sorted(t for t in threads if not app.get_state({"configurable": {"thread_id": t}}).next)


async def afinished_threads(app: Any) -> list[str]:
    """:func:`finished_threads` for an async saver (``AsyncSqliteSaver``, ``AsyncPostgresSaver``)."""
    threads = {c.config["configurable"]["thread_id"] async for c in _saver(app).alist(None)}
    return sorted([t for t in threads if not (await app.aget_state({"configurable": {"thread_id": t}})).next])


def prune_ledger(ledger: Prunable, app: Any, older_than: timedelta, *, batch_size: int = 1000) -> int:
    """Delete the ledger records older than *older_than* of the threads *app*'s saver shows finished and of our own
    finished threads; return how many were deleted. Every other record stays (see the module's text)."""
    finished = finished_threads(app)
    return run_sync(ledger.aprune_tool_executions(older_than, finished=finished, batch_size=batch_size))


async def aprune_ledger(ledger: Prunable, app: Any, older_than: timedelta, *, batch_size: int = 1000) -> int:
    """:func:`prune_ledger` in async code (an async saver's graph)."""
    finished = await afinished_threads(app)
    return await ledger.aprune_tool_executions(older_than, finished=finished, batch_size=batch_size)
