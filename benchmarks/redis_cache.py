"""Does the Redis cache earn its place? Two measurements on PostgreSQL (REPLAYSAFE_PG_DSN) and Redis
(REPLAYSAFE_REDIS_URL):

1. Reading a 300-turn thread from a second process (no message cache yet): the thread's state from Redis
   (``aget_cached_thread``) against the same state from PostgreSQL (``aget_thread``), and what a worker needs to
   continue the thread (state and every message, from PostgreSQL: the cache holds no messages).
2. The cost of keeping the cache: one refund run (2 parallel calls) with and without Redis, interleaved.

    python -m benchmarks.redis_cache [--reads 200] [--runs 200]      (writes benchmarks/redis_cache.json)
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import subprocess
import sys
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

from benchmarks.bench import compare, ours, pg_schema
from benchmarks.turns import app as turns_app
from tenxgraph import Message
from tenxgraph.utils.sync import run_sync

RESULTS = Path(__file__).with_name("redis_cache.json")


def build_thread(dsn: str, redis_url: str, schema: str, turns: int) -> None:
    from tenxgraph.storage.checkpointer.pg import PgCheckpointer

    cp = PgCheckpointer(postgres_dsn=dsn, redis_url=redis_url, schema=schema)
    graph = turns_app(cp)
    for turn in range(turns):
        graph.invoke({"messages": [Message.text_message(f"turn {turn}")]}, {"thread_id": "long"})
    run_sync(cp.aflush_cache_writes())  # the cache writes run in the background
    cp.close()


def read_side(dsn: str, redis_url: str, schema: str, reads: int) -> dict[str, float]:
    """Run in a fresh process: medians in ms of each way to read the thread."""
    from tenxgraph.storage.checkpointer.pg import PgCheckpointer

    async def main() -> dict[str, float]:
        cp = PgCheckpointer(postgres_dsn=dsn, redis_url=redis_url, schema=schema)
        assert await cp.aget_cached_thread("long") is not None

        async def whole() -> object:
            return await asyncio.gather(cp.aget_thread("long"), cp.alist_messages("long"))

        ways: dict[str, Callable[[], Awaitable[object]]] = {
            "redis_state_ms": lambda: cp.aget_cached_thread("long"),
            "postgres_state_ms": lambda: cp.aget_thread("long"),
            "postgres_state_and_messages_ms": whole,
        }
        out = {}
        for name, read in ways.items():
            times = []
            for _ in range(reads):
                started = time.perf_counter()
                await read()
                times.append((time.perf_counter() - started) * 1000)
            out[name] = round(statistics.median(times), 3)
        await cp.aclose()
        return out

    return asyncio.run(main())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--reads", type=int, default=200)
    parser.add_argument("--runs", type=int, default=200)
    parser.add_argument("--child", nargs=3, metavar=("DSN", "REDIS", "SCHEMA"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        dsn, redis_url, schema = args.child
        print(json.dumps(read_side(dsn, redis_url, schema, args.reads)))
        return
    dsn, redis_url = os.environ.get("REPLAYSAFE_PG_DSN"), os.environ.get("REPLAYSAFE_REDIS_URL")
    if not dsn or not redis_url:
        sys.exit("set REPLAYSAFE_PG_DSN and REPLAYSAFE_REDIS_URL")
    from tenxgraph.storage.checkpointer.pg import PgCheckpointer

    result: dict[str, Any] = {"load_average_at_start": round(os.getloadavg()[0], 2), "cpus": os.cpu_count()}
    with pg_schema(dsn, "bench_redis") as schema:
        build_thread(dsn, redis_url, schema, 300)
        child = [sys.executable, "-m", "benchmarks.redis_cache", "--reads", str(args.reads), "--child"]
        done = subprocess.run([*child, dsn, redis_url, schema], capture_output=True, text=True, check=True)
        result["second_process_reads"] = json.loads(done.stdout.strip().splitlines()[-1])
        plain = PgCheckpointer(postgres_dsn=dsn, schema=schema)
        cached = PgCheckpointer(postgres_dsn=dsn, redis_url=redis_url, schema=schema)
        medians: dict[str, list[float]] = {"postgres": [], "postgres+redis": []}
        for _ in range(3):
            figures = compare({"postgres": ours(plain), "postgres+redis": ours(cached)}, args.runs // 3, warmup=10)
            for name, f in figures.items():
                medians[name].append(f["median_ms"])
        result["refund_run_ms"] = {
            k: {"median": round(statistics.median(v), 3), "min": round(min(v), 3)} for k, v in medians.items()
        }
        plain.close()
        cached.close()
    RESULTS.write_text(json.dumps(result, indent=2) + "\n")
    print(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
