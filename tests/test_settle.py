"""A crash inside a tool call lets its siblings come to rest first (pytest_replaysafe/run/settle.py): what the
crash finds is decided by the seeded completion order, not by which thread the scheduler ran first."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

from pytest_replaysafe.judge.evidence import Entry, ExecutionLog
from pytest_replaysafe.run.settle import settle_siblings
from pytest_replaysafe.run.spy import RecordingCheckpointer
from tenxgraph.storage.checkpointer import InMemoryCheckpointer
from tenxgraph.utils.sync import run_sync, to_thread


def recording(tmp_path: Path) -> RecordingCheckpointer:
    return RecordingCheckpointer(InMemoryCheckpointer(), ExecutionLog(tmp_path / "executions.jsonl"))


def test_a_crash_in_a_body_waits_for_its_siblings_bodies_and_for_the_loop_to_run_what_they_made_ready(
    tmp_path: Path,
) -> None:
    """From a worker thread: a sibling's body still running returns first, and the loop then runs its call on
    (its next steps, each leaving an entry in the harness's log) until nothing moves."""
    cp = recording(tmp_path)
    seen: list[str] = []

    async def sibling() -> None:
        await to_thread(time.sleep, 0.05)  # returns well after the crash fired
        seen.append("returned")
        cp.log.write(Entry("t", "sibling", "end"))
        await asyncio.sleep(0)  # (its record write comes a turn of the loop later, as a group commit's does)
        seen.append("recorded")
        cp.log.write(Entry("t", "sibling", "recorded"))

    def crashing_body() -> list[str]:
        settle_siblings(cp, limit=5.0)
        return list(seen)  # what the crash would find

    async def main() -> list[str]:
        running = asyncio.ensure_future(sibling())
        await asyncio.sleep(0)  # the sibling's body is in its thread
        found = await to_thread(crashing_body)
        await running
        return found

    assert run_sync(main()) == ["returned", "recorded"]


def test_a_sibling_slower_than_the_limit_stays_in_flight(tmp_path: Path) -> None:
    cp = recording(tmp_path)
    seen: list[str] = []

    async def sibling() -> None:
        await to_thread(time.sleep, 1.0)
        seen.append("returned")

    def crashing_body() -> tuple[float, list[str]]:
        started = time.monotonic()
        settle_siblings(cp, limit=0.05)
        return time.monotonic() - started, list(seen)

    async def main() -> tuple[float, list[str]]:
        running = asyncio.ensure_future(sibling())
        await asyncio.sleep(0)
        found = await to_thread(crashing_body)
        await running
        return found

    waited, found = run_sync(main())
    assert found == [] and 0.05 <= waited < 0.5


def test_on_the_loops_own_thread_it_waits_for_the_bodies_only(tmp_path: Path) -> None:
    """A crash point on the event loop (an ``async def`` tool, ``tool.before_invoke``) cannot let the loop run:
    the sibling's body returns, and its call stays as the loop last saw it."""
    cp = recording(tmp_path)
    seen: list[str] = []
    finished: list[float] = []

    def body() -> None:
        time.sleep(0.05)
        finished.append(time.monotonic())

    async def sibling() -> None:
        await to_thread(body)
        seen.append("returned")

    async def main() -> tuple[list[str], bool]:
        running = asyncio.ensure_future(sibling())
        await asyncio.sleep(0)
        settle_siblings(cp, limit=5.0)  # (blocks the loop, as a crash point's callback does)
        found, body_done = list(seen), bool(finished)
        await running
        return found, body_done

    assert run_sync(main()) == ([], True)
