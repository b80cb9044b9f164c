"""LangGraph's own savers through SaverConformance: InMemorySaver (within its process), SqliteSaver on a file
and PostgresSaver on a schema of this test's, each writer on a connection of its own."""

from __future__ import annotations

import pickle
import sqlite3
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("langgraph", reason="the langgraph extra is not installed: pip install 'tenxgraph[langgraph]'")

from langgraph.checkpoint.memory import InMemorySaver
from langgraph.checkpoint.sqlite import SqliteSaver

from pytest_replaysafe import SaverConformance


class TestInMemorySaver(SaverConformance):
    durable = False

    @pytest.fixture
    def open_saver(self) -> Callable[[], Any]:
        saver = InMemorySaver()  # its storage is the object: every "writer" shares it
        return lambda: saver


class TestSqliteSaver(SaverConformance):
    @pytest.fixture
    def open_saver(self, tmp_path: Path) -> Iterator[Callable[[], Any]]:
        opened: list[sqlite3.Connection] = []

        def open_() -> Any:
            conn = sqlite3.connect(tmp_path / "langgraph.db", check_same_thread=False, timeout=30)
            opened.append(conn)
            return SqliteSaver(conn)

        yield open_
        for conn in opened:
            conn.close()


class TestPostgresSaver(SaverConformance):
    @pytest.fixture
    def open_saver(self, pg_dsn: str, pg_schema: str) -> Iterator[Callable[[], Any]]:
        import psycopg
        from langgraph.checkpoint.postgres import PostgresSaver
        from psycopg.rows import dict_row

        opened: list[Any] = []

        def open_() -> Any:
            conn = psycopg.Connection.connect(
                pg_dsn, autocommit=True, prepare_threshold=0, row_factory=dict_row,
                options=f"-c search_path={pg_schema}",
            )  # fmt: skip
            opened.append(conn)
            saver = PostgresSaver(conn)
            if len(opened) == 1:
                conn.execute(f'CREATE SCHEMA IF NOT EXISTS "{pg_schema}"')
                saver.setup()
            return saver

        yield open_
        for conn in opened:
            conn.close()


# -- the suite fails savers that break what it checks ------------------------------------------------------------
class _Buffered(SqliteSaver):
    """Keeps task writes in memory until its next checkpoint (a "batching" saver): a kill loses them."""

    def __init__(self, conn: sqlite3.Connection) -> None:
        super().__init__(conn)
        self.buffer: list[tuple[Any, ...]] = []

    def put_writes(self, config: Any, writes: Any, task_id: str, task_path: str = "") -> None:
        self.buffer.append((config, writes, task_id, task_path))


class _Appending(InMemorySaver):
    """Stores every write it is given, a second save of the same task's write included."""

    def put_writes(self, config: Any, writes: Any, task_id: str, task_path: str = "") -> None:
        super().put_writes(config, writes, f"{task_id}", task_path)
        key = (config["configurable"]["thread_id"], "", config["configurable"]["checkpoint_id"])
        stored = self.writes[key]
        for (task, idx), value in list(stored.items()):  # move each write to a fresh index: nothing is deduplicated
            stored[(task, idx + 1000 * len(stored))] = value


class _FileBacked(InMemorySaver):
    """Reads its whole storage from a file before each put and writes it back after, without a lock."""

    def __init__(self, path: Path) -> None:
        super().__init__()
        self.path = path

    def _load(self) -> None:
        if not self.path.exists():
            return
        storage, blobs = pickle.loads(self.path.read_bytes())
        self.storage.clear()
        for thread, spaces in storage.items():
            for ns, checkpoints in spaces.items():
                self.storage[thread][ns] = dict(checkpoints)
        self.blobs = blobs

    def put(self, config: Any, checkpoint: Any, metadata: Any, new_versions: Any) -> Any:
        self._load()
        saved = super().put(config, checkpoint, metadata, new_versions)
        time.sleep(0.002)  # the window in which another writer's put is lost
        storage = {t: {ns: dict(c) for ns, c in spaces.items()} for t, spaces in self.storage.items()}
        partial = self.path.with_suffix(f".{threading.get_ident()}")
        partial.write_bytes(pickle.dumps((storage, dict(self.blobs))))
        partial.replace(self.path)  # whole files only: what is lost is the other writer's put, never a file
        return saved

    def get_tuple(self, config: Any) -> Any:
        self._load()
        return super().get_tuple(config)

    def list(self, config: Any, **kw: Any) -> Any:
        self._load()
        return super().list(config, **kw)


def test_the_suite_fails_a_saver_that_loses_writes_in_a_kill(tmp_path: Path) -> None:
    opened: list[sqlite3.Connection] = []

    def open_() -> Any:
        opened.append(sqlite3.connect(tmp_path / "lg.db", check_same_thread=False))
        return _Buffered(opened[-1])

    with pytest.raises(AssertionError, match="a resume would run the task again"):
        SaverConformance().test_a_tasks_writes_survive_a_killed_process_as_pending_writes(open_, tmp_path)
    SaverConformance().test_a_checkpoint_put_survives_a_killed_process(open_, tmp_path)  # (its puts are durable)


def test_the_suite_fails_a_saver_that_keeps_a_write_twice() -> None:
    saver = _Appending()
    with pytest.raises(AssertionError, match="would be applied twice"):
        SaverConformance().test_a_write_saved_again_is_kept_once(lambda: saver)


def test_the_suite_fails_a_saver_whose_writers_overwrite_each_other(tmp_path: Path) -> None:
    path = tmp_path / "saver.pickle"
    with pytest.raises(AssertionError, match="put by two writers at once are lost"):
        SaverConformance().test_two_writers_on_one_thread_lose_no_checkpoint(lambda: _FileBacked(path))
