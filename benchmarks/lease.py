"""What the PostgreSQL run lease costs: how soon a thread is free after its holder is killed (``kill -9``), on
the same host and from another host, and what a run pays for it.

    python -m benchmarks.lease --reps 5

Recovery: a child process takes a thread's lock (the default ``run_lease``, 10 s) and is killed with SIGKILL; the
parent measures the time from the kill until its own ``arun_lock`` succeeds, polling every 10 ms. *Same host*: the
child's lease names this host, whose pid check shows it dead at once. *Another host*: the child writes another
host identity (as a worker on another machine or in another container would), so the lease must run out. Run cost:
the refund scenario on PostgreSQL, whose lock round trip now also claims the lease (a write: one commit), median
ms; compare it with a checkout before the lease, ``git worktree add /tmp/before 285bf14``, then
``PYTHONPATH=/tmp/before/src:/tmp/before python benchmarks/lease.py --run-only`` against ``--run-only`` here.
Started marks: what a durable "started" mark per call would cost, measured as the in-doubt policy's intent (one
write per call before it runs): the two-call refund run without and with one, interleaved.
Prints min / median per shape and writes ``benchmarks/lease.json``.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import signal
import statistics
import sys
import time
import uuid
from pathlib import Path
from typing import Any

from tenxgraph.errors import ThreadBusyError
from tenxgraph.storage.checkpointer.pg import PgCheckpointer

RESULTS = Path(__file__).with_name("lease.json")


def _hold_and_wait(dsn: str, schema: str, thread: str, host: str | None, ready_w: int) -> None:
    """In the child: take the thread's lock, say so, and wait to be killed."""

    async def main() -> None:
        cp = PgCheckpointer(postgres_dsn=dsn, schema=schema)
        cp.lease_host = host
        async with cp.arun_lock(thread):
            os.write(ready_w, b"r")
            await asyncio.sleep(60)

    asyncio.run(main())


def recovery_s(dsn: str, schema: str, host: str | None) -> float:
    """Seconds from the holder's SIGKILL until another process gets its thread."""
    thread = f"lease-{uuid.uuid4().hex[:8]}"
    ready_r, ready_w = os.pipe()
    pid = os.fork()
    if pid == 0:  # the holder
        try:
            _hold_and_wait(dsn, schema, thread, host, ready_w)
        finally:
            os._exit(0)
    os.close(ready_w)
    if os.read(ready_r, 1) != b"r":
        raise RuntimeError("the holder did not take the lock")
    os.close(ready_r)

    async def take() -> float:
        cp = PgCheckpointer(postgres_dsn=dsn, schema=schema)
        try:
            os.kill(pid, signal.SIGKILL)
            killed = time.monotonic()
            os.waitpid(pid, 0)
            while True:
                try:
                    async with cp.arun_lock(thread):
                        return time.monotonic() - killed
                except ThreadBusyError:
                    await asyncio.sleep(0.01)
        finally:
            await cp.aclose()

    return asyncio.run(take())


def run_ms(dsn: str, schema: str, runs: int) -> list[float]:
    """The refund scenario on PostgreSQL, ms per run."""
    from benchmarks import bench

    cp = bench.make_pg(dsn, schema)
    try:
        run = bench.ours(cp)
        for _ in range(5):
            run()
        times = []
        for _ in range(runs):
            started = time.perf_counter()
            run()
            times.append((time.perf_counter() - started) * 1000)
        return times
    finally:
        bench.close_pg(cp)


def marks_ms(dsn: str, schema: str, chunks: int) -> dict[bool, list[float]]:
    """The refund scenario's two calls without and with a durable "started" mark each (``on_in_doubt``: an intent
    written before the call), interleaved in chunks of 10 runs: ms per run."""
    from benchmarks import bench, scenario
    from tenxgraph import ReactAgent, Reply, ScriptedModel, tool

    cp = bench.make_pg(dsn, schema)

    def app_run(marked: bool) -> Any:
        wrap: Any = tool(on_in_doubt="fail") if marked else (lambda f: f)
        tools = [wrap(scenario.lookup_order), wrap(scenario.refund_order)]
        calls = [("lookup_order", {"order_id": "1"}), ("refund_order", {"order_id": "1"})]

        def run() -> None:
            app: Any = ReactAgent(ScriptedModel([Reply(tool_calls=calls), "ok"]), tools=tools).compile(cp)
            app.invoke(scenario.tenxgraph_input(), {"thread_id": uuid.uuid4().hex})

        return run

    try:
        runs = {marked: app_run(marked) for marked in (False, True)}
        times: dict[bool, list[float]] = {False: [], True: []}
        for _ in range(chunks):
            for marked, run in runs.items():
                for _ in range(10):
                    started = time.perf_counter()
                    run()
                    times[marked].append((time.perf_counter() - started) * 1000)
        return times
    finally:
        bench.close_pg(cp)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--reps", type=int, default=5)
    parser.add_argument("--runs", type=int, default=200)
    parser.add_argument(
        "--run-only", action="store_true", help="only the refund run's time (works on a checkout before the lease)"
    )
    args = parser.parse_args()
    dsn = os.environ.get("REPLAYSAFE_PG_DSN")
    if not dsn:
        sys.exit("set REPLAYSAFE_PG_DSN to a PostgreSQL server (a schema of its own is made and dropped)")
    from pytest_replaysafe.matrix import services

    schema = services.new_schema_name("rsl")
    figures: dict[str, object] = {"load_average": os.getloadavg()}
    if args.run_only:
        try:
            medians = [statistics.median(run_ms(dsn, schema, args.runs)) for _ in range(args.reps)]
        finally:
            services.drop_schema(dsn, schema)
        print(f"refund run on PostgreSQL, median per repetition: {' '.join(f'{m:.2f}' for m in medians)} ms")
        return
    try:
        same = [recovery_s(dsn, schema, None) * 1000 for _ in range(args.reps)]
        other = [recovery_s(dsn, schema, "another-host||") for _ in range(max(2, args.reps // 2))]
        runs = run_ms(dsn, schema, args.runs)
        marks = [marks_ms(dsn, schema, 20) for _ in range(args.reps)]
    finally:
        services.drop_schema(dsn, schema)
    figures["kill9_same_host_ms"] = {"min": min(same), "median": statistics.median(same)}
    figures["kill9_other_host_s"] = {"min": min(other), "median": statistics.median(other)}
    figures["refund_run_ms"] = {"min": min(runs), "median": statistics.median(runs)}
    plain = [statistics.median(m[False]) for m in marks]
    marked = [statistics.median(m[True]) for m in marks]
    figures["started_marks_ms"] = {"plain_medians": plain, "marked_medians": marked}
    print(f"load average at start: {figures['load_average']}")
    print(f"kill -9, same host:    thread free after {min(same):.1f} / {statistics.median(same):.1f} ms (min/median)")
    print(f"kill -9, another host: thread free after {min(other):.2f} / {statistics.median(other):.2f} s")
    print(f"refund run on PostgreSQL: {min(runs):.2f} / {statistics.median(runs):.2f} ms (min/median)")
    print(
        "two calls, plain / with a started mark each: median per repetition "
        f"{' '.join(f'{x:.2f}' for x in plain)} / {' '.join(f'{x:.2f}' for x in marked)} ms"
    )
    RESULTS.write_text(json.dumps(figures, indent=2) + "\n")


if __name__ == "__main__":
    main()
