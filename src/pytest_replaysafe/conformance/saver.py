"""Certify a LangGraph checkpointer (a ``BaseCheckpointSaver``) for what a crash and a second writer ask of it;
LangGraph's own conformance suite runs one writer in one process. Subclass it with an ``open_saver`` fixture: a
function that opens a new saver on the same storage each time it is called, as another process or worker would
(close what it opened when the test ends)::

    from pytest_replaysafe.conformance import SaverConformance

    class TestMySaver(SaverConformance):
        @pytest.fixture
        def open_saver(self, tmp_path):
            opened = []
            def open_():
                conn = sqlite3.connect(tmp_path / "lg.db", check_same_thread=False)
                opened.append(conn)
                return SqliteSaver(conn)
            yield open_
            for conn in opened:
                conn.close()

What it checks: a checkpoint and a task's writes that ``put`` / ``put_writes`` returned are there for another saver
after the writing process is killed with SIGKILL (what LangGraph resumes from); two writers on one thread, at once,
lose no checkpoint and no write; a write saved again (a resumed task saving its writes again) is kept once; threads
do not see each other's. A saver whose storage lives in its process (``InMemorySaver``) sets ``durable = False``:
the kill tests are skipped, the rest hold within the process. Needs the ``langgraph`` extra.
"""

from __future__ import annotations

import json
import os
import signal
import threading
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from pytest_replaysafe.run.procs import fork_child, wait_child

Saver = Any  # langgraph.checkpoint.base.BaseCheckpointSaver (imported lazily)
WRITERS = 2
PUTS_PER_WRITER = 10


def _config(thread: str, checkpoint_id: str | None = None) -> dict[str, Any]:
    configurable = {"thread_id": thread, "checkpoint_ns": ""}
    if checkpoint_id is not None:
        configurable["checkpoint_id"] = checkpoint_id
    return {"configurable": configurable}


def _checkpoint(saver: Saver, value: object) -> tuple[dict[str, Any], dict[str, Any]]:
    """A checkpoint whose one channel holds *value*, and its new versions."""
    from langgraph.checkpoint.base import empty_checkpoint
    from langgraph.checkpoint.base.id import uuid6

    checkpoint: dict[str, Any] = dict(empty_checkpoint())
    version = saver.get_next_version(None, None)
    checkpoint.update(id=str(uuid6()), channel_values={"value": value}, channel_versions={"value": version})
    return checkpoint, {"value": version}


def _put(saver: Saver, thread: str, value: object, parent: str | None = None) -> str:
    checkpoint, versions = _checkpoint(saver, value)
    saved = saver.put(_config(thread, parent), checkpoint, {"source": "loop", "step": 0, "parents": {}}, versions)
    return str(saved["configurable"]["checkpoint_id"])


def _value(saver: Saver, thread: str, checkpoint_id: str | None = None) -> object:
    found = saver.get_tuple(_config(thread, checkpoint_id))
    assert found is not None, f"thread {thread!r}: checkpoint {checkpoint_id or '(latest)'} not found"
    return found.checkpoint["channel_values"].get("value")


def _thread() -> str:
    return f"saver-conf-{uuid.uuid4().hex}"


class SaverConformance:
    """Crash and concurrent-writer checks for a LangGraph saver."""

    #: Its storage outlives its process (False: the kill tests are skipped).
    durable = True

    @pytest.fixture
    def open_saver(self) -> Callable[[], Saver]:  # pragma: no cover - subclasses provide it
        raise NotImplementedError("subclass SaverConformance and define an 'open_saver' fixture")

    def _killed_after(
        self, body: Callable[[Saver], dict[str, Any]], open_saver: Callable[[], Saver], where: Path
    ) -> Any:
        """Run *body* in a forked child on a saver of its own, write what it saved to a file, then SIGKILL it."""
        if not self.durable:
            pytest.skip("the saver's storage lives in its process (durable = False)")
        saved = where / f"{uuid.uuid4().hex}.json"

        def child() -> int:
            out = body(open_saver())
            saved.write_text(json.dumps(out))
            os.kill(os.getpid(), signal.SIGKILL)
            return 0

        status = wait_child(fork_child(child, where / "child.error"))
        assert status is not None and os.WIFSIGNALED(status), (
            (where / "child.error").read_text() if (where / "child.error").exists() else status
        )
        return json.loads(saved.read_text())

    # -- a killed writer ----------------------------------------------------------------------------------
    def test_a_checkpoint_put_survives_a_killed_process(self, open_saver: Callable[[], Saver], tmp_path: Path) -> None:
        thread = _thread()
        saved = self._killed_after(lambda s: {"id": _put(s, thread, {"refund": "1042"})}, open_saver, tmp_path)
        reader = open_saver()
        assert _value(reader, thread) == {"refund": "1042"}
        assert _value(reader, thread, saved["id"]) == {"refund": "1042"}

    def test_a_tasks_writes_survive_a_killed_process_as_pending_writes(
        self, open_saver: Callable[[], Saver], tmp_path: Path
    ) -> None:
        thread = _thread()

        def body(saver: Saver) -> dict[str, Any]:
            checkpoint_id = _put(saver, thread, "before tools")
            saver.put_writes(_config(thread, checkpoint_id), [("messages", "refunded"), ("n", 1)], "task-tools")
            return {"id": checkpoint_id}  # the step's next checkpoint was never saved

        saved = self._killed_after(body, open_saver, tmp_path)
        found = open_saver().get_tuple(_config(thread, saved["id"]))
        assert found is not None
        pending = sorted((task, channel, value) for task, channel, value in found.pending_writes or [])
        assert pending == [("task-tools", "messages", "refunded"), ("task-tools", "n", 1)], (
            f"the task's writes that put_writes returned before the kill are not the checkpoint's pending writes "
            f"for another saver (found {pending}): a resume would run the task again"
        )

    # -- two writers --------------------------------------------------------------------------------------
    def test_two_writers_on_one_thread_lose_no_checkpoint(self, open_saver: Callable[[], Saver]) -> None:
        thread = _thread()
        savers = [open_saver() for _ in range(WRITERS)]
        ids: list[list[str]] = [[] for _ in savers]
        failures: list[BaseException] = []
        start = threading.Barrier(len(savers))

        def write(n: int) -> None:
            try:
                start.wait()
                parent = None
                for i in range(PUTS_PER_WRITER):
                    parent = _put(savers[n], thread, f"w{n}-{i}", parent)
                    ids[n].append(parent)
            except BaseException as exc:
                failures.append(exc)

        threads = [threading.Thread(target=write, args=(n,)) for n in range(len(savers))]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert not failures, failures
        reader = open_saver()
        listed = {c.config["configurable"]["checkpoint_id"] for c in reader.list(_config(thread))}
        lost = {i for written in ids for i in written} - listed
        assert not lost, f"{len(lost)} of {WRITERS * PUTS_PER_WRITER} checkpoints put by two writers at once are lost"
        assert listed == {i for written in ids for i in written}
        for n, written in enumerate(ids):
            assert [_value(reader, thread, i) for i in written] == [f"w{n}-{i}" for i in range(PUTS_PER_WRITER)]

    def test_two_writers_writes_to_one_checkpoint_are_all_kept(self, open_saver: Callable[[], Saver]) -> None:
        thread = _thread()
        first = open_saver()
        checkpoint_id = _put(first, thread, "step")
        savers = [first, *(open_saver() for _ in range(WRITERS - 1))]
        start = threading.Barrier(len(savers))

        def write(n: int) -> None:
            start.wait()
            for i in range(PUTS_PER_WRITER):
                savers[n].put_writes(_config(thread, checkpoint_id), [("out", f"{n}-{i}")], f"task-{n}-{i}")

        threads = [threading.Thread(target=write, args=(n,)) for n in range(len(savers))]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        found = open_saver().get_tuple(_config(thread, checkpoint_id))
        assert found is not None
        kept = sorted(value for _, _, value in found.pending_writes or [])
        assert kept == sorted(f"{n}-{i}" for n in range(len(savers)) for i in range(PUTS_PER_WRITER))

    def test_a_write_saved_again_is_kept_once(self, open_saver: Callable[[], Saver]) -> None:
        """A resumed task saves its writes again under the same task id: LangGraph must not apply them twice."""
        thread = _thread()
        saver = open_saver()
        checkpoint_id = _put(saver, thread, "step")
        for _ in range(2):
            open_saver().put_writes(_config(thread, checkpoint_id), [("messages", "refunded")], "task-tools")
        found = saver.get_tuple(_config(thread, checkpoint_id))
        assert found is not None
        kept = [(t, c, v) for t, c, v in found.pending_writes or []]
        assert kept == [("task-tools", "messages", "refunded")], (
            f"a task's write saved twice is kept as {kept}: a resumed task's writes would be applied twice"
        )

    def test_threads_do_not_see_each_others_checkpoints(self, open_saver: Callable[[], Saver]) -> None:
        one, other = _thread(), _thread()
        saver = open_saver()
        _put(saver, one, "mine")
        assert open_saver().get_tuple(_config(other)) is None
        assert list(open_saver().list(_config(other))) == []
        assert _value(open_saver(), one) == "mine"
