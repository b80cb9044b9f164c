"""Group commit of ledger records: the parallel calls of one assistant message that return together are recorded
in one durable write (one transaction, one commit), and a call that returns alone is not delayed.

The first record to arrive is written by the call that brought it, after one turn of the event loop (so that
siblings which returned at the same moment, and are ready to run, join it). Records that arrive while that write
is in flight wait; when it is done, the first of them writes, after one turn of the loop, all that are waiting
then, in one :meth:`LedgerStore.aput_tool_results`. (A backend whose writes block the loop, as SQLite's do,
gets its siblings' records only in that turn: their calls returned during the write but could not run.) Each call
still goes on only once its own record is durable (or its write failed, which it logs as before: the
failed-record-write gap). A crash stops the writer and its group alike.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field
from typing import TypeVar

from tenxgraph.state.messages import JSON
from tenxgraph.storage.ledger_store import LedgerStore
from tenxgraph.utils.errors import SerializationError

T = TypeVar("T")

_LEAD = object()  # a waiting record's future resolves to this when its call is to write the next group


@dataclass
class _Waiting:
    key: str
    record: dict[str, JSON]
    done: asyncio.Future[object] = field(default_factory=lambda: asyncio.get_running_loop().create_future())


class RecordBatch:
    """The records of one tool node's calls (distinct keys), written in groups."""

    def __init__(self, checkpointer: LedgerStore, thread_id: str) -> None:
        self.checkpointer = checkpointer
        self.thread_id = thread_id
        self._waiting: list[_Waiting] = []
        self._busy = False
        #: Sizes of the groups written so far (for tests and benchmarks).
        self.groups: list[int] = []

    async def put(self, key: str, record: dict[str, JSON]) -> bool:
        """Write *record* (alone or with others that are waiting); as ``aput_tool_result``, True if written.
        Raises the write's error, or this record's :class:`SerializationError`."""
        mine = _Waiting(key, record)
        self._waiting.append(mine)
        if self._busy:
            outcome = await mine.done
            if outcome is not _LEAD:
                return self._result(outcome)
        self._busy = True
        # Every group's writer first lets the calls that are ready to run (they returned at the same moment, or
        # while the last write blocked the loop, as SQLite's do) join it: one turn of the event loop.
        try:
            await asyncio.sleep(0)
        except BaseException:  # cancelled before writing: nothing of it was written; the next one leads
            self._waiting.remove(mine)
            self._pass_on()
            raise
        group = [w for w in self._waiting if not w.done.cancelled()]  # (a cancelled call records nothing)
        self._waiting = []
        self.groups.append(len(group))
        try:
            if len(group) == 1:
                results: list[bool | SerializationError] = [
                    await self.checkpointer.aput_tool_result(self.thread_id, key, record)
                ]
            else:
                results = await self.checkpointer.aput_tool_results(self.thread_id, [(w.key, w.record) for w in group])
            if not isinstance(results, list) or len(results) != len(group):  # (else its siblings would wait forever)
                raise TypeError(
                    f"{type(self.checkpointer).__name__}.aput_tool_results answered {results!r} for {len(group)} "
                    "records: it must return one outcome per record (see LedgerStore.aput_tool_results)"
                )
        except Exception as exc:
            for w in group:
                if w is not mine and not w.done.done():  # (a waiter may have been cancelled meanwhile)
                    w.done.set_exception(exc)
            raise
        except BaseException:  # a crash or a cancellation: the write may or may not be durable; all stop
            for w in group:
                if w is not mine:
                    w.done.cancel()
            raise
        finally:
            self._pass_on()
        for w, result in zip(group, results, strict=True):
            if w is not mine and not w.done.done():
                w.done.set_result(result)
        return self._result(results[group.index(mine)])

    def _pass_on(self) -> None:
        """The first record that arrived during the write writes the next group; else the batch is idle."""
        for w in self._waiting:
            if not w.done.done():
                w.done.set_result(_LEAD)
                return
        self._busy = False

    @staticmethod
    def _result(outcome: object) -> bool:
        if isinstance(outcome, SerializationError):
            raise outcome
        return bool(outcome)


async def gather_calls(
    jobs: list[asyncio.Task[T]],
) -> list[T]:
    """Wait for all calls; if one dies with a BaseException (a crash), stop the others as a dying process would.
    Every call's exception is retrieved: the first is raised, another call's is noted on it (``__notes__``), none
    is left for asyncio to log when its task is collected (which it does in whatever thread collects it)."""
    if not jobs:
        return []
    raised: BaseException | None = None
    try:
        await asyncio.wait(jobs, return_when=asyncio.FIRST_EXCEPTION)
        for job in jobs:
            if job.done() and not job.cancelled() and (raised := job.exception()) is not None:
                raise raised
        return [job.result() for job in jobs]
    except BaseException as exc:  # (this wait itself cancelled, or a call's error on its way up)
        raised = exc
        raise
    finally:
        pending = [job for job in jobs if not job.done()]
        for job in pending:
            job.cancel()
        if pending:
            await asyncio.wait(pending)
        for job in jobs:
            other = job.exception() if not job.cancelled() else None
            if other is not None and other is not raised and raised is not None:
                raised.add_note(f"another call of the batch failed too: {type(other).__name__}: {other}")
