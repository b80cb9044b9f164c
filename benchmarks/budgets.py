"""Budgets counted, not timed: what the new paths cost in round trips and commits (``make bench``; writes
``benchmarks/budgets.json``).

- ``approval``: the refund run with ``refund_order`` behind an approval (``tool(approval=True)``) on PostgreSQL:
  round trips of the run that pauses and of the ``Resume`` that finishes it, against the same run without the
  approval (target: the pause and the resume together cost 2 round trips more).
- ``replay_safe_tool_node``: LangGraph's agent (``StateGraph`` + ``ToolNode``, ``durability="sync"``) on its
  SQLite saver, with ``ReplaySafeToolNode`` over our SQLite ledger: the ledger's commits per tool batch of N
  calls (the saver's writes are the bare ``ToolNode``'s own; target: at most 1 commit per batch over it).

    python -m benchmarks.budgets   # PostgreSQL rows with REPLAYSAFE_PG_DSN; LangGraph rows when installed
"""

from __future__ import annotations

import json
import os
import sqlite3
import tempfile
import uuid
from pathlib import Path
from typing import Any

from benchmarks import bench, scenario
from tenxgraph.storage.checkpointer import SqliteCheckpointer

RESULTS = Path(__file__).with_name("budgets.json")


def approval_round_trips(dsn: str) -> dict[str, Any]:
    """Round trips of a plain refund run, of the same run paused for an approval, and of its ``Resume``."""
    from tenxgraph import ReactAgent, Reply, Resume, ScriptedModel, tool

    def app(cp: Any, approval: bool) -> Any:
        refund = tool(approval=True)(scenario.refund_order) if approval else scenario.refund_order
        script: list[Reply | str] = [
            Reply(tool_calls=[("lookup_order", {"order_id": "1042"}), ("refund_order", {"order_id": "1042"})]),
            "Refunded 20.00 EUR on order 1042.",
        ]
        return ReactAgent(ScriptedModel(script), tools=[scenario.lookup_order, refund]).compile(checkpointer=cp)

    def counted(run: Any) -> int:
        bench.RoundTrips.reset()
        run()
        return bench.RoundTrips.count

    with bench.pg_schema(dsn, "bench_budget") as schema:
        cp = bench.make_pg(dsn, schema, counting=True)
        try:
            plain, approved = app(cp, False), app(cp, True)
            for _ in range(2):  # (schema setup and first use)
                plain.invoke(scenario.tenxgraph_input(), {"thread_id": uuid.uuid4().hex})
            plain_rt = counted(lambda: plain.invoke(scenario.tenxgraph_input(), {"thread_id": uuid.uuid4().hex}))
            thread = uuid.uuid4().hex
            paused: list[Any] = []
            pause_rt = counted(
                lambda: paused.append(approved.invoke(scenario.tenxgraph_input(), {"thread_id": thread}))
            )
            assert paused[0].status == "interrupted", paused[0].status
            answers = Resume({i.id: True for i in paused[0].interrupts})
            resume_rt = counted(lambda: approved.invoke(answers, {"thread_id": thread}))
            assert approved.get_state(thread).meta.status == "done"
        finally:
            bench.close_pg(cp)
    return {
        "plain_run": plain_rt,
        "paused_run": pause_rt,
        "resume": resume_rt,
        "extra_round_trips": pause_rt + resume_rt - plain_rt,
        "note": "round trips include the ledger writes (1-2 per tool node: group commit)",
    }


def tool_node_commits(tmp: Path, sizes: tuple[int, ...] = (1, 4, 16)) -> list[dict[str, Any]]:
    """Our ledger's commits and reads per tool batch of N calls under ``ReplaySafeToolNode`` (3 runs each)."""
    from langgraph.checkpoint.sqlite import SqliteSaver

    from tenxgraph.integrations.langgraph import ReplaySafeToolNode

    def f(x: int) -> int:
        """Return x."""
        return x

    rows = []
    for n in sizes:
        ledger = bench.Writes(SqliteCheckpointer(tmp / f"ledger-{n}.db"))
        saver = SqliteSaver(sqlite3.connect(tmp / f"saver-{n}.db", check_same_thread=False))
        saver.setup()
        node = ReplaySafeToolNode([f], ledger=ledger)
        run = bench.langgraph_calls(saver, f, [{"x": i} for i in range(n)], tool_node=node)
        run()
        bench.Writes.reset()
        for _ in range(3):
            run()
        rows.append(
            {
                "n": n,
                "ledger_commits_per_batch": bench.Writes.ledger / 3,
                "ledger_reads_per_batch": bench.Writes.reads / 3,
            }
        )
    return rows


def main() -> None:
    out: dict[str, Any] = {"load_average_at_start": round(os.getloadavg()[0], 2)}
    dsn = bench.pg_dsn()
    if dsn:
        out["approval"] = approval_round_trips(dsn)
        print("approval on PostgreSQL, round trips:", json.dumps(out["approval"]), flush=True)
    if bench.langgraph_installed():
        out["replay_safe_tool_node"] = tool_node_commits(Path(tempfile.mkdtemp(prefix="tenxbudget-")))
        print(
            "ReplaySafeToolNode, ledger commits and reads per batch:",
            json.dumps(out["replay_safe_tool_node"]),
            flush=True,
        )
    RESULTS.write_text(json.dumps(out, indent=2) + "\n")
    print(f"written: {RESULTS}")


if __name__ == "__main__":
    main()
