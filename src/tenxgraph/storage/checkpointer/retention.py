"""Retention of the ledger: which records a prune may delete, and how a backend deletes them in batches (see
``BaseCheckpointer.aprune_tool_executions``)."""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Sequence
from datetime import timedelta

from tenxgraph.storage.checkpointer.base import check_thread_id
from tenxgraph.utils.errors import ConfigError

#: Statuses of a thread whose ledger a later run still reads (pruning keeps its records): a run on it now or
#: interrupted by a crash (``running``), a failed node (``error``), a pause waiting for a person (``interrupted``).
RESUMABLE_STATUSES = ("running", "error", "interrupted")


async def prune_in_batches(delete_batch: Callable[[], Awaitable[int]], batch_size: int) -> int:
    """Call *delete_batch* (one short transaction deleting up to *batch_size* records) until a batch comes back
    short; other writers get in between batches. Returns how many were deleted in all."""
    deleted = 0
    while True:
        batch = await delete_batch()
        deleted += batch
        if batch < batch_size:
            return deleted


def check_prune_args(older_than: timedelta, batch_size: int, finished: Sequence[str] = ()) -> float:
    """The cutoff in seconds; clear errors for a negative age, a batch size below 1, or *finished* given as one
    string (a thread id is not a list of them)."""
    if isinstance(finished, (str, bytes)):
        raise ConfigError(f"finished must be a list of thread ids, got the string {finished!r}: pass [{finished!r}]")
    for thread_id in finished:
        check_thread_id(thread_id)
    if not isinstance(older_than, timedelta) or older_than < timedelta(0):
        raise ConfigError(f"older_than must be a timedelta >= 0, got {older_than!r}")
    if isinstance(batch_size, bool) or not isinstance(batch_size, int) or batch_size < 1:
        raise ConfigError(f"batch_size must be a whole number >= 1, got {batch_size!r}")
    return older_than.total_seconds()
