"""Ours beside DBOS Transact, the durable-execution peer a team might pick instead: the refund run as a DBOS
workflow whose model turns and tool calls are steps (each step's output checkpointed, as our ledger records each
call), against our refund run on the same storage, interleaved in chunks of 10 runs, repeated ``--reps`` times.

DBOS is a process-wide singleton, so each storage runs in a child process of its own (``--backend``); the parent
collects ``benchmarks/dbos.json``. SQLite: a file of its own per runtime, WAL on both (set on DBOS's file before
it opens it; ``synchronous`` is FULL on both). PostgreSQL (with ``REPLAYSAFE_PG_DSN``): DBOS's system database is
one this benchmark creates under a name of its own and drops afterwards; ours uses a schema of its own. DBOS runs
the two tool steps one after the other (a sync workflow), ours in parallel: its run has four steps and a
workflow record, ours two model turns and two calls.

    python -m benchmarks.dbos_peer [--runs 200] [--reps 3]   # needs the bench extra (dbos)
"""

from __future__ import annotations

import argparse
import json
import os
import sqlite3
import statistics
import subprocess
import sys
import tempfile
import uuid
from collections.abc import Callable, Iterator
from contextlib import ExitStack, contextmanager
from pathlib import Path
from typing import Any, cast
from urllib.parse import urlsplit

RESULTS = Path(__file__).with_name("dbos.json")


def dbos_refund(system_database_url: str) -> Callable[[], None]:
    """Launch DBOS on *system_database_url* and return one refund run as a workflow (a new workflow id each)."""
    from dbos import DBOS, SetWorkflowID

    from benchmarks import scenario

    DBOS(config={"name": "tenxbench", "system_database_url": system_database_url})
    Decorator = Callable[[Callable[..., Any]], Callable[..., Any]]  # (typed here: dbos may not be installed)

    def step() -> Decorator:
        return cast(Decorator, DBOS.step())

    def workflow() -> Decorator:
        return cast(Decorator, DBOS.workflow())

    @step()
    def model(turn: int) -> dict[str, Any]:
        if turn == 1:
            return {"calls": [("lookup_order", {"order_id": "1042"}), ("refund_order", {"order_id": "1042"})]}
        return {"text": "Refunded 20.00 EUR on order 1042."}

    @step()
    def lookup_order(order_id: str) -> str:
        return scenario.lookup_order(order_id)

    @step()
    def refund_order(order_id: str) -> str:
        return scenario.refund_order(order_id)

    @workflow()
    def refund(question: str) -> str:
        asked = model(1)
        tools = {"lookup_order": lookup_order, "refund_order": refund_order}
        for name, args in asked["calls"]:
            tools[name](**args)
        return str(model(2)["text"])

    DBOS.launch()

    def run() -> None:
        with SetWorkflowID(uuid.uuid4().hex):
            assert refund(scenario.QUESTION).startswith("Refunded")

    return run


@contextmanager
def pg_database(dsn: str) -> Iterator[str]:
    """A database of this benchmark's own for DBOS's system tables, dropped afterwards."""
    import psycopg
    from psycopg import sql

    name = f"tenxbench_dbos_{uuid.uuid4().hex[:10]}"
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(name)))
    try:
        yield urlsplit(dsn)._replace(path=f"/{name}").geturl()  # (REPLAYSAFE_PG_DSN is a URL)
    finally:
        with psycopg.connect(dsn, autocommit=True) as conn:
            conn.execute(sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(name)))


def storages(backend: str, stack: ExitStack, name: str) -> tuple[str, Any]:
    """DBOS's system database (its URL) and our checkpointer, both on *backend*, both let go by *stack* (and DBOS
    destroyed by it): a SQLite file each (WAL on DBOS's before it opens it), or on PostgreSQL a database of this
    benchmark's own for DBOS and a schema of its own for ours (*name* in both)."""
    from benchmarks.bench import pg_schema
    from tenxgraph.storage.checkpointer import SqliteCheckpointer

    if backend == "sqlite":
        tmp = Path(tempfile.mkdtemp(prefix=f"tenxbench-{name}-"))
        sqlite3.connect(tmp / "dbos.sqlite").execute("PRAGMA journal_mode=WAL").close()
        url, cp = f"sqlite:///{tmp / 'dbos.sqlite'}", cast(Any, SqliteCheckpointer(tmp / "ours.db"))
    else:
        from tenxgraph.storage.checkpointer.pg import PgCheckpointer

        dsn = os.environ["REPLAYSAFE_PG_DSN"]
        url = stack.enter_context(pg_database(dsn))
        cp = PgCheckpointer(postgres_dsn=dsn, schema=stack.enter_context(pg_schema(dsn, f"bench_{name}")))
    stack.callback(cp.close)

    def destroy() -> None:
        from dbos import DBOS

        DBOS.destroy()

    stack.callback(destroy)
    return url, cp


def child(backend: str, runs: int, reps: int) -> dict[str, Any]:
    """One storage, in this process: ours and DBOS interleaved, *reps* times; medians and ratios."""
    from benchmarks.bench import compare, ours

    with ExitStack() as stack:
        url, cp = storages(backend, stack, "dbos")
        contenders = {"tenxgraph": ours(cp), "dbos": dbos_refund(url)}
        repetitions = [compare(contenders, runs, warmup=20) for _ in range(reps)]
    ratios = [r["tenxgraph"]["median_ms"] / r["dbos"]["median_ms"] for r in repetitions]
    return {
        "backend": backend,
        "tenxgraph_ms": round(statistics.median(r["tenxgraph"]["median_ms"] for r in repetitions), 3),
        "dbos_ms": round(statistics.median(r["dbos"]["median_ms"] for r in repetitions), 3),
        "ratio_median": round(statistics.median(ratios), 3),
        "ratio_min": round(min(ratios), 3),
        "runs": runs,
        "reps": reps,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--runs", type=int, default=200)
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument("--backend", choices=["sqlite", "postgres"], help="(the child process's part)")
    args = parser.parse_args()
    if args.backend:
        print(json.dumps(child(args.backend, args.runs, args.reps)))
        return
    try:
        import dbos  # noqa: F401
    except ImportError:
        print("DBOS is not installed: it comes with the bench extra (make bench installs it); skipped")
        return
    by_children("benchmarks.dbos_peer", args, RESULTS, "the DBOS benchmark", show)


def show(row: dict[str, Any]) -> str:
    return (
        f"  {row['backend']:9} ours {row['tenxgraph_ms']:7.3f} ms  DBOS {row['dbos_ms']:7.3f} ms  ratio median "
        f"{row['ratio_median']} (min {row['ratio_min']})"
    )


def by_children(
    module: str, args: argparse.Namespace, results: Path, what: str, show: Callable[[dict[str, Any]], str]
) -> None:
    """Run *module*'s child (``--backend``) on SQLite and, with ``REPLAYSAFE_PG_DSN``, PostgreSQL, one process
    each (DBOS is a process-wide singleton); print each row with *show*; write them and the load to *results*."""
    backends = ["sqlite"] + (["postgres"] if os.environ.get("REPLAYSAFE_PG_DSN") else [])
    load = os.getloadavg()[0]
    rows = []
    for backend in backends:
        command = [sys.executable, "-m", module, f"--backend={backend}", f"--runs={args.runs}", f"--reps={args.reps}"]
        proc = subprocess.run(command, capture_output=True, text=True, check=False)
        if proc.returncode != 0:
            raise SystemExit(f"{what} on {backend} failed:\n{proc.stdout[-2000:]}\n{proc.stderr[-3000:]}")
        rows.append(json.loads(proc.stdout.strip().splitlines()[-1]))
        print(show(rows[-1]), flush=True)
    results.write_text(json.dumps({"rows": rows, "load_at_start": round(load, 2)}, indent=2) + "\n")
    print(f"written: {results}")


if __name__ == "__main__":
    main()
