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

from benchmarks.bench import pg_dsn, pg_schema
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


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--turns", type=int, default=300)
    parser.add_argument("--reps", type=int, default=3)
    args = parser.parse_args()
    tmp = Path(tempfile.mkdtemp(prefix="tenxturns-"))
    load = round(os.getloadavg()[0], 2)
    results: dict[str, Any] = {"load_average_at_start": load, "cpus": os.cpu_count(), "backends": {}}

    def measure(name: str, cp: BaseCheckpointer) -> None:
        runs = [one_thread(cp, args.turns) for _ in range(args.reps)]
        rows: dict[str, Any] = {}
        for turn in MEASURED:
            if turn > args.turns:
                continue
            times = [r[turn][0] for r in runs]
            rows[str(turn)] = {
                "min_ms": round(min(times), 3),
                "median_ms": round(statistics.median(times), 3),
                "messages_read": runs[-1][turn][1],
            }
        last, first = rows[str(max(t for t in MEASURED if t <= args.turns))], rows["2"]
        rows["last_over_turn_2"] = round(last["median_ms"] / first["median_ms"], 2)
        results["backends"][name] = rows
        print(f"{name:15} " + "  ".join(f"turn {t}: {v}" for t, v in rows.items()), flush=True)

    print(f"per-turn time, {args.reps} threads of {args.turns} turns; load average {load:.2f}")
    measure("memory", InMemoryCheckpointer())
    measure("sqlite", SqliteCheckpointer(tmp / "turns.db"))
    dsn = pg_dsn()
    if dsn:
        from tenxgraph.storage.checkpointer.pg import PgCheckpointer

        redis_url = os.environ.get("REPLAYSAFE_REDIS_URL")
        for name, url in (("postgres", None), ("postgres+redis", redis_url)):
            if name == "postgres+redis" and not url:
                continue
            with pg_schema(dsn, "bench_turns") as schema:
                cp = PgCheckpointer(postgres_dsn=dsn, redis_url=url, schema=schema)
                measure(name, cp)
                cp.close()
    RESULTS.write_text(json.dumps(results, indent=2) + "\n")
    print(f"written to {RESULTS}")


if __name__ == "__main__":
    main()
