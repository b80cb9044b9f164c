"""``ReplaySafeToolNode`` beside LangGraph's own ``ToolNode``, interleaved in one run (issue #52, item 3): the same
LangGraph agent (``StateGraph``, ``durability="sync"``, a fresh thread per run) with one tool step of N parallel
calls, once through each node in turn, on LangGraph's SQLite saver with our SQLite ledger, and on its PostgreSQL
saver with our PostgreSQL ledger (with ``REPLAYSAFE_PG_DSN``). Each pair's ratio (ours / ToolNode) is kept; the
median, min and max of the ratios, the ledger's reads and commits per batch, and the machine's load are written to
``benchmarks/tool_node.json`` (target: a median ratio of at most 1.15 at N = 1, 4 and 16).

Beside them, on SQLite, the floors of the sync path without any ledger work: a ``ToolNode`` whose
``wrap_tool_call`` only hands each call to the sync wrappers' event loop and back (``crossing``), and one that
also runs LangGraph's ``execute`` in a thread from there (``crossing + thread``), as the wrapper does.

    python -m benchmarks.tool_node [pairs]   # 30 pairs per N by default
"""

from __future__ import annotations

import json
import os
import sqlite3
import statistics
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from contextlib import ExitStack, contextmanager
from pathlib import Path
from typing import Any

from benchmarks import bench

RESULTS = Path(__file__).with_name("tool_node.json")
SIZES = (1, 4, 16)
TARGET = 1.15


def refund(order: int) -> str:
    """Refund an order."""
    return f"refunded {order}"


@contextmanager
def backends(tmp: Path) -> Iterator[dict[str, tuple[Any, Any]]]:
    """Per backend: (LangGraph's saver, our ledger counted by :class:`bench.Writes`)."""
    from langgraph.checkpoint.sqlite import SqliteSaver

    from tenxgraph.storage.checkpointer import PgCheckpointer, SqliteCheckpointer

    with ExitStack() as stack:
        saver = SqliteSaver(sqlite3.connect(tmp / "saver.db", check_same_thread=False))
        saver.setup()
        ledger = SqliteCheckpointer(tmp / "ledger.db")
        stack.callback(ledger.close)
        found = {"sqlite": (saver, bench.Writes(ledger))}
        dsn = bench.pg_dsn()
        if dsn:
            schema = stack.enter_context(bench.pg_schema(dsn, "tenxbench_toolnode"))
            pg_saver = stack.enter_context(bench.postgres_saver(dsn, schema))
            pg_ledger = PgCheckpointer(postgres_dsn=dsn, schema=schema)
            stack.callback(pg_ledger.close)
            found["postgres"] = (pg_saver, bench.Writes(pg_ledger))
        yield found


def timed(run: Callable[[], None]) -> float:
    start = time.perf_counter()
    run()
    return time.perf_counter() - start


def measure(saver: Any, ledger: Any, n: int, pairs: int) -> dict[str, Any]:
    """*pairs* runs through each node, alternating (which goes first alternates too)."""
    from tenxgraph.integrations.langgraph import ReplaySafeToolNode

    calls = [{"order": i} for i in range(n)]
    plain = bench.langgraph_calls(saver, refund, calls)
    ours = bench.langgraph_calls(saver, refund, calls, tool_node=ReplaySafeToolNode([refund], ledger=ledger))
    for _ in range(3):  # warm-up: imports, connections, the first statements' plans
        plain()
        ours()
    bench.Writes.reset()
    ratios, plain_ms, ours_ms = [], [], []
    for i in range(pairs):
        if i % 2:
            b, a = timed(ours), timed(plain)
        else:
            a, b = timed(plain), timed(ours)
        ratios.append(b / a)
        plain_ms.append(a * 1000)
        ours_ms.append(b * 1000)
    return {
        "n": n,
        "pairs": pairs,
        "ratio_median": round(statistics.median(ratios), 3),
        "ratio_min": round(min(ratios), 3),
        "ratio_max": round(max(ratios), 3),
        "tool_node_ms_median": round(statistics.median(plain_ms), 2),
        "replay_safe_ms_median": round(statistics.median(ours_ms), 2),
        "ledger_reads_per_batch": round(bench.Writes.reads / pairs, 2),
        "ledger_commits_per_batch": round(bench.Writes.ledger / pairs, 2),
    }


def floors(saver: Any, n: int, pairs: int) -> list[dict[str, Any]]:
    """The ratios of the sync path's thread crossings alone (no ledger) over ``ToolNode``, *pairs* each."""
    from langchain_core.tools import tool
    from langgraph.prebuilt import ToolNode

    from tenxgraph.utils.sync import run_sync, to_thread

    def crossing(request: Any, execute: Callable[[Any], Any]) -> Any:
        async def run() -> Any:
            return execute(request)

        return run_sync(run())

    def crossing_and_thread(request: Any, execute: Callable[[Any], Any]) -> Any:
        async def run() -> Any:
            return await to_thread(execute, request)

        return run_sync(run())

    calls = [{"order": i} for i in range(n)]
    plain = bench.langgraph_calls(saver, refund, calls)
    rows = []
    for name, wrap in (("crossing", crossing), ("crossing + thread", crossing_and_thread)):
        node = ToolNode([tool(refund)], wrap_tool_call=wrap)
        wrapped = bench.langgraph_calls(saver, refund, calls, tool_node=node)
        for _ in range(3):
            plain()
            wrapped()
        ratios = []
        for i in range(pairs):  # (alternating which runs first, as measure() does)
            if i % 2:
                base = timed(plain)
                ratios.append(timed(wrapped) / base)
            else:
                over = timed(wrapped)
                ratios.append(over / timed(plain))
        rows.append({"floor": name, "n": n, "pairs": pairs, "ratio_median": round(statistics.median(ratios), 3)})
    return rows


def main() -> None:
    pairs = int(sys.argv[1]) if len(sys.argv) > 1 else 30
    out: dict[str, Any] = {"load_average_at_start": round(os.getloadavg()[0], 2), "target": TARGET, "rows": []}
    with backends(Path(tempfile.mkdtemp(prefix="tenxbench-toolnode-"))) as found:
        for backend, (saver, ledger) in found.items():
            for n in SIZES:
                row = {"backend": backend, **measure(saver, ledger, n, pairs)}
                out["rows"].append(row)
                print("ReplaySafeToolNode / ToolNode:", json.dumps(row), flush=True)
        for n in SIZES:
            for row in floors(found["sqlite"][0], n, pairs):
                out.setdefault("floors", []).append(row)
                print("floor / ToolNode (SQLite, no ledger):", json.dumps(row), flush=True)
    out["load_average_at_end"] = round(os.getloadavg()[0], 2)
    RESULTS.write_text(json.dumps(out, indent=2) + "\n")
    print(f"written: {RESULTS}")


if __name__ == "__main__":
    main()
