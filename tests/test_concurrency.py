"""One executor per call: 8 worker processes resume the same interrupted thread at once, 200 trials per backend.

Each trial crashes a run at a random protected point, then releases 8 real processes together (a barrier) to
resume it. Every tool body must run at most once per ledger key, one resumer (at least) must finish, the others
either finish after it or stop with ThreadBusyError before doing anything, and the final thread must hold every
message exactly once.
"""

from __future__ import annotations

import asyncio
import multiprocessing
import random
import re
import time
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from pytest_replaysafe.judge.evidence import ExecutionLog
from pytest_replaysafe.judge.verdict import result_problems
from tenxgraph import Message, ReactAgent, Reply, ScriptedModel, ThreadBusyError
from tenxgraph.core import crashpoints
from tenxgraph.core.graph.utils.instrument import add_tool_observer
from tenxgraph.storage.checkpointer import BaseCheckpointer, InMemoryCheckpointer, SqliteCheckpointer
from tenxgraph.utils.sync import run_sync

WORKERS = 8
TRIALS = 200
# Crashes that leave no call in flight (an in-flight sibling is the documented in_flight gap, not a race): before
# the tool node reads the ledger, or after both records are written. (tool.before_invoke is not one: in-process,
# the sibling task starts in the same loop iteration before the crash cancels it.)
PROTECTED_POINTS = [
    ("run.before_node", [1, 2, 3]),
    ("tool.before_ledger_read", [1]),
    ("tool.after_record", [2]),
    ("node.after_complete", [1, 2, 3]),
    ("run.after_advance", [1, 2, 3]),
]


def build(cp: BaseCheckpointer) -> Any:
    async def refund_order(order_id: str) -> str:
        """Refund an order."""
        await asyncio.sleep(0.003)  # wide enough for racing resumers to overlap
        return f"refunded {order_id}"

    async def send_email(to: str) -> str:
        """Send an email."""
        await asyncio.sleep(0.003)
        return f"emailed {to}"

    model = ScriptedModel(
        [Reply(tool_calls=[("refund_order", {"order_id": "1042"}), ("send_email", {"to": "ada"})]), "Done."]
    )
    return ReactAgent(model, tools=[refund_order, send_email]).compile(cp)


def _worker(open_cp: Callable[[], BaseCheckpointer], log_path: str, commands: Any, barrier: Any, results: Any) -> None:
    log = ExecutionLog(Path(log_path))
    add_tool_observer(log.observe)
    cp = open_cp()
    while True:
        thread = commands.get()
        if thread is None:
            break
        barrier.wait()
        try:
            build(cp).invoke(None, {"thread_id": thread})
            results.put((thread, "done"))
        except ThreadBusyError:
            results.put((thread, "busy"))
        except Exception as exc:  # reported to the coordinator, which fails the test
            results.put((thread, f"error {type(exc).__name__}: {exc}"))
    cp.close()


def run_trials(open_cp: Callable[[], BaseCheckpointer], workdir: Path, seed: int) -> dict[str, int]:
    ctx = multiprocessing.get_context("fork")
    log_path = workdir / "executions.jsonl"
    log = ExecutionLog(log_path)
    commands = [ctx.Queue() for _ in range(WORKERS)]
    results = ctx.Queue()
    barrier = ctx.Barrier(WORKERS)
    procs = [
        ctx.Process(target=_worker, args=(open_cp, str(log_path), commands[i], barrier, results))
        for i in range(WORKERS)
    ]
    for p in procs:
        p.start()
    remove = add_tool_observer(log.observe)  # after forking: the workers register their own
    cp = open_cp()
    rng = random.Random(seed)
    outcomes = {"done": 0, "busy": 0}
    try:
        for trial in range(TRIALS):
            thread = f"trial-{seed}-{trial}"
            point, hits = rng.choice(PROTECTED_POINTS)
            with crashpoints.armed(point, hit=rng.choice(hits)), pytest.raises(crashpoints.CrashInjected):
                build(cp).invoke({"messages": [Message.text_message("refund and email")]}, {"thread_id": thread})
            crashed = cp.get_thread(thread)
            assert crashed is not None
            for queue in commands:
                queue.put(thread)
            answers = [results.get(timeout=60) for _ in range(WORKERS)]
            errors = [a for _, a in answers if a.startswith("error")]
            assert not errors, (thread, point, errors)
            kinds = [a for _, a in answers]
            assert "done" in kinds, (thread, kinds)
            for kind in kinds:
                outcomes[kind] += 1
            counts = Counter(e.id for e in log.entries(thread) if e.event == "start")
            assert counts and max(counts.values()) == 1, (thread, point, dict(counts))  # at most once per key
            snap = cp.get_thread(thread)
            messages = cp.list_messages(thread)
            assert snap is not None and snap.values["meta"]["status"] == "done", (thread, point)
            # versions only move forward; a crash after the final advance left nothing to resume
            finished_before = crashed.values["meta"]["status"] == "done"
            assert snap.version == crashed.version if finished_before else snap.version > crashed.version
            assert [m.role for m in messages] == ["user", "assistant", "tool", "tool", "assistant"], (thread, point)
            assert result_problems(messages) == []
    finally:
        for queue in commands:
            queue.put(None)
        for p in procs:
            p.join(timeout=60)
        remove()
        cp.close()
    return outcomes


def test_eight_resumers_sqlite(tmp_path: Path) -> None:
    path = tmp_path / "shared.db"
    started = time.monotonic()
    outcomes = run_trials(lambda: SqliteCheckpointer(path), tmp_path, seed=1)
    assert outcomes["done"] >= TRIALS and outcomes["done"] + outcomes["busy"] == TRIALS * WORKERS
    assert outcomes["busy"] > 0  # the race really happened
    print(f"sqlite: {outcomes} in {time.monotonic() - started:.1f}s")


def test_eight_resumers_postgres(tmp_path: Path, pg_dsn: str, pg_schema: str) -> None:
    from tenxgraph.storage.checkpointer.pg import PgCheckpointer

    PgCheckpointer(postgres_dsn=pg_dsn, schema=pg_schema).setup()
    outcomes = run_trials(lambda: PgCheckpointer(postgres_dsn=pg_dsn, schema=pg_schema), tmp_path, seed=2)
    assert outcomes["done"] >= TRIALS and outcomes["done"] + outcomes["busy"] == TRIALS * WORKERS
    assert outcomes["busy"] > 0


@pytest.mark.parametrize("backend", ["memory", "sqlite"])
def test_lock_timeout_waits_for_the_holder_then_runs(backend: str, tmp_path: Path) -> None:
    """Without lock_timeout a busy thread is refused at once; with it, the run waits and then runs; a wait that
    runs out says how long it waited and how to wait longer."""
    cp: BaseCheckpointer = InMemoryCheckpointer() if backend == "memory" else SqliteCheckpointer(tmp_path / "s.db")
    msg = {"messages": [Message.text_message("refund and email")]}

    async def main() -> None:
        release = asyncio.Event()
        held = asyncio.Event()

        async def holder() -> None:
            async with cp.arun_lock("t"):
                held.set()
                await release.wait()

        task = asyncio.ensure_future(holder())
        await held.wait()
        with pytest.raises(ThreadBusyError) as at_once:
            await build(cp).ainvoke(msg, {"thread_id": "t"})
        assert at_once.value.waited is None
        with pytest.raises(ThreadBusyError, match=r"waited 0\.05s.*lock_timeout"):
            await build(cp).ainvoke(msg, {"thread_id": "t", "lock_timeout": 0.05})
        waiter = asyncio.ensure_future(build(cp).ainvoke(msg, {"thread_id": "t", "lock_timeout": 30}))
        await asyncio.sleep(0.05)
        assert not waiter.done()  # still waiting for the holder
        release.set()
        result = await waiter
        assert result.final_text == "Done."
        await task

    run_sync(main())


def test_postgres_resume_right_after_kill_9_waits_for_the_dead_lock(pg_dsn: str, pg_schema: str) -> None:
    """PostgreSQL frees a killed session's advisory lock only when its backend notices the dead connection, a few
    milliseconds later: an immediate resume used to get ThreadBusyError about 1 time in 20. With lock_timeout it
    waits for that instead (20 kills, each resumed at once)."""
    import os
    import signal

    from tenxgraph.storage.checkpointer.pg import PgCheckpointer

    cp = PgCheckpointer(postgres_dsn=pg_dsn, schema=pg_schema)
    cp.setup()
    msg = {"messages": [Message.text_message("refund and email")]}
    try:
        for trial in range(20):
            thread = f"kill-{trial}"
            read_end, write_end = os.pipe()
            pid = os.fork()
            if pid == 0:  # the child takes the thread's run lock inside a run, says so, and waits to be killed
                code = 1
                try:
                    os.close(read_end)

                    def signal_and_wait(name: str, n: int, write_end: int = write_end) -> None:
                        os.write(write_end, b"x")
                        time.sleep(60)

                    crashpoints.arm("tool.before_invoke", 1, signal_and_wait)
                    build(PgCheckpointer(postgres_dsn=pg_dsn, schema=pg_schema)).invoke(msg, {"thread_id": thread})
                finally:
                    os._exit(code)
            os.close(write_end)
            assert os.read(read_end, 1) == b"x"
            os.close(read_end)
            os.kill(pid, signal.SIGKILL)
            os.waitpid(pid, 0)
            result = build(cp).invoke(None, {"thread_id": thread, "lock_timeout": 10})
            assert result.final_text == "Done.", trial
    finally:
        cp.close()


@pytest.mark.parametrize("where", ["this host", "another host"])
def test_postgres_resume_after_kill_9_takes_over_at_once_here_and_after_the_lease_elsewhere(
    pg_dsn: str, pg_schema: str, where: str
) -> None:
    """The lease's cost on a real kill -9 of the holder mid-run: a worker of this host (its pid gone) is taken
    over at once; one of another host (another host identity in its lease, as a worker on another machine or in
    another container writes) only once its lease has run out, here 1 s. Either way the resume finishes."""
    import os
    import signal

    from tenxgraph.storage.checkpointer.pg import PgCheckpointer

    cp = PgCheckpointer(postgres_dsn=pg_dsn, schema=pg_schema, run_lease=1.0)
    cp.setup()
    msg = {"messages": [Message.text_message("refund and email")]}
    read_end, write_end = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child takes the thread inside a run, says so, and waits to be killed
        try:
            os.close(read_end)

            def signal_and_wait(name: str, n: int) -> None:
                os.write(write_end, b"x")
                time.sleep(60)

            crashpoints.arm("tool.before_invoke", 1, signal_and_wait)
            child = PgCheckpointer(postgres_dsn=pg_dsn, schema=pg_schema, run_lease=1.0)
            child.lease_host = None if where == "this host" else "another-host|boot|pidns"
            build(child).invoke(msg, {"thread_id": "killed"})
        finally:
            os._exit(1)
    os.close(write_end)
    try:
        assert os.read(read_end, 1) == b"x"
        os.kill(pid, signal.SIGKILL)
        killed = time.monotonic()
        os.waitpid(pid, 0)
        if where == "another host":  # a dead connection, but a lease that has not run out: refused for now
            # (PostgreSQL ends a killed client's session soon, not at once on a loaded machine: until then the
            # refusal is the live holder's, "being run by another worker right now"; the lease's comes after)
            said = ""
            while "holds its lease" not in said and time.monotonic() - killed < 0.6:
                with pytest.raises(ThreadBusyError) as refused:
                    build(cp).invoke(None, {"thread_id": "killed"})
                said = str(refused.value)
            assert re.search(r"holds its lease for \d", said), said
        result = build(cp).invoke(None, {"thread_id": "killed", "lock_timeout": 10})
        waited = time.monotonic() - killed
        assert result.final_text == "Done."
        if where == "this host":
            assert waited < 0.9  # not the lease: its process is known dead
        else:
            assert waited >= 0.5  # (the lease was renewed up to the kill: it ran out about 1 s later)
    finally:
        os.close(read_end)
        cp.close()
