"""N parallel tool calls in one assistant message: one run's time for N = 1, 4, 16, 64, per backend.

Contenders, interleaved in one run: ``tenxgraph`` (group commit: calls that return together are recorded in one
write), ``one_by_one`` (the same runtime with each record written on its own, as before group commit) and, when
installed (``make bench`` installs it), LangGraph with ``durability="sync"``. The tool is a plain (sync)
function that returns at once; both runtimes run such tools in worker threads, so how many calls return
"together" is up to the scheduler: the ledger writes per run are counted and reported. Reports the median and
min of ``--reps`` medians (each over ``--runs`` runs).

    python -m benchmarks.parallel [--runs 30] [--reps 3]     (PostgreSQL rows with REPLAYSAFE_PG_DSN set)
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import tempfile
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

from benchmarks.bench import (
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
from tenxgraph.storage.checkpointer import BaseCheckpointer, InMemoryCheckpointer, SqliteCheckpointer
from tenxgraph.storage.checkpointer.delegating import DelegatingCheckpointer

RESULTS = Path(__file__).with_name("parallel.json")
SIZES = (1, 4, 16, 64)


class OneByOne(DelegatingCheckpointer):
    """Records written one at a time (a wrapper that intercepts single writes gets groups one record at a time)."""

    async def aput_tool_result(self, thread_id: str, key: str, record: dict[str, JSON]) -> bool:
        return await self.inner.aput_tool_result(thread_id, key, record)


def fetch(item: int) -> str:
    """Fetch an item."""
    return f"item {item}"


def ours(cp: BaseCheckpointer, n: int) -> Callable[[], None]:
    script: list[Reply | str] = [Reply(tool_calls=[("fetch", {"item": i}) for i in range(n)]), "done"]
    app: Any = ReactAgent(ScriptedModel(script), tools=[fetch]).compile(checkpointer=cp)

    def run() -> None:
        app.invoke({"messages": [Message.text_message("fetch")]}, {"thread_id": uuid.uuid4().hex})

    return run


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--runs", type=int, default=30)
    parser.add_argument("--reps", type=int, default=3)
    args = parser.parse_args()
    tmp = Path(tempfile.mkdtemp(prefix="tenxpar-"))
    load = round(os.getloadavg()[0], 2)
    out: dict[str, Any] = {"load_average_at_start": load, "cpus": os.cpu_count(), "rows": []}
    lg = langgraph_installed()
    print(f"N parallel calls per run; {args.reps} x {args.runs} runs; load average {load}; langgraph: {lg}")

    def measure(backend: str, cp: BaseCheckpointer, saver: Any | None) -> None:
        for n in SIZES:
            contenders = {"tenxgraph": ours(cp, n), "one_by_one": ours(OneByOne(cp), n)}
            if saver is not None:
                contenders["langgraph"] = langgraph_calls(saver, fetch, [{"item": i} for i in range(n)])
            medians: dict[str, list[float]] = {name: [] for name in contenders}
            for _ in range(args.reps):
                figures = compare(contenders, args.runs, warmup=3)
                for name, f in figures.items():
                    medians[name].append(f["median_ms"])
            Writes.reset()
            ours(Writes(cp), n)()
            row: dict[str, Any] = {"backend": backend, "n": n, "ledger_writes_per_run": Writes.ledger}
            for name, values in medians.items():
                row[f"{name}_median_ms"] = round(statistics.median(values), 3)
                row[f"{name}_min_ms"] = round(min(values), 3)
            if "langgraph" in medians:
                ratios = [a / b for a, b in zip(medians["tenxgraph"], medians["langgraph"], strict=True)]
                row["ratio_median"], row["ratio_min"] = round(statistics.median(ratios), 3), round(min(ratios), 3)
            out["rows"].append(row)
            print("  " + "  ".join(f"{k}={v}" for k, v in row.items()), flush=True)

    savers = langgraph_savers(tmp) if lg else {}
    measure("memory", InMemoryCheckpointer(), savers.get("memory"))
    measure("sqlite", SqliteCheckpointer(tmp / "ours.db"), savers.get("sqlite"))
    dsn = pg_dsn()
    if dsn:
        with pg_contenders(dsn, "bench_par", lg) as (cp, saver, _):
            measure("postgres", cp, saver)
    RESULTS.write_text(json.dumps(out, indent=2) + "\n")
    print(f"written to {RESULTS}")


if __name__ == "__main__":
    main()
