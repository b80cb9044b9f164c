"""Where time goes, for the figures docs/benchmarks.md explains its misses with (not part of ``make bench``).

- ``hop``: one tool call's run in memory with a plain-function tool (a worker-thread hop per call) and with an
  ``async def`` tool, interleaved.
- ``levers``: the refund run in memory as ``make bench`` times it (``invoke``: a hop to the sync wrappers' loop
  thread, plain-function tools in worker threads, node and tool timeouts), against the same run with one of those
  taken away at a time: ``ainvoke`` on the caller's loop, ``async def`` tools, no timeouts (``node_timeout`` and
  ``tool_timeout`` None), and all three; interleaved, median ms and the share of the base each saves.
- ``sigkill``: a SIGKILL cell of the crash matrix on SQLite, split into the fork, the child's run to its crash
  point and its death (until the parent has reaped it), and the resume in the parent; and within the child, its
  run from the crash point's arming to the crash (ms, and the minor page faults it took: copy-on-write).

    python -m benchmarks.breakdown [--runs 300] [--cells 60]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import resource
import statistics
import tempfile
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

from benchmarks import scenario
from benchmarks.bench import compare
from tenxgraph import Message, ReactAgent, Reply, ScriptedModel
from tenxgraph.storage.checkpointer import InMemoryCheckpointer


def fetch(item: int) -> str:
    """Fetch an item."""
    return f"item {item}"


async def afetch(item: int) -> str:
    """Fetch an item."""
    return f"item {item}"


def hop(runs: int) -> dict[str, float]:
    apps: dict[str, Any] = {
        name: ReactAgent(
            ScriptedModel([Reply(tool_calls=[(tool.__name__, {"item": 1})]), "done"]), tools=[tool]
        ).compile(checkpointer=InMemoryCheckpointer())
        for name, tool in (("sync_tool_ms", fetch), ("async_tool_ms", afetch))
    }

    async def measure() -> dict[str, float]:
        times: dict[str, list[float]] = {name: [] for name in apps}
        for chunk in range(runs // 10 + 5):
            for name, app in apps.items():
                for _ in range(10):
                    started = time.perf_counter()
                    await app.ainvoke({"messages": [Message.user("go")]}, {"thread_id": uuid.uuid4().hex})
                    if chunk >= 5:  # the first chunks warm up
                        times[name].append((time.perf_counter() - started) * 1000)
        return {name: round(statistics.median(values), 3) for name, values in times.items()}

    return asyncio.run(measure())


async def alookup_order(order_id: str) -> str:
    """Look up an order."""
    return scenario.lookup_order(order_id)


async def arefund_order(order_id: str) -> str:
    """Refund an order."""
    return scenario.refund_order(order_id)


def levers(runs: int) -> dict[str, Any]:
    """The refund run in memory, base and without each lever (see the module's docstring)."""
    script: list[Reply | str] = [
        Reply(tool_calls=[("lookup_order", {"order_id": "1042"}), ("refund_order", {"order_id": "1042"})]),
        "Refunded 20.00 EUR on order 1042.",
    ]

    def app(tools: list[Callable[..., Any]]) -> Any:
        return ReactAgent(ScriptedModel(script), tools=tools).compile(checkpointer=InMemoryCheckpointer())

    plain, coroutines = app([scenario.lookup_order, scenario.refund_order]), app([alookup_order, arefund_order])
    untimed = {"node_timeout": None, "tool_timeout": None}

    def sync(graph: Any, extra: dict[str, Any]) -> Callable[[], Any]:
        return lambda: graph.invoke(scenario.tenxgraph_input(), {"thread_id": uuid.uuid4().hex, **extra})

    def on_loop(graph: Any, extra: dict[str, Any]) -> Callable[[], Any]:
        loop = asyncio.new_event_loop()  # (the caller's own loop, kept for every run, as an async caller's is)
        return lambda: loop.run_until_complete(
            graph.ainvoke(scenario.tenxgraph_input(), {"thread_id": uuid.uuid4().hex, **extra})
        )

    variants = {
        "base (invoke)": sync(plain, {}),
        "ainvoke": on_loop(plain, {}),
        "async def tools": sync(coroutines, {}),
        "no timeouts": sync(plain, untimed),
        "all three": on_loop(coroutines, untimed),
    }
    times = compare(variants, runs, 50)
    base = times["base (invoke)"]["median_ms"]
    return {name: (t["median_ms"], round(1 - t["median_ms"] / base, 3)) for name, t in times.items()}


def sigkill(cells: int) -> dict[str, float]:
    from benchmarks.bench import crash_matrix_throughput
    from pytest_replaysafe.run import modes

    phases: dict[str, list[float]] = {"fork_ms": [], "child_until_reaped_ms": [], "resume_ms": []}

    def timed(name: str, fn: Callable[..., Any]) -> Callable[..., Any]:
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            started = time.perf_counter()
            try:
                return fn(*args, **kwargs)
            finally:
                phases[name].append((time.perf_counter() - started) * 1000)

        return wrapper

    workdir = Path(tempfile.mkdtemp(dir="/dev/shm" if os.access("/dev/shm", os.W_OK) else None))
    child_log = workdir / "child.txt"  # a forked child's run to its crash: minor page faults and ms, a line each

    def arm_crash(point: str, hit: int, window: dict[str, str], crash: Callable[[str, int], None]) -> None:
        faults, started = resource.getrusage(resource.RUSAGE_SELF).ru_minflt, time.perf_counter()

        def measured(name: str, n: int) -> None:
            if os.getpid() != parent:  # (the SIGKILL child; in-process cells crash in the parent)
                done = resource.getrusage(resource.RUSAGE_SELF).ru_minflt - faults
                with child_log.open("a") as out:
                    out.write(f"{done} {(time.perf_counter() - started) * 1000:.3f}\n")
            crash(name, n)

        saved_arm(point, hit, window, measured)

    # the mode module's own references, replaced for the measurement and put back after it
    parent, saved_arm = os.getpid(), modes.arm_crash
    patched = {"fork_child": "fork_ms", "wait_child": "child_until_reaped_ms"}
    saved = {name: getattr(modes, name) for name in patched}
    saved_resume = modes.SigKill.resume
    for name, phase in patched.items():
        setattr(modes, name, timed(phase, saved[name]))
    setattr(modes.SigKill, "resume", timed("resume_ms", saved_resume))  # noqa: B010
    setattr(modes, "arm_crash", arm_crash)  # noqa: B010
    try:
        cell = crash_matrix_throughput(workdir, cells)["sigkill"]
    finally:
        for name, fn in saved.items():
            setattr(modes, name, fn)
        setattr(modes.SigKill, "resume", saved_resume)  # noqa: B010
        setattr(modes, "arm_crash", saved_arm)  # noqa: B010
    out = {name: round(statistics.median(values), 2) for name, values in phases.items()}
    child = [line.split() for line in child_log.read_text().splitlines()] if child_log.exists() else []
    if child:
        out["child_run_to_crash_ms"] = round(statistics.median(float(ms) for _, ms in child), 2)
        out["child_minor_faults"] = statistics.median(int(faults) for faults, _ in child)
    return {"cells": cell["cells"], "median_cell_ms": cell["median_cell_ms"], **out}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--runs", type=int, default=300)
    parser.add_argument("--cells", type=int, default=60)
    args = parser.parse_args()
    print(f"load average at start {os.getloadavg()[0]:.2f}, {os.cpu_count()} cpus")
    print("one call's run in memory (median ms):", hop(args.runs))
    print("the refund run in memory (median ms, share of the base saved):", levers(args.runs))
    print("a SIGKILL cell on SQLite (median ms):", sigkill(args.cells))


if __name__ == "__main__":
    main()
