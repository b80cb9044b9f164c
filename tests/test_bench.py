"""The benchmark's machinery, and PostgreSQL round trips per run (counted, never timed)."""

from __future__ import annotations

from typing import Any

from benchmarks import bench
from tenxgraph.storage.checkpointer import InMemoryCheckpointer
from tests.helpers import SpyCheckpointer


def test_compare_interleaves_and_reports_each_contender() -> None:
    calls: list[str] = []
    figures = bench.compare({"a": lambda: calls.append("a"), "b": lambda: calls.append("b")}, runs=20, warmup=1)
    assert set(figures) == {"a", "b"} and figures["a"]["runs"] == 20
    assert calls[2:12] == ["a"] * 10 and calls[12:22] == ["b"] * 10 and calls[22:32] == ["a"] * 10  # interleaved
    assert figures["a"]["p95_ms"] >= figures["a"]["median_ms"] >= 0


def test_scenario_runs_with_and_without_the_ledger() -> None:
    with_ledger, without = SpyCheckpointer(InMemoryCheckpointer()), SpyCheckpointer(InMemoryCheckpointer())
    bench.ours(with_ledger)()
    bench.ours_without_ledger(without)()
    assert with_ledger.calls["put_tool_result"] == 2 and with_ledger.calls["get_tool_results"] == 1
    assert without.calls["put_tool_result"] == 0 and without.calls["get_tool_results"] == 0  # nothing reached storage
    assert without.calls["put_thread"] == with_ledger.calls["put_thread"]  # the same run otherwise


def test_postgres_round_trips_per_refund_run(pg_dsn: str, pg_schema: str) -> None:
    """Statements: run lock and lease claim (one statement) + unlock, thread read, message read, the new thread's
    start, 3 advances, 1 ledger read (one tool node): 9, plus BEGIN, the lease's release and COMMIT around the last
    advance (one transaction: the lease costs no commit of its own); then one per ledger write: 1 when the two
    calls return together (group commit), 2 when apart (the scenario's sync tools finish in threads, so which one
    happens is up to the scheduler). Round trips: 5 plus the ledger writes, 6 when the calls return together; the
    lock travels with the thread and message reads and the new thread's start (written under the lease claimed in
    the same transaction), and the unlock with the last advance (pipelined after its COMMIT). The tool node's
    ledger read is a round trip of its own, made after the points where the thread may change hands (a read that
    rode on the write of the assistant message answered for a time before them: a run that took the thread over
    meanwhile had its records hidden, and the calls ran twice). The durable facts a run needs, each once: the lock
    with the start, the assistant message before its calls run, the ledger read, each group of records as the
    calls return, the tool node's advance, the last advance with the unlock."""
    from tests.test_group_commit import CountingWrites

    cp = bench.make_pg(pg_dsn, pg_schema, counting=True)
    counting = CountingWrites(cp)
    run = bench.ours(counting)
    run()  # schema setup happens on first use
    bench.RoundTrips.reset()
    counting.writes.clear()
    for _ in range(3):
        run()
    assert sum(counting.writes) == 3 * 2 and len(counting.writes) in range(3, 7)  # 2 records per run, 1-2 writes
    assert bench.RoundTrips.statements == 3 * 12 + len(counting.writes)
    assert bench.RoundTrips.count == 3 * 5 + len(counting.writes)
    bench.close_pg(cp)


def test_an_approval_pause_and_its_resume_round_trips(pg_dsn: str, pg_schema: str) -> None:
    """The paused run: the lock with the start, the assistant message, the tool node's ledger read, the pause with
    the unlock (its last write): 4. The resume: the lock with the thread's reads and the Resume's decisions (read
    behind the lock), the decisions' record, the status write, the tool node's ledger read, its record(s), two
    advances (the last with the unlock): 5 plus the ledger writes. In all 4 more than the same run without the
    approval (5 plus its record writes)."""
    from benchmarks import scenario
    from tenxgraph import ReactAgent, Reply, Resume, ScriptedModel, tool
    from tests.test_group_commit import CountingWrites

    cp = bench.make_pg(pg_dsn, pg_schema, counting=True)
    counting = CountingWrites(cp)
    script = [Reply(tool_calls=[("lookup_order", {"order_id": "1"}), ("refund_order", {"order_id": "1"})]), "ok"]
    tools = [scenario.lookup_order, tool(approval=True)(scenario.refund_order)]
    app = ReactAgent(ScriptedModel(script), tools=tools).compile(counting)
    app.invoke(scenario.tenxgraph_input(), {"thread_id": "warm"})  # (schema setup)
    bench.RoundTrips.reset()
    paused = app.invoke(scenario.tenxgraph_input(), {"thread_id": "measured"})
    assert paused.status == "interrupted" and bench.RoundTrips.count == 4
    bench.RoundTrips.reset()
    counting.writes.clear()
    done = app.invoke(Resume({i.id: True for i in paused.interrupts}), {"thread_id": "measured"})
    assert done.status == "done" and counting.writes[0] == 1  # the decision, then the tool node's 1-2 groups
    assert len(counting.writes) in (2, 3) and bench.RoundTrips.count == 5 + len(counting.writes)
    bench.close_pg(cp)


def test_in_doubt_opt_in_costs_one_statement_per_call(pg_dsn: str, pg_schema: str) -> None:
    """Tools with on_in_doubt write an intent before running: exactly one extra statement per call, no more."""
    from benchmarks import scenario
    from tenxgraph import ReactAgent, Reply, ScriptedModel, tool

    cp = bench.make_pg(pg_dsn, pg_schema, counting=True)
    tools = [tool(on_in_doubt="fail")(scenario.lookup_order), tool(on_in_doubt="fail")(scenario.refund_order)]
    script = [Reply(tool_calls=[("lookup_order", {"order_id": "1"}), ("refund_order", {"order_id": "1"})]), "ok"]
    from tests.test_group_commit import CountingWrites

    counting = CountingWrites(cp)
    app = ReactAgent(ScriptedModel(script), tools=tools).compile(counting)
    app.invoke(scenario.tenxgraph_input(), {"thread_id": "warm"})
    bench.RoundTrips.reset()
    counting.writes.clear()
    app.invoke(scenario.tenxgraph_input(), {"thread_id": "measured"})
    assert bench.RoundTrips.statements == 12 + len(counting.writes) + 2  # the plain run's, plus one intent per call
    assert bench.RoundTrips.count == 5 + len(counting.writes) + 2
    bench.close_pg(cp)


def test_a_turn_of_an_existing_thread_reads_its_messages_in_the_locks_round_trip(pg_dsn: str, pg_schema: str) -> None:
    """Turn 2 of a thread reads its state and its new messages with the lock: one round trip more than the first
    turn of a new thread (whose start went with the lock; a later turn's start is written on its own, after the
    state it reads), with the graph that ran turn 1 (which knows the thread exists: it sends no start) and with a
    new graph object (which reads the whole log, and sends a start with the lock in case the thread is new: one
    statement more, in the same round trip, that writes nothing)."""
    from benchmarks.turns import app
    from tenxgraph import Message

    cp = bench.make_pg(pg_dsn, pg_schema, counting=True)

    def turn(graph: Any, thread: str, n: int) -> tuple[int, int]:
        bench.RoundTrips.reset()
        result = graph.invoke({"messages": [Message.text_message(f"where is order {n}?")]}, {"thread_id": thread})
        assert result.final_text == "Order 1042 is delivered."
        return bench.RoundTrips.count, bench.RoundTrips.statements

    graph = app(cp)
    turn(graph, "warm-up", 1)
    first = turn(graph, "t", 1)  # a new thread: its (missing) row read, its start written, with the lock
    second = turn(graph, "t", 2)  # the graph knows the thread: the lock reads its state and messages
    cold = turn(app(cp), "t", 3)  # a new graph object: reads the whole log, still in the lock's round trip
    assert first == (6, 13) and second == (7, 13) and cold == (7, 14), (first, second, cold)
    assert [m.text for m in graph.get_state("t").messages if m.role == "user"] == [  # type: ignore[union-attr]
        f"where is order {n}?" for n in (1, 2, 3)
    ]
    bench.close_pg(cp)


def test_make_bench_prints_each_target_met_or_missed_with_its_spread_and_load() -> None:
    """The last step of ``make bench`` turns the parts' JSON into one line per target: median, min, load, and a
    verdict that follows the number (a ratio above its target is MISSED, at or below it met)."""
    from benchmarks.collect import rows

    merged = {
        "refund": {
            "load_average_at_start": 1.5,
            "ratio_spread": {"memory": {"median": 0.17, "min": 0.15}, "sqlite": {"median": 0.24, "min": 0.2}},
            "postgres_round_trips_per_run": 6.0,
            "crash_matrix": {"sigkill": {"median_cell_ms": 9.5}},
        },
        "budgets": {
            "approval": {"extra_round_trips": 7},
            "replay_safe_tool_node": [{"n": 4, "ledger_commits_per_batch": 1.0}],
        },
    }
    table = {target: (median, low, load, ok) for target, median, low, load, ok in rows(merged)}
    assert table["refund run, memory: <= 0.12 of LangGraph"] == ("0.17", "0.15", "1.50", "MISSED")
    assert table["refund run, sqlite: <= 0.25 of LangGraph"] == ("0.24", "0.2", "1.50", "met")
    assert table["PostgreSQL round trips per refund run <= 5 (ledger writes included)"][3] == "MISSED"
    assert table["crash matrix: SIGKILL cell on SQLite <= 10 ms (median)"][3] == "met"
    assert table["approval pause + resume: 2 round trips on PostgreSQL"][3] == "MISSED"
    assert table["ReplaySafeToolNode, N = 4: <= 1 commit per batch over ToolNode"][3] == "met"
    assert not any(t.startswith("refund run, postgres") for t in table)  # a part that did not run prints nothing


def test_the_pydantic_ai_peer_runs_the_agent_durable_and_bare(tmp_path: Any) -> None:
    """benchmarks/pydantic_ai_peer.py's contenders (DBOS's needs the bench extra): each run a new run, each right."""
    import pytest

    pytest.importorskip("pydantic_ai.durable_exec")
    from benchmarks.pydantic_ai_peer import bare, ours
    from tenxgraph.storage.checkpointer import SqliteCheckpointer

    ledger = SqliteCheckpointer(tmp_path / "ours.db")
    contenders = {"tenxgraph": ours(ledger), "bare": bare()}
    out = bench.compare(contenders, runs=10, warmup=1)
    assert {name: row["runs"] for name, row in out.items()} == {"tenxgraph": 10, "bare": 10}
    ledger.close()
