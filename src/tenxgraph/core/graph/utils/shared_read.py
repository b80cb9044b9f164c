"""One ledger read for the calls of one assistant message that a framework hands over one by one (LangGraph's
``ToolNode``: each call comes through :func:`~.invoke_node_handler.invoke_tool_call` on its own, concurrently or,
past its thread pool's size, later).

The first call to read reads the records of every call of the message in one round trip; its siblings wait for
that read and answer from it. A read that fails fails every call that waited for it (each decides for itself
what a failed read means: see ``_read_ledger``), and the next call to come reads again; a read whose leader was
cancelled goes on for the others.

Why an earlier read can answer a later sibling: a sibling's record is written only after that sibling ran, and
it runs once per execution of the step, through this same read. Another process running the same step at the
same moment could write one since; that is no case a per-call read closed either (both would run), and a step
that LangGraph resumes, where k processes do meet, reads under the step's lock and passes that read here
(:meth:`SharedRead.known`). So a read is shared within one execution of a step only: a resumed or re-run step
(a new execution, after a crash in the same process too) reads afresh (:class:`.call_groups.CallGroups`)."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable

from tenxgraph.state.messages import JSON

__all__ = ["Records", "SharedRead"]

Records = dict[str, JSON]


class SharedRead:
    """The ledger read the calls of one message share: ``records = await read.get(fetch)``; *fetch* reads every
    key of the message (the first caller's is the one that runs)."""

    def __init__(self) -> None:
        self._records: Records | None = None
        self._pending: asyncio.Future[Records] | None = None
        self.reads = 0  # how many reads went to the store (for tests and benchmarks)

    @classmethod
    def known(cls, records: Records) -> SharedRead:
        """A read made already (under a lock, say): every caller answers from *records*."""
        read = cls()
        read._records = records
        return read

    async def get(self, fetch: Callable[[], Awaitable[Records]]) -> Records:
        """The records of the message's calls: read now by *fetch* if no sibling read them, else the sibling's."""
        while True:
            if self._records is not None:
                return self._records
            if self._pending is None:
                self.reads += 1
                self._pending = asyncio.ensure_future(fetch())
                self._pending.add_done_callback(self._done)
            pending = self._pending
            try:
                return await asyncio.shield(pending)
            except asyncio.CancelledError:
                task = asyncio.current_task()
                if not pending.cancelled() or (task is not None and task.cancelling()):
                    raise  # this caller was cancelled: the read goes on for the others
                # the read itself was cancelled (by its loop's owner): the next caller reads again

    def _done(self, pending: asyncio.Future[Records]) -> None:
        if self._pending is not pending:
            return
        if pending.cancelled() or pending.exception() is not None:
            self._pending = None  # failed: the callers that waited get its error; the next one reads again
        else:
            self._records = pending.result()
