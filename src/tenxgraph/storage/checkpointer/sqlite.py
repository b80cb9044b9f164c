"""SqliteCheckpointer: state, messages and the tool ledger durably in one SQLite file.

- WAL journal with ``synchronous=FULL``: a write is on disk when the call returns, so a ledger record survives
  a kill -9 of the process right after it.
- Several processes may share one file: writes take the database lock (``BEGIN IMMEDIATE``) and wait up to
  ``timeout`` seconds for it; each process (and each forked child) opens its own connection.
- Calls are short and synchronous under the hood (the file is local); the async methods do not yield while a
  statement runs.
- The run lock is a byte of a lock file (:mod:`.sqlite_lock`) and a lease row written with the run's own writes.

This module stays somewhat over the ~350-line guideline: it is one class, the whole checkpointer contract on
SQLite, each method one short transaction; its lock primitives and SQL are already in modules of their own.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import sqlite3
import threading
import time
import uuid
from collections.abc import AsyncIterator, Callable, Iterator, Sequence
from contextlib import asynccontextmanager, contextmanager
from datetime import timedelta
from pathlib import Path

from tenxgraph.state.messages import JSON, Message, dumps
from tenxgraph.storage.checkpointer.base import (
    BaseCheckpointer,
    MessagesAfter,
    ThreadSnapshot,
    check_thread_id,
    encode_group,
    encode_messages,
    migration_plan,
    parse_json_record,
)
from tenxgraph.storage.checkpointer.holders import LIVE_OWNERS
from tenxgraph.storage.checkpointer.retention import RESUMABLE_STATUSES, check_prune_args, prune_in_batches
from tenxgraph.storage.checkpointer.sqlite_lock import (
    OFD_SETLK,
    HeldLock,
    refuse_a_live_holder,
    warn_if_networked,
    write_lease_row,
)
from tenxgraph.storage.checkpointer.sqlite_sql import MAX_VARS, MIGRATIONS, PRUNE, PUT_RESULT, insert_messages
from tenxgraph.utils.backoff import Backoff
from tenxgraph.utils.constants import LOGGER_NAME
from tenxgraph.utils.errors import ConfigError, SerializationError, StaleStateError, ThreadBusyError
from tenxgraph.utils.sync import to_thread

log = logging.getLogger(LOGGER_NAME)
#: Between attempts to enter WAL mode while another process switches it: 5 ms, doubled each time, at most 0.2 s.
WAL_BACKOFF = Backoff(0.005, 2.0, 0.2)


class SqliteCheckpointer(BaseCheckpointer):
    def __init__(
        self,
        path: str | os.PathLike[str],
        *,
        timeout: float = 30.0,
        create_dirs: bool = False,
        on_connect: Callable[[sqlite3.Connection], None] | None = None,
        file_mode: int = 0o600,
    ) -> None:
        """``create_dirs``: create the database's folder if it is missing (logged). Off by default, so a mistyped
        path is an error here instead of a new, empty database somewhere else. ``on_connect``: called with each
        new connection (one per process) after the checkpointer's own set-up: set pragmas such as
        ``cache_size``, register functions. ``file_mode``: the permissions of a database (and its lock file)
        this checkpointer creates: the owner's only by default (conversations and tool results are in it;
        SQLite gives its ``-wal`` and ``-shm`` files the database's mode); an existing file keeps its own."""
        if str(path) in ("", ":memory:"):
            raise ConfigError(
                "SqliteCheckpointer needs a file path (a ':memory:' database is not durable); "
                "use InMemoryCheckpointer for an in-process store"
            )
        self.path = Path(path)
        folder = self.path.absolute().parent
        if not folder.is_dir():
            if not create_dirs:
                raise ConfigError(
                    f"the folder of SQLite database {str(self.path)!r} does not exist ({folder}); check the path, "
                    "create the folder, or pass create_dirs=True"
                )
            folder.mkdir(parents=True, exist_ok=True)
            log.info("created folder %s for SQLite database %s", folder, self.path.name)
        self.timeout = timeout
        self.on_connect = on_connect
        self.file_mode = file_mode
        self._lock = threading.Lock()
        self._conn: sqlite3.Connection | None = None
        self._pid = 0
        # The run locks of this process: the lock, the run's lease owner token, and the lease row's state: "todo"
        # (written with the run's first state write), "written", "release" (deleted with the next), "released".
        self._held: dict[str, tuple[HeldLock, str]] = {}
        self._lease_rows: dict[str, str] = {}

    def __repr__(self) -> str:
        return f"SqliteCheckpointer({str(self.path)!r})"

    # -- connection -------------------------------------------------------------------------------------
    def _connection(self) -> sqlite3.Connection:
        if self._conn is not None and self._pid == os.getpid():
            return self._conn
        # First use, or a forked child: never use the parent's connection (its locks belong to the parent).
        if not self.path.exists():  # created with its mode (an existing file keeps its own)
            os.close(os.open(self.path, os.O_WRONLY | os.O_CREAT, self.file_mode))
        warn_if_networked(str(self.path))
        conn = sqlite3.connect(self.path, timeout=self.timeout, isolation_level=None, check_same_thread=False)
        self._enter_wal(conn)
        conn.execute("PRAGMA synchronous=FULL")
        conn.execute(f"PRAGMA busy_timeout={int(self.timeout * 1000)}")
        if conn.execute("PRAGMA user_version").fetchone()[0] != max(MIGRATIONS):  # (else no write lock is taken)
            with _transaction(conn):
                current = conn.execute("PRAGMA user_version").fetchone()[0]
                for version, statements in migration_plan(current, MIGRATIONS, str(self.path)):
                    for statement in statements:
                        conn.execute(statement)
                    conn.execute(f"PRAGMA user_version={version}")
        if self.on_connect is not None:
            self.on_connect(conn)
        self._conn, self._pid = conn, os.getpid()
        return conn

    def _enter_wal(self, conn: sqlite3.Connection) -> None:
        """``PRAGMA journal_mode=WAL``, retried: processes opening a new file at the same moment can be refused
        ("database is locked") without SQLite's busy handler being asked, while another one switches the mode."""
        deadline = time.monotonic() + self.timeout
        for delay in WAL_BACKOFF.delays():
            try:
                conn.execute("PRAGMA journal_mode=WAL")
                return
            except sqlite3.OperationalError as exc:
                if "locked" not in str(exc) or time.monotonic() + delay > deadline:
                    raise
                time.sleep(delay)

    @contextmanager
    def _tx(self) -> Iterator[sqlite3.Connection]:
        with self._lock:
            conn = self._connection()
            with _transaction(conn):
                yield conn

    def _read(self, sql: str, params: Sequence[object]) -> list[tuple[object, ...]]:
        with self._lock:
            return self._connection().execute(sql, params).fetchall()

    # -- thread state -----------------------------------------------------------------------------------
    async def aget_thread(self, thread_id: str) -> ThreadSnapshot | None:
        rows = self._read("SELECT version, state FROM threads WHERE thread_id = ?", (check_thread_id(thread_id),))
        if not rows:
            return None
        version, text = rows[0]
        return ThreadSnapshot(thread_id, parse_json_record(str(text)), int(version))  # type: ignore[call-overload]

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
        with self._tx() as conn:
            row = conn.execute("SELECT version FROM threads WHERE thread_id = ?", (thread_id,)).fetchone()
            actual = row[0] if row else 0
            if actual != expected_version:
                raise StaleStateError(thread_id, expected_version, actual)
            conn.execute(
                "INSERT INTO threads (thread_id, version, state, updated_at) VALUES (?, ?, ?, ?) "
                "ON CONFLICT (thread_id) DO UPDATE SET version = excluded.version, state = excluded.state, "
                "updated_at = excluded.updated_at",
                (thread_id, actual + 1, text, time.time()),
            )
            insert_messages(conn, thread_id, encoded)
            self._write_lease(conn, thread_id)
        return int(actual) + 1

    def _write_lease(self, conn: sqlite3.Connection, thread_id: str) -> None:
        """The lease row in a state write's own transaction: no commit of its own."""
        held, row = self._held.get(thread_id), self._lease_rows.get(thread_id)
        if held is not None and row is not None:
            self._lease_rows[thread_id] = write_lease_row(conn, thread_id, held[1], row)

    # -- messages ---------------------------------------------------------------------------------------
    async def alist_messages(self, thread_id: str) -> list[Message]:
        rows = self._read("SELECT data FROM messages WHERE thread_id = ? ORDER BY seq", (check_thread_id(thread_id),))
        return [Message.from_json(str(r[0])) for r in rows]

    async def alist_messages_after(self, thread_id: str, after_seq: int) -> MessagesAfter:
        check_thread_id(thread_id)
        with self._lock:
            conn = self._connection()
            conn.execute("BEGIN")  # one snapshot for the rows and the count (WAL readers do not block writers)
            try:
                rows = conn.execute(
                    "SELECT seq, data FROM messages WHERE thread_id = ? AND seq > ? ORDER BY seq",
                    (thread_id, after_seq),
                ).fetchall()
                count, last = conn.execute(
                    "SELECT count(*), coalesce(max(seq), 0) FROM messages WHERE thread_id = ?", (thread_id,)
                ).fetchone()
            finally:
                conn.execute("COMMIT")
        return MessagesAfter([(int(q), Message.from_json(str(d))) for q, d in rows], int(count), int(last))

    async def aappend_messages(self, thread_id: str, messages: Sequence[Message]) -> None:
        encoded = encode_messages(messages)
        with self._tx() as conn:
            insert_messages(conn, check_thread_id(thread_id), encoded)

    async def alist_interrupted_threads(self, limit: int = 100) -> list[str]:
        rows = self._read(
            "SELECT thread_id FROM threads WHERE json_extract(state, '$.meta.status') = 'running' "
            "ORDER BY updated_at LIMIT ?",
            (int(limit),),
        )
        return [str(row[0]) for row in rows]

    async def acount_threads(self, status: str) -> int:
        rows = self._read("SELECT count(*) FROM threads WHERE json_extract(state, '$.meta.status') = ?", (status,))
        return int(str(rows[0][0]))

    # -- a tool's writes in the ledger's transaction -----------------------------------------------------
    transactions = "sync"

    async def atransact(
        self, thread_id: str, key: str, work: Callable[[sqlite3.Connection], dict[str, JSON]]
    ) -> tuple[dict[str, JSON], bool]:
        """The tool runs in a worker thread on this checkpointer's connection, inside ``BEGIN IMMEDIATE`` (one
        writer at a time: the process's other storage calls wait for it, other processes up to ``timeout``)."""
        check_thread_id(thread_id)
        return await to_thread(self._transact, thread_id, key, work)

    def _transact(
        self, thread_id: str, key: str, work: Callable[[sqlite3.Connection], dict[str, JSON]]
    ) -> tuple[dict[str, JSON], bool]:
        with self._tx() as conn:  # an exception, a crash: the tool's writes and the record roll back together
            row = conn.execute(
                "SELECT result FROM tool_executions WHERE thread_id = ? AND key = ? AND status = 'completed'",
                (thread_id, key),
            ).fetchone()
            if row is not None:  # recorded already (by another run): the effect is not made again (nothing written)
                return parse_json_record(str(row[0])), False
            record = work(conn)
            conn.execute(PUT_RESULT, (thread_id, key, dumps(record, f"ledger record {key!r}"), time.time()))
        return record, True

    # -- tool ledger ------------------------------------------------------------------------------------
    async def aget_tool_results(self, thread_id: str, keys: Sequence[str]) -> dict[str, dict[str, JSON]]:
        check_thread_id(thread_id)
        found: dict[str, dict[str, JSON]] = {}
        unique = list(dict.fromkeys(keys))
        for start in range(0, len(unique), MAX_VARS):
            chunk = unique[start : start + MAX_VARS]
            marks = ",".join("?" * len(chunk))
            rows = self._read(
                f"SELECT key, result FROM tool_executions WHERE thread_id = ? AND key IN ({marks})",
                (thread_id, *chunk),
            )
            found.update((str(k), parse_json_record(str(v))) for k, v in rows)
        return found

    async def aput_tool_result(self, thread_id: str, key: str, record: dict[str, JSON]) -> bool:
        text = dumps(record, f"ledger record {key!r}")
        with self._tx() as conn:
            return conn.execute(PUT_RESULT, (check_thread_id(thread_id), key, text, time.time())).rowcount == 1

    async def aput_tool_results(
        self, thread_id: str, records: Sequence[tuple[str, dict[str, JSON]]]
    ) -> list[bool | SerializationError]:
        """One transaction, one fsync for the whole group."""
        check_thread_id(thread_id)
        out, texts = encode_group(records)
        if texts:
            now = time.time()
            with self._tx() as conn:
                for i, key, text in texts:
                    out[i] = conn.execute(PUT_RESULT, (thread_id, key, text, now)).rowcount == 1
        return out

    async def aput_tool_intent(self, thread_id: str, key: str, record: dict[str, JSON]) -> bool:
        text = dumps(record, f"ledger intent {key!r}")
        with self._tx() as conn:
            cur = conn.execute(
                "INSERT INTO tool_executions (thread_id, key, result, created_at, status) "
                "VALUES (?, ?, ?, ?, 'started') ON CONFLICT (thread_id, key) DO NOTHING",
                (check_thread_id(thread_id), key, text, time.time()),
            )
            return cur.rowcount == 1

    async def alist_tool_results(self, thread_id: str) -> dict[str, dict[str, JSON]]:
        rows = self._read(
            "SELECT key, result FROM tool_executions WHERE thread_id = ? ORDER BY created_at, key",
            (check_thread_id(thread_id),),
        )
        return {str(k): parse_json_record(str(v)) for k, v in rows}

    async def aprune_tool_executions(
        self,
        older_than: timedelta,
        *,
        include_resumable: bool = False,
        finished: Sequence[str] = (),
        batch_size: int = 1000,
    ) -> int:
        cutoff = time.time() - check_prune_args(older_than, batch_size, finished)
        vouched = json.dumps(list(finished))

        async def delete_batch() -> int:
            with self._tx() as conn:
                args = (cutoff, int(include_resumable), vouched, *RESUMABLE_STATUSES, batch_size)
                return int(conn.execute(PRUNE, args).rowcount)

        return await prune_in_batches(delete_batch, batch_size)

    async def adelete_thread(self, thread_id: str) -> None:
        with self._tx() as conn:
            for table in ("tool_executions", "messages", "threads", "run_leases"):
                conn.execute(f"DELETE FROM {table} WHERE thread_id = ?", (thread_id,))

    @asynccontextmanager
    async def arun_lock(self, thread_id: str) -> AsyncIterator[None]:
        """An exclusive lock on one byte of ``<database>.lock``, at an offset taken from the thread id's hash: every
        process on this database sees it, the kernel releases it when the holder dies, and no file is left per
        thread. Linux open-file-description locks (``F_OFD_SETLK``) conflict between two runs of one process too;
        where they do not exist, a ``flock`` on a file per thread (in ``<database>.locks/``) stands in.

        And a lease row (``run_leases``: owner, host, pid, process start), written in the run's first state write
        and deleted in its last (no commit of its own): a run that gets the byte lock while that row names a live
        process of this host is refused, so a lock file that another process removed or replaced does not hand
        the thread to a second run while its holder lives; a holder that is gone is taken over at once."""
        check_thread_id(thread_id)
        digest = hashlib.sha256(thread_id.encode()).digest()
        if OFD_SETLK is None:
            path = Path(f"{self.path}.locks") / f"{digest.hex()}.lock"
            path.parent.mkdir(exist_ok=True)
        else:
            path = Path(f"{self.path}.lock")
        try:
            held = HeldLock(str(path), int.from_bytes(digest[:8]) >> 2, self.file_mode)  # 62 bits: positive offset
        except (BlockingIOError, PermissionError):
            raise ThreadBusyError(thread_id) from None
        try:
            self._check_lease_row(thread_id)
        except BaseException:
            held.close()
            raise
        owner = uuid.uuid4().hex
        self._held[thread_id], self._lease_rows[thread_id] = (held, owner), "todo"
        LIVE_OWNERS.add(owner)
        try:
            yield  # closing the descriptor (below) releases the lock
        finally:
            LIVE_OWNERS.discard(owner)
            del self._held[thread_id]
            try:
                if self._lease_rows.pop(thread_id, None) in ("written", "release"):  # (not deleted by the last write)
                    with self._tx() as conn:
                        conn.execute("DELETE FROM run_leases WHERE thread_id = ? AND owner = ?", (thread_id, owner))
            except sqlite3.Error as exc:  # (the next run finds the row left by a run that ended, and takes it)
                log.warning("thread %r: its run lease row could not be deleted (%s)", thread_id, exc)
            finally:
                held.close()

    def _check_lease_row(self, thread_id: str) -> None:
        rows = self._read("SELECT owner, host, pid, pid_start FROM run_leases WHERE thread_id = ?", (thread_id,))
        if rows:
            refuse_a_live_holder(rows[0], thread_id, f"{self.path}.lock")

    def release_lock_with_next_write(self, thread_id: str) -> None:
        """The lease row is deleted in the run's last state write (the lock file's byte when the run ends)."""
        if self._lease_rows.get(thread_id) == "written":
            self._lease_rows[thread_id] = "release"

    async def acheck_run_lock(self, thread_id: str) -> None:
        """One ``stat``: if another process removed or replaced the lock file, the lock is taken again on the new
        file (a run that holds it there meanwhile is refused by the lease row, and lets it go)."""
        held = self._held.get(thread_id)
        if held is None or not held[0].moved():
            return
        again = held[0].retake()
        log.warning(
            "thread %r: its run lock file %s.lock was removed or replaced by another process; %s",
            thread_id,
            self.path,
            "the lock is taken again on the new file" if again else "another run holds the new file's lock for now",
        )

    async def aclose(self) -> None:
        with self._lock:
            if self._conn is not None and self._pid == os.getpid():
                self._conn.close()
            self._conn = None


@contextmanager
def _transaction(conn: sqlite3.Connection) -> Iterator[None]:
    conn.execute("BEGIN IMMEDIATE")
    try:
        yield
    except BaseException:
        if conn.in_transaction:  # (a transactional tool's own statement may have ended it already)
            conn.execute("ROLLBACK")
        raise
    conn.execute("COMMIT")
