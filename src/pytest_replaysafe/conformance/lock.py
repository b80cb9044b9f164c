"""The run lock's part of the checkpointer contract (:class:`.conformance.CheckpointerConformance` inherits it):
one run per thread, released when the run ends or fails, and held across a blip of what holds it (a dropped
connection, a removed lock file) and past its lease while its run lives; what the run loop's hints let a backend
read and write in the lock's round trip is what the run would read and write without them.

A backend whose lock can be lost while its process lives overrides the ``second_worker`` fixture (a checkpointer
on the same storage, as another worker would open it), the ``blip`` fixture, and ``lease_s``."""

from __future__ import annotations

import asyncio
import time
import uuid
from typing import Any

import pytest

from tenxgraph.state.messages import Message, ToolCallBlock
from tenxgraph.storage.checkpointer.base import BaseCheckpointer, hold_run_lock
from tenxgraph.utils.errors import ThreadBusyError
from tenxgraph.utils.sync import run_sync


def new_thread_id() -> str:
    return f"conf-{uuid.uuid4().hex}"


class RunLockConformance:
    # -- the run lock -----------------------------------------------------------------------------------
    def test_run_lock_is_exclusive_per_thread_and_released(self, checkpointer: BaseCheckpointer) -> None:
        tid, other = new_thread_id(), new_thread_id()

        async def main() -> None:
            async with checkpointer.arun_lock(tid):
                with pytest.raises(ThreadBusyError):  # a second run of the thread is refused
                    async with checkpointer.arun_lock(tid):
                        pass
                async with checkpointer.arun_lock(other):  # another thread is independent
                    await checkpointer.acheck_run_lock(tid)  # held: the fencing check passes
            async with checkpointer.arun_lock(tid):  # released when its holder ended
                pass

        run_sync(main())

    def test_run_lock_is_released_when_its_holder_fails(self, checkpointer: BaseCheckpointer) -> None:
        tid = new_thread_id()

        async def main() -> None:
            with pytest.raises(RuntimeError, match="node failed"):
                async with checkpointer.arun_lock(tid):
                    raise RuntimeError("node failed")
            async with checkpointer.arun_lock(tid):
                pass

        run_sync(main())

    # -- the run lock held across a blip (a lease) ------------------------------------------------------
    #: Seconds the backend's run lock lasts without renewal (None: it does not expire while its process lives).
    lease_s: float | None = None

    @pytest.fixture
    def second_worker(self, checkpointer: BaseCheckpointer) -> BaseCheckpointer:
        """A checkpointer on the same storage as another worker (another process, another server) would open it.
        The default is the checkpointer itself (a second run in this process); override it for shared storage."""
        return checkpointer

    @pytest.fixture
    def blip(self) -> Any:
        """``blip(checkpointer, thread_id)`` takes away what holds the thread's run lock while its process lives
        (a dropped connection, a removed lock file), or None when nothing can (process-local storage)."""
        return None

    def test_run_lock_refuses_another_worker_and_frees_at_once_when_released(
        self, checkpointer: BaseCheckpointer, second_worker: BaseCheckpointer
    ) -> None:
        tid = new_thread_id()

        async def main() -> None:
            async with checkpointer.arun_lock(tid):
                with pytest.raises(ThreadBusyError):
                    async with second_worker.arun_lock(tid):
                        pass
            started = time.monotonic()
            async with second_worker.arun_lock(tid):  # released: no lease to wait out
                assert time.monotonic() - started < 1.0

        run_sync(main())

    def test_run_lock_survives_a_blip_while_its_holder_lives(
        self, checkpointer: BaseCheckpointer, second_worker: BaseCheckpointer, blip: Any
    ) -> None:
        """What holds the lock goes away (a dropped connection, a removed lock file) while the run lives: another
        worker is still refused, and the run goes on (its fencing check passes, its state writes work)."""
        if blip is None:
            pytest.skip("this backend's run lock cannot be lost while its process lives")
        tid = new_thread_id()

        async def main() -> None:
            async with checkpointer.arun_lock(tid):
                version = await checkpointer.aput_thread(tid, {"n": 1}, expected_version=0)
                await asyncio.to_thread(blip, checkpointer, tid)
                with pytest.raises(ThreadBusyError):
                    async with second_worker.arun_lock(tid):
                        pass
                await checkpointer.acheck_run_lock(tid)
                assert await checkpointer.aput_thread(tid, {"n": 2}, expected_version=version) == version + 1
                assert (await checkpointer.aget_thread(tid)).values == {"n": 2}  # type: ignore[union-attr]
            async with second_worker.arun_lock(tid):  # released when the run ended
                pass

        run_sync(main())

    def test_run_lock_outlives_its_lease_while_held(
        self, checkpointer: BaseCheckpointer, second_worker: BaseCheckpointer
    ) -> None:
        """Held for three lease lengths (renewed meanwhile): another worker is still refused at the end."""
        if self.lease_s is None:
            pytest.skip("this backend's run lock does not expire while its process lives")
        tid = new_thread_id()

        async def main() -> None:
            async with checkpointer.arun_lock(tid):
                await asyncio.sleep(3 * float(self.lease_s or 0))
                await checkpointer.acheck_run_lock(tid)
                with pytest.raises(ThreadBusyError):
                    async with second_worker.arun_lock(tid):
                        pass

        run_sync(main())

    # -- what goes with the lock ------------------------------------------------------------------------
    def test_what_a_run_sends_with_its_lock_reads_and_writes_as_without_it(
        self, checkpointer: BaseCheckpointer, second_worker: BaseCheckpointer
    ) -> None:
        """``hold_run_lock``'s hints (a new thread's start, the messages after a number, a Resume's ledger keys)
        may let a backend read and write in the lock's own round trip: the run's reads and writes answer as they
        would without them, and a record written after the lock's read is seen by the next read."""
        tid = new_thread_id()
        hello = Message.user("hello", message_id="m1")
        yes: dict[str, Any] = {"kind": "decision", "value": True}

        async def main() -> None:
            async with hold_run_lock(checkpointer, tid, None, start=({"n": 1}, [hello])):
                assert await checkpointer.aget_thread(tid) is None
                assert await checkpointer.aput_thread(tid, {"n": 1}, expected_version=0, new_messages=[hello]) == 1
            await second_worker.aput_tool_result(tid, "decision:a", yes)
            keys = ["decision:a", "decision:b"]
            async with hold_run_lock(checkpointer, tid, None, messages_after=0, ledger_keys=keys):
                snap = await checkpointer.aget_thread(tid)
                assert snap is not None and (snap.version, snap.values) == (1, {"n": 1})
                after = await checkpointer.alist_messages_after(tid, 0)
                assert after is not None and [m.message_id for _, m in after.rows] == ["m1"]
                assert await checkpointer.aget_tool_results(tid, keys) == {"decision:a": yes}
                assert await checkpointer.aput_tool_results(tid, [("decision:b", yes)]) == [True]
                assert await checkpointer.aget_tool_results(tid, keys) == {"decision:a": yes, "decision:b": yes}
            async with hold_run_lock(checkpointer, tid, None, ledger_keys=["decision:c"]):
                await checkpointer.aput_tool_result(tid, "decision:c", yes)  # written before the run's first read
                assert await checkpointer.aget_tool_results(tid, ["decision:c"]) == {"decision:c": yes}

        run_sync(main())

    def test_a_ledger_read_after_a_state_write_sees_records_written_since(
        self, checkpointer: BaseCheckpointer, second_worker: BaseCheckpointer
    ) -> None:
        """The tool node's ledger read after the write that added its assistant message answers as of the read,
        not as of the write: a record of the message written before the write is found, and so is one another
        worker wrote between the write and the read (a run that took the thread over meanwhile). A backend that
        answered the read from the write's round trip would hide it, and the call would run again."""
        tid = new_thread_id()
        call = Message.assistant("", [ToolCallBlock("c1", "refund", {}), ToolCallBlock("c2", "email", {})])
        keys = [f"{call.message_id}:c1", f"{call.message_id}:c2"]
        one, two = {"kind": "value", "output": 1}, {"kind": "value", "output": 2}

        async def main() -> None:
            await second_worker.aput_tool_result(tid, keys[0], one)  # (an earlier run's record of this message)
            async with hold_run_lock(checkpointer, tid, None) as session:
                await session.write({"n": 1}, expected_version=0, new_messages=[call])
                await second_worker.aput_tool_result(tid, keys[1], two)  # a run that took the thread, meanwhile
                assert await checkpointer.aget_tool_results(tid, keys) == {keys[0]: one, keys[1]: two}

        run_sync(main())
