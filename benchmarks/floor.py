"""A run against the floor under it: the same number of durable commits, on the same database, in a loop.

For SQLite and PostgreSQL: the refund run (2 parallel calls) and a run whose one tool returns a 100 KB result,
each with its commits counted; the floor is that many one-row durable commits (SQLite: WAL, synchronous=FULL;
PostgreSQL: autocommit INSERTs). Also the same 100 KB run without the ledger (``NoLedger``), and with a record
that holds a short reference instead of the output (``OutputByReference``): the difference between that and the
real run is what storing the result a second time (in the ledger record as well as in the tool message) costs,
i.e. all that storing it once could save. Medians and mins of 3 interleaved series.

    python -m benchmarks.floor [--runs 60]      (PostgreSQL with REPLAYSAFE_PG_DSN; writes benchmarks/floor.json)
"""

from __future__ import annotations

import argparse
import json
import os
import sqlite3
import statistics
import tempfile
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

from benchmarks import scenario
from benchmarks.bench import (
    NoLedger,
    Writes,
    compare,
    langgraph_calls,
    langgraph_installed,
    langgraph_savers,
    pg_contenders,
    pg_dsn,
)
from tenxgraph import Message, ReactAgent, Reply, ScriptedModel
from tenxgraph.state.messages import JSON
from tenxgraph.storage.checkpointer import BaseCheckpointer, SqliteCheckpointer
from tenxgraph.storage.checkpointer.delegating import DelegatingCheckpointer

RESULTS = Path(__file__).with_name("floor.json")
BIG = "x" * 100_000


def big_result() -> str:
    """Return a large document."""
    return BIG


class OutputByReference(DelegatingCheckpointer):
    """Records written with a short reference in place of the output, as if the result were stored once (in the
    tool message) and the record pointed at it. Only for measuring: a replay from such a record has no output."""

    async def aput_tool_result(self, thread_id: str, key: str, record: dict[str, JSON]) -> bool:
        return await self.inner.aput_tool_result(thread_id, key, {**record, "output": f"ref:{key}"})


def run_of(app: Any) -> Callable[[], None]:
    def run() -> None:
        app.invoke({"messages": [Message.text_message("go")]}, {"thread_id": uuid.uuid4().hex})

    return run


def big_app(cp: BaseCheckpointer) -> Any:
    model = ScriptedModel([Reply(tool_calls=[("big_result", {})]), "done"])
    return ReactAgent(model, tools=[big_result]).compile(checkpointer=cp)


def commits_per_run(app_of: Callable[[BaseCheckpointer], Any], cp: BaseCheckpointer) -> int:
    Writes.reset()
    run_of(app_of(Writes(cp)))()
    return Writes.state + Writes.ledger


def sqlite_floor(path: Path, commits: int) -> Callable[[], None]:
    conn = sqlite3.connect(path, isolation_level=None)
    conn.execute("PRAGMA journal_mode=WAL")
    conn.execute("PRAGMA synchronous=FULL")
    conn.execute("CREATE TABLE IF NOT EXISTS floor (v TEXT)")

    def run() -> None:
        for _ in range(commits):
            conn.execute("BEGIN IMMEDIATE")
            conn.execute("INSERT INTO floor VALUES ('x')")
            conn.execute("COMMIT")

    return run


def pg_floor(dsn: str, schema: str, commits: int) -> Callable[[], None]:
    import psycopg
    from psycopg import sql

    conn = psycopg.connect(dsn, autocommit=True)
    conn.execute(sql.SQL("CREATE TABLE {}.floor (v TEXT)").format(sql.Identifier(schema)))
    insert = sql.SQL("INSERT INTO {}.floor VALUES ('x')").format(sql.Identifier(schema))

    def run() -> None:
        for _ in range(commits):
            conn.execute(insert)

    return run


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--runs", type=int, default=60)
    args = parser.parse_args()
    tmp = Path(tempfile.mkdtemp(prefix="tenxfloor-"))
    out: dict[str, Any] = {"load_average_at_start": round(os.getloadavg()[0], 2), "cpus": os.cpu_count()}

    def measure(
        backend: str, cp: BaseCheckpointer, floor_of: Callable[[int], Callable[[], None]], saver: Any | None
    ) -> None:
        refund_commits = commits_per_run(scenario.tenxgraph_app, cp)
        big_commits = commits_per_run(big_app, cp)
        contenders = {
            "refund": run_of(scenario.tenxgraph_app(cp)),
            "refund_floor": floor_of(refund_commits),
            "big_result": run_of(big_app(cp)),
            "big_result_no_ledger": run_of(big_app(NoLedger(cp))),
            "big_result_stored_once": run_of(big_app(OutputByReference(cp))),
        }
        if saver is not None:
            contenders["big_result_langgraph"] = langgraph_calls(saver, big_result, [{}])
        series: dict[str, list[float]] = {name: [] for name in contenders}
        for _ in range(3):
            for name, f in compare(contenders, args.runs // 3, warmup=5).items():
                series[name].append(f["median_ms"])
        row: dict[str, Any] = {"refund_commits": refund_commits, "big_result_commits": big_commits}
        for name, values in series.items():
            row[f"{name}_ms"] = {"median": round(statistics.median(values), 3), "min": round(min(values), 3)}
        ratios = [a / b for a, b in zip(series["refund"], series["refund_floor"], strict=True)]
        row["refund_over_floor"] = {"median": round(statistics.median(ratios), 2), "min": round(min(ratios), 2)}
        once = [a - b for a, b in zip(series["big_result"], series["big_result_stored_once"], strict=True)]
        row["second_copy_ms"] = {"median": round(statistics.median(once), 3), "min": round(min(once), 3)}
        if saver is not None:
            big = [a / b for a, b in zip(series["big_result"], series["big_result_langgraph"], strict=True)]
            row["big_result_over_langgraph"] = {"median": round(statistics.median(big), 2), "min": round(min(big), 2)}
        out[backend] = row
        print(backend, json.dumps(row), flush=True)

    lg = langgraph_installed()
    savers = langgraph_savers(tmp) if lg else {}
    measure(
        "sqlite", SqliteCheckpointer(tmp / "ours.db"), lambda n: sqlite_floor(tmp / "floor.db", n), savers.get("sqlite")
    )
    dsn = pg_dsn()
    if dsn:
        with pg_contenders(dsn, "bench_floor", lg) as (cp, saver, schema):
            measure("postgres", cp, lambda n: pg_floor(dsn, schema, n), saver)
    RESULTS.write_text(json.dumps(out, indent=2) + "\n")


if __name__ == "__main__":
    main()
