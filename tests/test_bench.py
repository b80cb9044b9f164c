"""The benchmark's machinery, and PostgreSQL round trips per run (counted, never timed)."""

from __future__ import annotations

from benchmarks import bench
from tenxgraph.storage.checkpointer import InMemoryCheckpointer


def test_compare_interleaves_and_reports_each_contender() -> None:
    calls: list[str] = []
    figures = bench.compare({"a": lambda: calls.append("a"), "b": lambda: calls.append("b")}, runs=20, warmup=1)
    assert set(figures) == {"a", "b"} and figures["a"]["runs"] == 20
    assert calls[2:12] == ["a"] * 10 and calls[12:22] == ["b"] * 10 and calls[22:32] == ["a"] * 10  # interleaved
    assert figures["a"]["p95_ms"] >= figures["a"]["median_ms"] >= 0


def test_scenario_runs_with_and_without_the_ledger() -> None:
    cp = InMemoryCheckpointer()
    bench.ours(cp)()
    bench.ours_without_ledger(cp)()
    threads_with_records = [t for t in list(cp._ledger) if cp._ledger[t]]
    assert len(threads_with_records) == 1  # only the run with the ledger recorded its 2 calls
    assert len(cp._ledger[threads_with_records[0]]) == 2


def test_postgres_round_trips_per_refund_run(pg_dsn: str, pg_schema: str) -> None:
    """Run lock + unlock (no commit), thread read, start write, 3 advances, 1 ledger read (one tool node),
    2 records (one per call)."""
    cp = bench.make_pg(pg_dsn, pg_schema, counting=True)
    run = bench.ours(cp)
    run()  # schema setup happens on first use
    bench.RoundTrips.count = 0
    for _ in range(3):
        run()
    assert bench.RoundTrips.count == 3 * 10
    bench.close_pg(cp)
