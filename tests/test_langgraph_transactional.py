"""A LangGraph tool with ``effect="transactional"`` (#56): its writes to the ledger's database commit with its
record, so a crash anywhere leaves both or neither and the resume writes once. On SQLite (sync graphs) and
PostgreSQL (sync graphs through ``BlockingTransaction``, async graphs with the ``AsyncConnection``). The rows are
counted in the database itself, from outside the run."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("langgraph", reason="the langgraph extra is not installed: pip install 'tenxgraph[langgraph]'")

from langchain_core.messages import AIMessage, HumanMessage, ToolMessage
from langchain_core.tools import tool
from langgraph.checkpoint.memory import InMemorySaver

from tenxgraph.core import crashpoints
from tenxgraph.integrations.langgraph import ReplaySafeToolNode, current_transaction, resume
from tenxgraph.integrations.langgraph.transaction import BlockingTransaction
from tenxgraph.storage.checkpointer import InMemoryCheckpointer, SqliteCheckpointer
from tenxgraph.utils.errors import ConfigError
from tests.bookings import BookingTable
from tests.test_langgraph import CFG, build, calls

INPUT = {"messages": [HumanMessage("refund A and B")]}
TURNS = [calls(("book", {"order_id": "A"}), ("book", {"order_id": "B"})), AIMessage("done")]
FAILING = [calls(("book", {"order_id": "boom"})), AIMessage("done")]


class Bookings(BookingTable):
    """The bookings table, and the tool that writes it."""

    def write(self, tx: Any, order_id: str) -> str:
        """The tool's body on a sync transaction (``sqlite3.Connection`` or ``BlockingTransaction``)."""
        self.runs += 1
        self.seen.append(type(tx).__name__)
        tx.execute(f"INSERT INTO {self.table} (order_id) VALUES ({self.mark})", (order_id,))
        if order_id == "boom":
            raise ValueError("the bank said no")
        return f"booked {order_id}"

    async def awrite(self, tx: Any, order_id: str) -> str:
        """The tool's body on PostgreSQL's ``AsyncConnection`` (an async graph)."""
        self.runs += 1
        self.seen.append(type(tx).__name__)
        await tx.execute(f"INSERT INTO {self.table} (order_id) VALUES (%s)", (order_id,))
        return f"booked {order_id}"

    def tools(self, asynchronous: bool = False) -> list[Any]:
        if asynchronous:

            @tool
            async def book(order_id: str) -> str:
                """Book a refund."""
                return await self.awrite(current_transaction(), order_id)

            return [book]

        @tool
        def book(order_id: str) -> str:  # type: ignore[no-redef]
            """Book a refund."""
            return self.write(current_transaction(), order_id)

        return [book]


def node(tools: list[Any], ledger: Any) -> ReplaySafeToolNode:
    return ReplaySafeToolNode(tools, ledger=ledger, effects={"book": "transactional"})


@pytest.fixture(params=["sqlite", "postgres"])
def ledger(request: pytest.FixtureRequest, tmp_path: Path) -> Any:
    if request.param == "postgres":
        return request.getfixturevalue("pg_checkpointer")
    cp = SqliteCheckpointer(tmp_path / "ledger.db")
    request.addfinalizer(cp.close)
    return cp


@pytest.mark.parametrize("point", ["tool.before_invoke", "tool.after_return", "tool.after_record"])
def test_a_crash_leaves_the_write_and_its_record_together_and_the_resume_writes_once(point: str, ledger: Any) -> None:
    bookings, saver = Bookings(ledger), InMemorySaver()
    with crashpoints.armed(point), pytest.raises(crashpoints.CrashInjected):
        build(node(bookings.tools(), ledger), saver, TURNS).invoke(INPUT, CFG, durability="sync")
    left = bookings.count()
    # before its return the first call wrote nothing that stayed; at its record both calls may have committed
    assert all(n == 1 for n in left.values()), left
    if point != "tool.after_record":
        assert len(left) <= 1, left  # the crashed call's row rolled back with its record
    app = build(node(bookings.tools(), ledger), saver, TURNS)
    result = resume(app, INPUT, CFG, durability="sync")
    assert result["messages"][-1].content == "done"
    assert bookings.count() == {"A": 1, "B": 1}  # every write once, whatever the crash
    assert {m.content for m in result["messages"] if isinstance(m, ToolMessage)} == {"booked A", "booked B"}
    expected = "Connection" if not bookings.pg else "BlockingTransaction"
    assert set(bookings.seen) == {expected}, bookings.seen


def test_a_tool_that_raises_rolls_its_writes_back_and_its_error_is_recorded(ledger: Any) -> None:
    bookings, saver = Bookings(ledger), InMemorySaver()
    result = build(node(bookings.tools(), ledger), saver, FAILING).invoke(INPUT, CFG, durability="sync")
    answer = next(m for m in result["messages"] if isinstance(m, ToolMessage))
    assert answer.status == "error" and "the bank said no" in str(answer.content)
    assert bookings.count().get("boom", 0) == 0  # its row rolled back with it
    assert bookings.runs == 1


def test_an_async_graph_on_postgresql_gets_the_async_connection(request: pytest.FixtureRequest) -> None:
    ledger = request.getfixturevalue("pg_checkpointer")
    bookings, saver = Bookings(ledger), InMemorySaver()

    async def scenario() -> dict[str, Any]:
        with crashpoints.armed("tool.after_return", hit=2), pytest.raises(crashpoints.CrashInjected):
            app = build(node(bookings.tools(asynchronous=True), ledger), saver, TURNS)
            await app.ainvoke(INPUT, CFG, durability="sync")
        app = build(node(bookings.tools(asynchronous=True), ledger), saver, TURNS)
        try:
            result: dict[str, Any] = await app.ainvoke(None, CFG, durability="sync")
        finally:
            await ledger.aclose()  # in the loop that opened its pool; the fixture's close has nothing left
        return result

    result = asyncio.run(scenario())
    assert result["messages"][-1].content == "done"
    assert bookings.count() == {"A": 1, "B": 1}
    assert set(bookings.seen) == {"AsyncConnection"}, bookings.seen


def test_the_blocking_transaction_runs_statements_on_the_connections_loop(request: pytest.FixtureRequest) -> None:
    ledger = request.getfixturevalue("pg_checkpointer")
    import psycopg

    async def scenario() -> tuple[Any, Any, int]:
        conn = await psycopg.AsyncConnection.connect(ledger.postgres_dsn, autocommit=True)
        try:
            blocking = BlockingTransaction(conn, asyncio.get_running_loop())

            def body() -> tuple[Any, Any, int]:
                cur = blocking.execute("SELECT %s::int + 1", (41,))
                many = blocking.execute("SELECT generate_series(1, 3)")
                return cur.fetchone(), many.fetchall(), many.rowcount

            return await asyncio.to_thread(body)
        finally:
            await conn.close()

    one, many, count = asyncio.run(scenario())
    assert one == (42,) and many == [(1,), (2,), (3,)] and count == 3


def test_sqlite_refuses_an_async_graph_naming_what_to_do(tmp_path: Path) -> None:
    ledger = SqliteCheckpointer(tmp_path / "ledger.db")
    bookings = Bookings(ledger)
    app = build(node(bookings.tools(), ledger), InMemorySaver(), TURNS)
    with pytest.raises(ConfigError, match="run the graph with invoke or stream"):
        asyncio.run(app.ainvoke(INPUT, CFG, durability="sync"))
    assert bookings.runs == 0 and bookings.count() == {}
    ledger.close()


def test_a_ledger_without_transactions_is_refused_at_construction() -> None:
    @tool
    def book(order_id: str) -> str:
        """Book a refund."""
        return order_id

    with pytest.raises(ConfigError, match="InMemoryCheckpointer ledger does not run"):
        node([book], InMemoryCheckpointer())


def test_current_transaction_outside_a_transactional_call_says_where_it_is_open() -> None:
    with pytest.raises(RuntimeError, match="effect='transactional'"):
        current_transaction()
