"""SqliteCheckpointer specifics: several processes on one file, durability across reopen, bad paths."""

from __future__ import annotations

import logging
import multiprocessing
from pathlib import Path

import pytest

from tenxgraph.errors import ConfigError, StaleStateError
from tenxgraph.storage.checkpointer import SqliteCheckpointer

KEYS = [f"m:call_{i}" for i in range(40)]


def _writer(path: str, worker: int, results: multiprocessing.Queue) -> None:  # type: ignore[type-arg]
    cp = SqliteCheckpointer(path)
    wins = [key for key in KEYS if cp.put_tool_result("t", key, {"worker": worker})]
    cas_wins = 0
    for _ in range(20):
        snap = cp.get_thread("t")
        version = snap.version if snap else 0
        try:
            cp.put_thread("t", {"last": worker}, expected_version=version)
            cas_wins += 1
        except StaleStateError:
            pass
    results.put((worker, wins, cas_wins))
    cp.close()


def test_several_processes_share_one_file(tmp_path: Path) -> None:
    path = str(tmp_path / "shared.db")
    ctx = multiprocessing.get_context("spawn")
    results = ctx.Queue()
    procs = [ctx.Process(target=_writer, args=(path, w, results)) for w in range(4)]
    for p in procs:
        p.start()
    outcomes = [results.get(timeout=120) for _ in procs]
    for p in procs:
        p.join(timeout=60)
        assert p.exitcode == 0
    winners = [key for _, wins, _ in outcomes for key in wins]
    assert sorted(winners) == sorted(KEYS)  # every key written exactly once across processes
    records = SqliteCheckpointer(path).list_tool_results("t")
    by_worker = {w: set(wins) for w, wins, _ in outcomes}
    assert all(key in by_worker[records[key]["worker"]] for key in KEYS)  # the stored record is the winner's
    snap = SqliteCheckpointer(path).get_thread("t")
    assert snap is not None and snap.version == sum(c for _, _, c in outcomes)  # no lost or doubled CAS write


def test_data_survives_reopening_the_file(tmp_path: Path) -> None:
    cp = SqliteCheckpointer(tmp_path / "a.db")
    cp.put_thread("t", {"x": 1}, expected_version=0)
    cp.put_tool_result("t", "m:c", {"output": "done"})
    cp.close()
    again = SqliteCheckpointer(tmp_path / "a.db")
    assert again.get_tool_results("t", ["m:c"]) == {"m:c": {"output": "done"}}
    snap = again.get_thread("t")
    assert snap is not None and snap.version == 1


@pytest.mark.parametrize("path", ["", ":memory:"])
def test_non_durable_paths_are_rejected(path: str) -> None:
    with pytest.raises(ConfigError, match="needs a file path"):
        SqliteCheckpointer(path)


def test_schema_v1_file_is_migrated_in_place(tmp_path: Path) -> None:
    import sqlite3

    from tenxgraph.storage.checkpointer import sqlite_sql

    path = tmp_path / "v1.db"
    conn = sqlite3.connect(path)
    for statement in sqlite_sql.MIGRATIONS[1]:
        conn.execute(statement)
    conn.execute("INSERT INTO tool_executions VALUES ('t', 'm:c', '{\"output\": \"old\"}', 0)")
    conn.execute("PRAGMA user_version=1")
    conn.commit()
    conn.close()
    cp = SqliteCheckpointer(path)
    assert cp.get_tool_results("t", ["m:c"]) == {"m:c": {"output": "old"}}
    assert cp.put_tool_result("t", "m:c", {"output": "new"}) is False  # migrated records are completed results
    assert cp.put_tool_intent("t", "m:other", {"kind": "intent"}) is True
    cp.close()
    check = sqlite3.connect(path)
    assert check.execute("PRAGMA user_version").fetchone()[0] == 4
    indexes = {row[1] for row in check.execute("PRAGMA index_list(messages)")}
    assert "messages_thread_seq" in indexes  # version 3: a turn's rows are found by (thread_id, seq)
    check.close()


def test_a_newer_file_is_refused(tmp_path: Path) -> None:
    import sqlite3

    path = tmp_path / "future.db"
    conn = sqlite3.connect(path)
    conn.execute("PRAGMA user_version=99")
    conn.close()
    with pytest.raises(ConfigError, match="newer than this 10xgraph"):
        SqliteCheckpointer(path).get_thread("t")


def test_a_database_in_a_missing_folder_is_an_error_unless_asked_to_create_it(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """Before, a mistyped folder was created silently and the run used a new, empty database."""
    path = tmp_path / "no-such-folder" / "agent.db"
    with pytest.raises(ConfigError, match=r"does not exist.*create_dirs=True"):
        SqliteCheckpointer(path)
    assert not path.parent.exists()
    with caplog.at_level(logging.INFO, logger="tenxgraph"):
        cp = SqliteCheckpointer(path, create_dirs=True)
    assert path.parent.is_dir() and "created folder" in caplog.text
    cp.put_thread("t", {}, expected_version=0)
    cp.close()


def _hold_lock(path: str, thread_id: str, held: multiprocessing.Event) -> None:  # type: ignore[type-arg]
    import asyncio
    import time

    async def hold() -> None:
        async with SqliteCheckpointer(path).arun_lock(thread_id):
            held.set()
            time.sleep(60)  # until the test kills this process

    asyncio.run(hold())


def test_the_run_lock_leaves_one_file_and_excludes_other_processes_and_instances(tmp_path: Path) -> None:
    """200 threads' runs leave one lock file (a byte each, not a file each); a lock held in another process, or by
    another checkpointer on the same file in this process, refuses the thread; a killed holder frees it."""
    import asyncio
    import os
    import signal

    from tenxgraph.errors import ThreadBusyError

    path = tmp_path / "s.db"
    cp = SqliteCheckpointer(path)

    async def runs() -> None:
        for i in range(200):
            async with cp.arun_lock(f"thread-{i}"):
                pass
        async with cp.arun_lock("t"):
            with pytest.raises(ThreadBusyError):
                async with SqliteCheckpointer(path).arun_lock("t"):  # same process, another open file
                    pass

    asyncio.run(runs())
    assert sorted(p.name for p in tmp_path.iterdir() if "lock" in p.name) == ["s.db.lock"]

    ctx = multiprocessing.get_context("spawn")
    held = ctx.Event()  # only this process waits on it: a killed waiter would hang Event.set
    child = ctx.Process(target=_hold_lock, args=(str(path), "t", held))
    child.start()
    try:
        assert held.wait(30)

        async def refused() -> None:
            with pytest.raises(ThreadBusyError):
                async with cp.arun_lock("t"):
                    pass
            async with cp.arun_lock("another thread"):  # a different byte: free
                pass

        asyncio.run(refused())
        assert child.pid is not None
        os.kill(child.pid, signal.SIGKILL)
        child.join(30)

        async def freed() -> None:
            async with cp.arun_lock("t"):
                pass

        asyncio.run(freed())
    finally:
        if child.is_alive():
            child.kill()
        child.join(5)
    cp.close()


MOUNTINFO = """\
27 1 8:1 / / rw,relatime - ext4 /dev/sda1 rw
40 27 0:50 / /mnt/shared rw,relatime - nfs4 server:/export rw,vers=4.2
41 40 0:51 / /mnt/shared/local\\040copy rw,relatime - ext4 /dev/sdb1 rw
"""


def test_the_file_system_of_a_database_is_its_deepest_mount() -> None:
    from tenxgraph.storage.checkpointer.sqlite_lock import file_system_of

    assert file_system_of("/mnt/shared/app/state.db", MOUNTINFO) == "nfs4"
    assert file_system_of("/mnt/shared/local copy/state.db", MOUNTINFO) == "ext4"  # (an escaped space)
    assert file_system_of("/mnt/sharedness/state.db", MOUNTINFO) == "ext4"  # a prefix of a name is not a mount
    assert file_system_of("/var/state.db", MOUNTINFO) == "ext4"


def test_a_database_on_a_network_file_system_is_warned_about(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """The run lock (and SQLite's own locking) rely on the file server there: say so, and what to use instead."""
    from tenxgraph.storage.checkpointer import sqlite_lock

    monkeypatch.setattr(sqlite_lock, "file_system_of", lambda path, mountinfo=None: "nfs4")
    cp = SqliteCheckpointer(tmp_path / "state.db")
    with caplog.at_level(logging.WARNING):
        cp.get_thread("t")
    cp.close()
    assert any(
        "network file system (nfs4)" in r.getMessage() and "PgCheckpointer" in r.getMessage() for r in caplog.records
    )
    monkeypatch.undo()
    caplog.clear()
    local = SqliteCheckpointer(tmp_path / "local.db")
    with caplog.at_level(logging.WARNING):
        local.get_thread("t")
    local.close()
    assert not any("network file system" in r.getMessage() for r in caplog.records)


def test_opening_a_connection_to_a_current_database_waits_for_no_writer(tmp_path: Path) -> None:
    """A worker that opens its connection while another holds the write lock reads at once (the schema check takes
    the write lock only when a migration is due), instead of waiting out its busy timeout."""
    import sqlite3

    path = tmp_path / "state.db"
    first = SqliteCheckpointer(path)
    first.put_thread("t", {"n": 1}, expected_version=0)
    writer = sqlite3.connect(path, isolation_level=None)
    writer.execute("BEGIN IMMEDIATE")  # another process's long write transaction
    second = SqliteCheckpointer(path, timeout=0.2)
    try:
        snap = second.get_thread("t")
        assert snap is not None and snap.values == {"n": 1}
    finally:
        writer.execute("ROLLBACK")
        writer.close()
        second.close()
        first.close()
