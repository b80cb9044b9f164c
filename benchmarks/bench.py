"""`make bench`: the refund scenario per backend, ours vs LangGraph, plus ledger cost, PostgreSQL round trips
and crash-matrix throughput. Prints a table and writes benchmarks/results.json. Times are medians of one run on
this machine; compare the ratios (ours / LangGraph), which hold across machines better than absolute times."""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import sys
import tempfile
import time
import uuid
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from benchmarks import scenario
from tenxgraph.state.messages import JSON
from tenxgraph.storage.checkpointer import (
    BaseCheckpointer,
    DelegatingCheckpointer,
    InMemoryCheckpointer,
    SqliteCheckpointer,
)
from tenxgraph.utils.sync import run_sync

TARGETS = {"memory": 0.12, "sqlite": 0.25, "postgres": 0.35}  # issue #31: median ratio ours / LangGraph
RESULTS = Path(__file__).with_name("results.json")


def measure(run: Callable[[], Any], runs: int, warmup: int) -> dict[str, float]:
    return compare({"x": run}, runs, warmup)["x"]


def compare(contenders: dict[str, Callable[[], Any]], runs: int, warmup: int) -> dict[str, dict[str, float]]:
    """Time each contender *runs* times, interleaved in chunks of 10 so that drift on a shared machine (other
    load, CPU frequency) hits every contender alike; the ratios of medians are what to compare."""
    for run in contenders.values():
        for _ in range(warmup):
            run()
    samples: dict[str, list[float]] = {name: [] for name in contenders}
    for _ in range(0, runs, 10):
        for name, run in contenders.items():
            for _ in range(10):
                start = time.perf_counter()
                run()
                samples[name].append((time.perf_counter() - start) * 1000)
    out = {}
    for name, values in samples.items():
        values.sort()
        out[name] = {
            "median_ms": round(statistics.median(values), 3),
            "p95_ms": round(values[int(len(values) * 0.95) - 1], 3),
            "runs": len(values),
        }
    return out


# -- backends ---------------------------------------------------------------------------------------------
def pg_dsn() -> str | None:
    return os.environ.get("REPLAYSAFE_PG_DSN")


@contextmanager
def pg_schema(dsn: str, prefix: str) -> Iterator[str]:
    import psycopg
    from psycopg import sql

    schema = f"{prefix}_{uuid.uuid4().hex[:10]}"
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute(sql.SQL("CREATE SCHEMA {}").format(sql.Identifier(schema)))
    try:
        yield schema
    finally:
        with psycopg.connect(dsn, autocommit=True) as conn:
            conn.execute(sql.SQL("DROP SCHEMA {} CASCADE").format(sql.Identifier(schema)))
        redis_url = os.environ.get("REPLAYSAFE_REDIS_URL")
        if redis_url:  # and the Redis cache keys of that schema (PgCheckpointer.cache_prefix), nothing else
            from pytest_replaysafe.matrix.services import delete_redis_keys

            delete_redis_keys(redis_url, f"tenxgraph:{schema}:")


class RoundTrips:
    """Counts what is sent to PostgreSQL: ``statements`` (each ``execute``) and ``count``, the round trips (an
    ``execute`` outside a pipeline, or one pipeline block however many statements it sends)."""

    count = 0
    statements = 0

    @classmethod
    def reset(cls) -> None:
        cls.count = cls.statements = 0

    @classmethod
    def connection_class(cls) -> Any:
        from contextlib import asynccontextmanager

        import psycopg

        class CountingConnection(psycopg.AsyncConnection):
            async def execute(self, *args: Any, **kwargs: Any) -> Any:
                cls.statements += 1
                if self._pipeline is None:
                    cls.count += 1
                return await super().execute(*args, **kwargs)

            @asynccontextmanager
            async def pipeline(self) -> Any:
                if self._pipeline is None:
                    cls.count += 1  # its statements go out together and are synced once
                async with super().pipeline() as p:
                    yield p

        return CountingConnection


def make_pg(dsn: str, schema: str, counting: bool = False) -> BaseCheckpointer:
    from psycopg_pool import AsyncConnectionPool

    from tenxgraph.storage.checkpointer.pg import PgCheckpointer

    if not counting:
        return PgCheckpointer(postgres_dsn=dsn, redis_url=os.environ.get("REPLAYSAFE_REDIS_URL"), schema=schema)

    async def open_pool() -> AsyncConnectionPool:
        pool = AsyncConnectionPool(
            dsn, open=False, kwargs={"autocommit": True}, connection_class=RoundTrips.connection_class()
        )
        await pool.open()
        return pool

    return PgCheckpointer(pool=run_sync(open_pool()), schema=schema)


def close_pg(cp: BaseCheckpointer) -> None:
    """Close a checkpointer and, for the counting variant, the pool it was given."""
    pool = getattr(getattr(cp, "_pool", None), "_user_pool", None)  # (PgPool keeps the pool it was given)
    cp.close()
    if pool is not None:
        run_sync(pool.close())


# -- rows -------------------------------------------------------------------------------------------------
def ours(cp: BaseCheckpointer) -> Callable[[], None]:
    app = scenario.tenxgraph_app(cp)

    def run() -> None:
        result = app.invoke(scenario.tenxgraph_input(), {"thread_id": uuid.uuid4().hex})
        assert result.final_text.startswith("Refunded"), result.final_text

    return run


class NoLedger(DelegatingCheckpointer):
    """The same storage with the ledger switched off: every read misses and no record is written."""

    async def aget_tool_results(self, thread_id: str, keys: Sequence[str]) -> dict[str, dict[str, JSON]]:
        return {}

    async def aput_tool_result(self, thread_id: str, key: str, record: dict[str, JSON]) -> bool:
        return True


def ours_without_ledger(cp: BaseCheckpointer) -> Callable[[], None]:
    """The same run with the ledger switched off, to measure what it costs."""
    return ours(NoLedger(cp))


def langgraph(saver: Any) -> Callable[[], None]:
    app = scenario.langgraph_app(saver)

    def run() -> None:
        config = {"configurable": {"thread_id": uuid.uuid4().hex}}
        out = app.invoke(scenario.langgraph_input(), config, durability="sync")
        assert out["messages"][-1].content.startswith("Refunded")

    return run


def langgraph_savers(tmp: Path) -> dict[str, Any]:
    """LangGraph's in-memory and SQLite savers (``make bench`` installs LangGraph)."""
    import sqlite3

    from langgraph.checkpoint.memory import InMemorySaver
    from langgraph.checkpoint.sqlite import SqliteSaver

    sqlite_saver = SqliteSaver(sqlite3.connect(tmp / "langgraph.db", check_same_thread=False))
    sqlite_saver.setup()
    return {"memory": InMemorySaver(), "sqlite": sqlite_saver}


@contextmanager
def postgres_saver(dsn: str, schema: str) -> Iterator[Any]:
    """LangGraph's PostgreSQL saver on a schema of its own."""
    from langgraph.checkpoint.postgres import PostgresSaver

    sep = "&" if "?" in dsn else "?"
    with PostgresSaver.from_conn_string(f"{dsn}{sep}options=-csearch_path%3D{schema}") as saver:
        saver.setup()
        yield saver


class Writes(DelegatingCheckpointer):
    """Counts durable writes (each one transaction): ``state`` writes and ``ledger`` writes (a group is one); and
    the ledger's reads (``reads``: batched reads of records, each one round trip)."""

    state = 0
    ledger = 0
    reads = 0

    async def aget_tool_results(self, thread_id: str, keys: Sequence[str]) -> dict[str, JSON]:
        Writes.reads += 1
        return await self.inner.aget_tool_results(thread_id, keys)

    async def aput_thread(self, *args: Any, **kwargs: Any) -> int:
        Writes.state += 1
        return await self.inner.aput_thread(*args, **kwargs)

    async def aput_tool_result(self, thread_id: str, key: str, record: dict[str, JSON]) -> bool:
        Writes.ledger += 1
        return await self.inner.aput_tool_result(thread_id, key, record)

    async def aput_tool_results(self, thread_id: str, records: Sequence[tuple[str, dict[str, JSON]]]) -> Any:
        Writes.ledger += 1
        return await self.inner.aput_tool_results(thread_id, records)

    @classmethod
    def reset(cls) -> None:
        cls.state = cls.ledger = cls.reads = 0


def langgraph_react(
    saver: Any, model: Callable[..., dict[str, Any]], tools: list[Any], tool_node: Any | None = None
) -> Any:
    """LangGraph's usual agent: *model* node, ``ToolNode(tools)`` (or *tool_node*), ``tools_condition`` back and
    forth."""
    from langgraph.graph import END, START, MessagesState, StateGraph
    from langgraph.prebuilt import ToolNode, tools_condition

    graph = StateGraph(MessagesState)
    graph.add_node("agent", model)
    graph.add_node("tools", tool_node if tool_node is not None else ToolNode(tools))
    graph.add_edge(START, "agent")
    graph.add_conditional_edges("agent", tools_condition, {"tools": "tools", END: END})
    graph.add_edge("tools", "agent")
    return graph.compile(checkpointer=saver)


@contextmanager
def pg_contenders(dsn: str, prefix: str, with_langgraph: bool) -> Iterator[tuple[Any, Any | None, str]]:
    """Our PgCheckpointer and (when LangGraph is installed) LangGraph's saver, each on a schema of its own, dropped
    afterwards; and our schema's name."""
    from tenxgraph.storage.checkpointer.pg import PgCheckpointer

    with pg_schema(dsn, prefix) as schema, pg_schema(dsn, f"{prefix}_lg") as lg_schema:
        cp = PgCheckpointer(postgres_dsn=dsn, schema=schema)
        try:
            if with_langgraph:
                with postgres_saver(dsn, lg_schema) as saver:
                    yield cp, saver, schema
            else:
                yield cp, None, schema
        finally:
            cp.close()


def langgraph_calls(
    saver: Any, fn: Callable[..., Any], calls: list[dict[str, Any]], tool_node: Any | None = None
) -> Callable[[], None]:
    """A LangGraph run (``durability="sync"``): one assistant message calling *fn* once per args in *calls* (in
    parallel, through *tool_node* if given, else a bare ``ToolNode``), then a final answer; a fresh thread per run."""
    from langchain_core.messages import AIMessage, HumanMessage
    from langchain_core.tools import tool

    def model(state: dict[str, Any]) -> dict[str, Any]:
        if not any(isinstance(m, AIMessage) for m in state["messages"]):
            asked = [{"name": fn.__name__, "args": a, "id": f"c{i}", "type": "tool_call"} for i, a in enumerate(calls)]
            return {"messages": [AIMessage(content="", tool_calls=asked)]}
        return {"messages": [AIMessage(content="done")]}

    app = langgraph_react(saver, model, [tool(fn)], tool_node)

    def run() -> None:
        config = {"configurable": {"thread_id": uuid.uuid4().hex}}
        app.invoke({"messages": [HumanMessage("go")]}, config, durability="sync")

    return run


def langgraph_installed() -> bool:
    try:
        import langgraph  # noqa: F401
    except ImportError:
        return False
    return True


def crash_matrix_throughput(
    workdir: Path, hits_per_mode: int, backend: str = "sqlite", shared: BaseCheckpointer | None = None
) -> dict[str, Any]:
    """Cells per second of the harness on the support agent, per mode: on SQLite (a file per item, as the plugin
    does) or on *shared*, one checkpointer for every item (as the plugin shares one PostgreSQL schema per
    worker)."""
    from examples.support_refund.agent import build_support_agent
    from pytest_replaysafe.judge.gaps import KNOWN_GAPS
    from pytest_replaysafe.matrix.cells import Cell
    from pytest_replaysafe.run.effects import Effects
    from pytest_replaysafe.run.harness import CellPlan, CrashRun
    from tenxgraph import Message

    out: dict[str, Any] = {}
    points = ["run.before_node", "tool.after_record", "node.after_complete", "run.after_advance"]
    for mode in ("inprocess", "sigkill"):
        durations: list[float] = []
        started = time.perf_counter()
        cells = 0
        while cells < hits_per_mode:
            for point in points:
                d = Path(tempfile.mkdtemp(dir=workdir))
                cp = shared if shared is not None else SqliteCheckpointer(d / "state.db")
                plan = CellPlan(  # its own threads, also on a shared checkpointer
                    f"bench-{point}-{mode}-{cells}", Cell(point, backend, mode), seed=1, rules=KNOWN_GAPS
                )
                run = CrashRun(plan, cp, d)
                payments = Effects(d / "effects.db")
                request = {"messages": [Message.text_message("refund order 1042")]}
                run.invoke(build_support_agent(cp, payments), request)
                for planned in run.driver.planned_executions():  # the plugin runs the test body once per hit
                    run.driver.begin_execution(*planned)
                    run.invoke(build_support_agent(cp, payments), request)
                cells += len(run.driver.results)
                durations += [r.duration_s * 1000 for r in run.driver.results]
                if shared is None:
                    cp.close()
        elapsed = time.perf_counter() - started
        out[mode] = {
            "cells": cells,
            "cells_per_s": round(cells / elapsed, 1),
            "median_cell_ms": round(statistics.median(durations), 2),
            "note": "a cell = one crashed-and-resumed hit; per-item clean runs are included in cells_per_s",
        }
    return out


def median_of(rows: list[dict[str, Any]], runtime: str, backend: str) -> float | None:
    for row in rows:
        if row["runtime"] == runtime and row["backend"] == backend:
            return float(row["median_ms"])
    return None


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--runs", type=int, default=200)
    parser.add_argument("--reps", type=int, default=3, help="repetitions of each backend's interleaved runs")
    parser.add_argument("--quick", action="store_true", help="fewer runs (a smoke test)")
    args = parser.parse_args()
    load = round(os.getloadavg()[0], 2)
    spread: dict[str, list[float]] = {}  # per backend: the ratio ours / LangGraph of each repetition
    runs = 30 if args.quick else args.runs
    warmup = 5 if args.quick else 20
    rows: list[dict[str, Any]] = []
    ledger: dict[str, Any] = {}
    extra: dict[str, Any] = {}
    tmp = Path(tempfile.mkdtemp(prefix="tenxbench-"))
    lg = langgraph_installed()

    def add(runtime: str, backend: str, figures: dict[str, float]) -> None:
        rows.append({"runtime": runtime, "backend": backend, **figures})
        print(
            f"  {runtime:10} {backend:9} median {figures['median_ms']:8.3f} ms  p95 {figures['p95_ms']:8.3f} ms",
            flush=True,
        )

    def backend_rows(backend: str, cp: BaseCheckpointer, saver: Any | None) -> None:
        contenders = {"tenxgraph": ours(cp), "no_ledger": ours_without_ledger(cp)}
        if saver is not None:
            contenders["langgraph"] = langgraph(saver)
        reps = [compare(contenders, runs, warmup) for _ in range(1 if args.quick else args.reps)]
        figures = {
            name: {k: round(statistics.median(r[name][k] for r in reps), 3) for k in ("median_ms", "p95_ms", "runs")}
            for name in contenders
        }  # (the median of the repetitions' medians)
        if saver is not None:
            spread[backend] = [r["tenxgraph"]["median_ms"] / r["langgraph"]["median_ms"] for r in reps]
        add("tenxgraph", backend, figures["tenxgraph"])
        if saver is not None:
            add("langgraph", backend, figures["langgraph"])
        ledger[backend] = figures["no_ledger"]

    print("refund scenario, one run = 1 user turn, 2 parallel tool calls, final answer")
    savers = langgraph_savers(tmp) if lg else {}
    backend_rows("memory", InMemoryCheckpointer(), savers.get("memory"))
    backend_rows("sqlite", SqliteCheckpointer(tmp / "ours.db"), savers.get("sqlite"))
    dsn = pg_dsn()
    if dsn:
        with pg_schema(dsn, "bench_ours") as schema, pg_schema(dsn, "bench_lg") as lg_schema:
            cp = make_pg(dsn, schema)
            if lg:
                with postgres_saver(dsn, lg_schema) as saver:
                    backend_rows("postgres", cp, saver)
            else:
                backend_rows("postgres", cp, None)
            cp.close()
            counted = make_pg(dsn, schema, counting=True)
            run = ours(counted)
            for _ in range(3):
                run()
            RoundTrips.reset()
            for _ in range(10):
                run()
            extra["postgres_round_trips_per_run"] = RoundTrips.count / 10
            extra["postgres_statements_per_run"] = RoundTrips.statements / 10
            extra["postgres_round_trips_note"] = (
                "statements per run: run lock and lease claim (one statement) + unlock, thread read, message read, "
                "the new thread's start, 2 more advances, 1 ledger read (one tool node), 1-2 ledger writes (group "
                "commit), BEGIN, the lease's release and COMMIT around the last advance; round trips: 4 plus the "
                "ledger writes (the lock is pipelined with the reads and the start, the ledger read behind the "
                "assistant message's write, the unlock with the last advance, after its COMMIT)"
            )
            close_pg(counted)
    for backend, figures in ledger.items():
        with_ledger = next(r for r in rows if r["runtime"] == "tenxgraph" and r["backend"] == backend)
        ledger[backend] = {
            "with_ledger_ms": with_ledger["median_ms"],
            "without_ledger_ms": figures["median_ms"],
            "per_tool_call_ms": round((with_ledger["median_ms"] - figures["median_ms"]) / 2, 3),
        }
    ratios: dict[str, float] = {}
    for backend in TARGETS:
        ours_ms, theirs_ms = median_of(rows, "tenxgraph", backend), median_of(rows, "langgraph", backend)
        if ours_ms is not None and theirs_ms is not None:
            ratios[backend] = round(ours_ms / theirs_ms, 3)
    print("crash-matrix throughput (support agent on SQLite)...", flush=True)
    cells_dir = Path(tempfile.mkdtemp(dir="/dev/shm")) if os.access("/dev/shm", os.W_OK) else tmp  # as the plugin
    extra["crash_matrix"] = crash_matrix_throughput(cells_dir, 12 if args.quick else 60)
    if dsn:
        print("crash-matrix throughput (support agent on PostgreSQL, one schema for every item)...", flush=True)
        from tenxgraph.storage.checkpointer.pg import PgCheckpointer

        with pg_schema(dsn, "bench_matrix") as schema:
            shared = PgCheckpointer(postgres_dsn=dsn, schema=schema)
            extra["crash_matrix_postgres"] = crash_matrix_throughput(
                cells_dir, 12 if args.quick else 60, "postgres", shared
            )
            shared.close()
    result = {
        "scenario": "refund",
        "load_average_at_start": load,
        "rows": rows,
        "ratios": ratios,
        "ratio_spread": {
            b: {"median": round(statistics.median(v), 3), "min": round(min(v), 3), "reps": len(v)}
            for b, v in spread.items()
        },
        "targets": TARGETS,
        "ledger_cost": ledger,
        **extra,
        "python": sys.version.split()[0],
        "cpus": os.cpu_count(),
    }
    RESULTS.write_text(json.dumps(result, indent=2) + "\n")
    print()
    print(f"{'backend':9} {'ours ms':>9} {'langgraph ms':>13} {'ratio':>7} {'target':>7}")
    for backend, target in TARGETS.items():
        ours_ms, theirs_ms = median_of(rows, "tenxgraph", backend), median_of(rows, "langgraph", backend)
        ratio = ratios.get(backend)
        verdict = "" if ratio is None else (" ok" if ratio <= target else " MISSED")
        cells = [str(v) if v is not None else "-" for v in (ours_ms, theirs_ms, ratio)]
        print(f"{backend:9} {cells[0]:>9} {cells[1]:>13} {cells[2]:>7} {target:>7}{verdict}")
    print(f"ledger cost per tool call (ms): { {b: v['per_tool_call_ms'] for b, v in ledger.items()} }")
    if "postgres_round_trips_per_run" in extra:
        print(f"PostgreSQL round trips per run: {extra['postgres_round_trips_per_run']}")
    for key, backend in (("crash_matrix", "sqlite"), ("crash_matrix_postgres", "postgres")):
        for mode, figures in extra.get(key, {}).items():
            print(
                f"crash matrix {backend} {mode}: {figures['cells_per_s']} cells/s, "
                f"median cell {figures['median_cell_ms']} ms"
            )
    print(f"written: {RESULTS}")
    asyncio.set_event_loop_policy(None)


if __name__ == "__main__":
    main()
