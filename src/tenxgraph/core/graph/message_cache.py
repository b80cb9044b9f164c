"""Decoded messages of recently run threads, so that a turn reads only the messages stored since the last one.

A thread's log is append-only, and each stored message gets a sequence number that is never reused
(:meth:`BaseCheckpointer.alist_messages_after`). The cache keeps, per thread, the decoded messages up to a
sequence number and their count; a load asks storage for the rows after it together with the thread's current
count and highest number, read at one moment. When the kept messages plus the new rows make that count, they are
the log; otherwise (the thread was deleted and made again, or a message committed out of sequence order) the log
is read whole. Storage stays the source of truth: the cache only saves decoding what did not change. Messages are
immutable, so the kept objects can be shared with the states built from them.
"""

from __future__ import annotations

import threading
import weakref
from collections import OrderedDict
from dataclasses import dataclass

from tenxgraph.state.messages import Message
from tenxgraph.storage.checkpointer.base import BaseCheckpointer

DEFAULT_THREADS = 256


@dataclass(frozen=True, slots=True)
class _Kept:
    messages: tuple[Message, ...]
    last_seq: int


class MessageCache:
    def __init__(self, max_threads: int = DEFAULT_THREADS) -> None:
        if max_threads < 0:
            raise ValueError(f"max_threads must be 0 (no cache) or more, got {max_threads}")
        self.max_threads = max_threads
        self._kept: OrderedDict[str, _Kept] = OrderedDict()
        self._owner: weakref.ref[BaseCheckpointer] | None = None  # what the kept messages were read from
        self._lock = threading.Lock()  # graphs are shared between threads of a server

    def _kept_for(self, checkpointer: BaseCheckpointer, thread_id: str) -> _Kept | None:
        with self._lock:
            if self._owner is None or self._owner() is not checkpointer:  # other storage: nothing kept applies
                self._kept.clear()
                self._owner = weakref.ref(checkpointer)
            return self._kept.get(thread_id) if self.max_threads else None

    def after(self, checkpointer: BaseCheckpointer, thread_id: str) -> int:
        """The sequence number the next :meth:`load` of *thread_id* reads after (0: the whole log)."""
        kept = self._kept_for(checkpointer, thread_id)
        return kept.last_seq if kept is not None else 0

    def knows(self, checkpointer: BaseCheckpointer, thread_id: str) -> bool:
        """Whether a run of this graph read or created *thread_id* lately (then it is not new)."""
        return self._kept_for(checkpointer, thread_id) is not None

    def remember(self, checkpointer: BaseCheckpointer, thread_id: str) -> None:
        """*thread_id* exists now (a run of this graph created it); its messages are read whole on the next load."""
        if self._kept_for(checkpointer, thread_id) is None and self.max_threads:
            self._keep(thread_id, _Kept((), 0))

    def _keep(self, thread_id: str, kept: _Kept) -> None:
        with self._lock:
            self._kept[thread_id] = kept
            self._kept.move_to_end(thread_id)
            while len(self._kept) > self.max_threads:
                self._kept.popitem(last=False)

    async def load(self, checkpointer: BaseCheckpointer, thread_id: str) -> list[Message]:
        """The thread's messages in stored order, reading only those stored since the last load."""
        kept = self._kept_for(checkpointer, thread_id)
        after = kept.last_seq if kept is not None else 0
        found = await checkpointer.alist_messages_after(thread_id, after)
        if found is None:  # storage without sequence numbers: the whole log, every time
            return await checkpointer.alist_messages(thread_id)
        new = tuple(m for _, m in found.rows)
        if after and kept is not None and len(kept.messages) + len(new) == found.count:
            log = kept.messages + new
        elif len(new) == found.count:
            log = new
        else:  # the kept messages are not a prefix of the log any more: read it whole
            found = await checkpointer.alist_messages_after(thread_id, 0)
            assert found is not None
            log = tuple(m for _, m in found.rows)
        if self.max_threads:
            self._keep(thread_id, _Kept(log, found.last_seq if len(log) == found.count else 0))
        return list(log)
