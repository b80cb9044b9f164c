"""InMemoryCheckpointer: the whole contract, kept in this process (nothing survives it)."""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Sequence
from datetime import timedelta

from tenxgraph.state.messages import JSON, Message, dumps
from tenxgraph.storage.checkpointer.base import (
    BaseCheckpointer,
    MessagesAfter,
    ThreadSnapshot,
    check_thread_id,
    encode_messages,
    parse_json_record,
)
from tenxgraph.storage.checkpointer.retention import RESUMABLE_STATUSES, check_prune_args
from tenxgraph.utils.errors import StaleStateError


class InMemoryCheckpointer(BaseCheckpointer):
    """Stores JSON text, so every read is a fresh copy and every write is checked to be storable."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._threads: dict[str, tuple[int, str]] = {}
        # thread -> message_id -> (seq, json), in insertion (and so seq) order
        self._messages: dict[str, dict[str, tuple[int, str]]] = {}
        self._seq = 0
        # thread -> key -> (created_at, json, status "started" | "completed")
        self._ledger: dict[str, dict[str, tuple[float, str, str]]] = {}

    async def alist_interrupted_threads(self, limit: int = 100) -> list[str]:
        with self._lock:
            rows = list(self._threads.items())
        running = [t for t, (_, text) in rows if (json.loads(text).get("meta") or {}).get("status") == "running"]
        return running[:limit]

    async def acount_threads(self, status: str) -> int:
        with self._lock:
            rows = list(self._threads.values())
        return sum(1 for _, text in rows if (json.loads(text).get("meta") or {}).get("status") == status)

    async def aget_thread(self, thread_id: str) -> ThreadSnapshot | None:
        with self._lock:
            row = self._threads.get(check_thread_id(thread_id))
        if row is None:
            return None
        return ThreadSnapshot(thread_id, json.loads(row[1]), row[0])

    async def aput_thread(
        self,
        thread_id: str,
        values: dict[str, JSON],
        *,
        expected_version: int,
        new_messages: Sequence[Message] = (),
    ) -> int:
        check_thread_id(thread_id)
        text = dumps(values, f"state of thread {thread_id!r}")
        encoded = encode_messages(new_messages)
        with self._lock:
            actual = self._threads.get(thread_id, (0, ""))[0]
            if actual != expected_version:
                raise StaleStateError(thread_id, expected_version, actual)
            self._store_messages(thread_id, encoded)
            self._threads[thread_id] = (actual + 1, text)
            return actual + 1

    def _store_messages(self, thread_id: str, encoded: list[tuple[str, str]]) -> None:
        log = self._messages.setdefault(thread_id, {})
        for message_id, text in encoded:
            if message_id not in log:
                self._seq += 1
                log[message_id] = (self._seq, text)

    async def alist_messages(self, thread_id: str) -> list[Message]:
        with self._lock:
            texts = [text for _, text in self._messages.get(check_thread_id(thread_id), {}).values()]
        return [Message.from_json(t) for t in texts]

    async def alist_messages_after(self, thread_id: str, after_seq: int) -> MessagesAfter:
        newer = []
        with self._lock:
            log = self._messages.get(check_thread_id(thread_id), {})
            for seq, text in reversed(log.values()):  # seq order: the new ones are at the end
                if seq <= after_seq:
                    break
                newer.append((seq, text))
            count, last = len(log), (next(reversed(log.values()))[0] if log else 0)
        rows = [(seq, Message.from_json(text)) for seq, text in reversed(newer)]
        return MessagesAfter(rows, count, last)

    async def aappend_messages(self, thread_id: str, messages: Sequence[Message]) -> None:
        encoded = encode_messages(messages)
        with self._lock:
            self._store_messages(check_thread_id(thread_id), encoded)

    async def aget_tool_results(self, thread_id: str, keys: Sequence[str]) -> dict[str, dict[str, JSON]]:
        with self._lock:
            ledger = self._ledger.get(check_thread_id(thread_id), {})
            found = {k: ledger[k][1] for k in keys if k in ledger}
        return {k: parse_json_record(v) for k, v in found.items()}

    async def aput_tool_result(self, thread_id: str, key: str, record: dict[str, JSON]) -> bool:
        return self._put(thread_id, key, dumps(record, f"ledger record {key!r}"), "completed")

    async def aput_tool_intent(self, thread_id: str, key: str, record: dict[str, JSON]) -> bool:
        return self._put(thread_id, key, dumps(record, f"ledger intent {key!r}"), "started")

    def _put(self, thread_id: str, key: str, text: str, status: str) -> bool:
        with self._lock:
            ledger = self._ledger.setdefault(check_thread_id(thread_id), {})
            existing = ledger.get(key)
            if existing is not None and (status == "started" or existing[2] == "completed"):
                return False
            ledger[key] = (time.time(), text, status)
            return True

    async def alist_tool_results(self, thread_id: str) -> dict[str, dict[str, JSON]]:
        with self._lock:
            items = {k: v[1] for k, v in self._ledger.get(check_thread_id(thread_id), {}).items()}
        return {k: parse_json_record(v) for k, v in items.items()}

    async def aprune_tool_executions(
        self,
        older_than: timedelta,
        *,
        include_resumable: bool = False,
        finished: Sequence[str] = (),
        batch_size: int = 1000,
    ) -> int:
        cutoff = time.time() - check_prune_args(older_than, batch_size, finished)
        deleted = 0
        vouched = set(finished)
        with self._lock:
            for thread_id, ledger in self._ledger.items():
                if not include_resumable and thread_id not in vouched and not self._finished(thread_id):
                    continue
                old = [k for k, (created, _, _) in ledger.items() if created < cutoff]
                for key in old:
                    del ledger[key]
                deleted += len(old)
        return deleted

    def _finished(self, thread_id: str) -> bool:
        """The thread has a row here, and its run is not resumable (see ``aprune_tool_executions``)."""
        row = self._threads.get(thread_id)
        if row is None:
            return False
        meta = json.loads(row[1]).get("meta") or {}
        return meta.get("status") not in RESUMABLE_STATUSES

    async def adelete_thread(self, thread_id: str) -> None:
        with self._lock:
            for table in (self._threads, self._messages, self._ledger):
                table.pop(thread_id, None)
