"""Per-turn time as one thread grows: turns 2, 100 and 300 of a thread, on each backend.

A turn: a user message, an assistant message with one tool call, the tool's result, a final answer (4 messages,
3 state writes, 1 ledger record). The scripted model looks only at the last message, so the model costs the
same at every turn and what grows is the runtime's own work. ``--reps`` threads per backend; per measured turn
the min and median over them, and the rows of messages the run read from storage at that turn.

    python -m benchmarks.turns [--turns 300] [--reps 3]      (PostgreSQL rows with REPLAYSAFE_PG_DSN set)
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import tempfile
import time
import uuid
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from benchmarks.bench import langgraph_installed, langgraph_react, langgraph_savers, pg_contenders, pg_dsn
from tenxgraph import Message, ReactAgent, Reply, ScriptedModel
from tenxgraph.storage.checkpointer import BaseCheckpointer, InMemoryCheckpointer, SqliteCheckpointer
from tenxgraph.storage.checkpointer.base import MessagesAfter
from tenxgraph.storage.checkpointer.delegating import DelegatingCheckpointer

RESULTS = Path(__file__).with_name("turns.json")
MEASURED = (2, 100, 300)


class CountingReads(DelegatingCheckpointer):
    """Counts the messages each load returned (full or incremental)."""

    rows = 0

    async def alist_messages(self, thread_id: str) -> list[Message]:
        found = await super().alist_messages(thread_id)
        CountingReads.rows += len(found)
        return found

    async def alist_messages_after(self, thread_id: str, after_seq: int) -> MessagesAfter | None:
        found = await super().alist_messages_after(thread_id, after_seq)
        CountingReads.rows += len(found.rows) if found is not None else 0
        return found


def lookup_order(order_id: str) -> str:
    """Look up an order."""
    return f"order {order_id}: 20.00 EUR, delivered"


def _last_is_user(messages: Sequence[Message]) -> int:
    return 0 if messages[-1].role == "user" else 1


def app(cp: BaseCheckpointer) -> Any:
    model = ScriptedModel(
        [Reply(tool_calls=[("lookup_order", {"order_id": "1042"})]), "Order 1042 is delivered."],
        turn_of=_last_is_user,
    )
    return ReactAgent(model, tools=[lookup_order]).compile(checkpointer=CountingReads(cp))


def one_thread(cp: BaseCheckpointer, turns: int) -> dict[int, tuple[float, int]]:
    graph, thread = app(cp), f"turns-{uuid.uuid4().hex[:8]}"
    out: dict[int, tuple[float, int]] = {}
    for turn in range(1, turns + 1):
        CountingReads.rows = 0
        started = time.perf_counter()
        graph.invoke({"messages": [Message.text_message(f"where is order 1042? ({turn})")]}, {"thread_id": thread})
        if turn in MEASURED:
            out[turn] = ((time.perf_counter() - started) * 1000, CountingReads.rows)
    return out


def langgraph_thread(saver: Any, turns: int) -> dict[int, tuple[float, int]]:
    """The same conversation on LangGraph (``durability="sync"``); messages read are not counted there (-1)."""
    from langchain_core.messages import AIMessage, HumanMessage
    from langchain_core.tools import tool

    def model(state: dict[str, Any]) -> dict[str, Any]:
        if isinstance(state["messages"][-1], HumanMessage):
            call = {"name": "lookup_order", "args": {"order_id": "1042"}, "id": uuid.uuid4().hex, "type": "tool_call"}
            return {"messages": [AIMessage(content="", tool_calls=[call])]}
        return {"messages": [AIMessage(content="Order 1042 is delivered.")]}

    app = langgraph_react(saver, model, [tool(lookup_order)])
    config = {"configurable": {"thread_id": f"lg-{uuid.uuid4().hex[:8]}"}}
    out: dict[int, tuple[float, int]] = {}
    for turn in range(1, turns + 1):
        started = time.perf_counter()
        app.invoke({"messages": [HumanMessage(f"where is order 1042? ({turn})")]}, config, durability="sync")
        if turn in MEASURED:
            out[turn] = ((time.perf_counter() - started) * 1000, -1)
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--turns", type=int, default=300)
    parser.add_argument("--reps", type=int, default=3)
    args = parser.parse_args()
    tmp = Path(tempfile.mkdtemp(prefix="tenxturns-"))
    load = round(os.getloadavg()[0], 2)
    results: dict[str, Any] = {"load_average_at_start": load, "cpus": os.cpu_count(), "backends": {}}

    def summary(runs: list[dict[int, tuple[float, int]]]) -> dict[str, Any]:
        rows: dict[str, Any] = {}
        for turn in [t for t in MEASURED if t <= args.turns]:
            times = [r[turn][0] for r in runs]
            rows[str(turn)] = {
                "min_ms": round(min(times), 3),
                "median_ms": round(statistics.median(times), 3),
                "messages_read": runs[-1][turn][1],
            }
        last = rows[str(max(t for t in MEASURED if t <= args.turns))]
        rows["last_over_turn_2"] = round(last["median_ms"] / rows["2"]["median_ms"], 2)
        return rows

    def measure(name: str, cp: BaseCheckpointer, saver: Any | None = None) -> None:
        ours, theirs = [], []
        for _ in range(args.reps):  # interleaved: one thread of ours, one of LangGraph's, and again
            ours.append(one_thread(cp, args.turns))
            if saver is not None:
                theirs.append(langgraph_thread(saver, args.turns))
        row: dict[str, Any] = {"tenxgraph": summary(ours)}
        if theirs:
            row["langgraph"] = summary(theirs)
            row["ratio"] = {}
            for turn in [t for t in MEASURED if t <= args.turns]:
                ratios = [a[turn][0] / b[turn][0] for a, b in zip(ours, theirs, strict=True)]
                row["ratio"][str(turn)] = {"median": round(statistics.median(ratios), 3), "min": round(min(ratios), 3)}
        results["backends"][name] = row
        print(f"{name:15} {json.dumps(row)}", flush=True)

    print(f"per-turn time, {args.reps} threads of {args.turns} turns; load average {load:.2f}")
    savers = langgraph_savers(tmp) if langgraph_installed() else {}
    measure("memory", InMemoryCheckpointer(), savers.get("memory"))
    measure("sqlite", SqliteCheckpointer(tmp / "turns.db"), savers.get("sqlite"))
    dsn = pg_dsn()
    if dsn:
        from tenxgraph.storage.checkpointer.pg import PgCheckpointer

        redis_url = os.environ.get("REPLAYSAFE_REDIS_URL")
        with pg_contenders(dsn, "bench_turns", langgraph_installed()) as (cp, saver, schema):
            measure("postgres", cp, saver)
            if redis_url:
                cached = PgCheckpointer(postgres_dsn=dsn, redis_url=redis_url, schema=schema)
                measure("postgres+redis", cached, saver)
                cached.close()
    RESULTS.write_text(json.dumps(results, indent=2) + "\n")
    print(f"written to {RESULTS}")


if __name__ == "__main__":
    main()
