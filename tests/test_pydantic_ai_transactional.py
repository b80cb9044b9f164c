"""A Pydantic AI tool with ``effect="transactional"`` under LedgerDurability: its writes to the ledger's database
commit with its record, so a crash anywhere leaves both or neither and the resumed run writes once. SQLite (the
body gets the ``sqlite3.Connection``) and PostgreSQL (a plain function gets a ``BlockingTransaction``, an
``async def`` a ``LoopTransaction``: Pydantic AI runs the body on its loop, the ledger's connection lives on
another). The rows are counted in the database itself, from outside the run."""

from __future__ import annotations

import asyncio
import json
import threading
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("pydantic_ai.durable_exec")

from pydantic_ai import Agent, ApprovalRequired, DeferredToolRequests, DeferredToolResults, RunContext
from pydantic_ai.messages import ModelMessage, ModelResponse, TextPart, ToolCallPart, ToolReturnPart
from pydantic_ai.models.function import AgentInfo, FunctionModel

from tenxgraph.core import crashpoints
from tenxgraph.integrations.pydantic_ai import LedgerDurability, current_transaction, resume_once
from tenxgraph.storage.checkpointer import InMemoryCheckpointer, SqliteCheckpointer
from tenxgraph.utils.errors import ConfigError, TransactionEndedError
from tenxgraph.utils.sync import run_sync
from tests.bookings import BookingTable

PROMPT = "refund A and B"


def model(messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
    """Books A and B at once, then says what they returned."""
    returns = sorted(str(p.content) for m in messages for p in m.parts if isinstance(p, ToolReturnPart))
    if returns:
        return ModelResponse(parts=[TextPart("; ".join(returns))])
    return ModelResponse(parts=[ToolCallPart("book", {"order_id": "A"}), ToolCallPart("book", {"order_id": "B"})])


class Bookings(BookingTable):
    """The bookings table, and the tool that writes it."""

    def agent(
        self, ledger: Any, asynchronous: bool = False, approval: bool = False, turns: Any = model
    ) -> Agent[None, Any]:
        """The agent over *ledger* (a new object over the same database: another process's view), its model
        answering with *turns*."""
        durability = LedgerDurability(ledger, name="bookings", effects={"book": "transactional"})
        output: Any = [str, DeferredToolRequests] if approval else str
        agent: Agent[None, Any] = Agent(FunctionModel(turns), capabilities=[durability], output_type=output)
        insert = f"INSERT INTO {self.table} (order_id) VALUES ({self.mark})"

        def start(ctx: RunContext[None], order_id: str) -> Any:
            if approval and not ctx.tool_call_approved:
                raise ApprovalRequired()
            self.runs += 1
            tx = current_transaction()
            self.seen.append(type(tx).__name__)
            return tx

        if asynchronous:

            @agent.tool
            async def book(ctx: RunContext[None], order_id: str) -> str:
                """Book a refund."""
                tx = start(ctx, order_id)
                if self.pg:
                    await tx.execute(insert, (order_id,))
                else:
                    tx.execute(insert, (order_id,))
                return finish(order_id)

        else:

            @agent.tool
            def book(ctx: RunContext[None], order_id: str) -> str:  # type: ignore[no-redef]
                """Book a refund."""
                start(ctx, order_id).execute(insert, (order_id,))
                return finish(order_id)

        def finish(order_id: str) -> str:
            if order_id == "boom":
                raise ValueError("the bank said no")
            return f"booked {order_id}"

        return agent


@pytest.fixture(params=["sqlite", "postgres"])
def ledger(request: pytest.FixtureRequest, tmp_path: Path) -> Any:
    if request.param == "postgres":
        return request.getfixturevalue("pg_checkpointer")
    cp = SqliteCheckpointer(tmp_path / "ledger.db")
    request.addfinalizer(cp.close)
    return cp


def reopened(ledger: Any) -> Any:
    """Another object over *ledger*'s database (SQLite), or the same one (PostgreSQL: the fixture's schema)."""
    return SqliteCheckpointer(ledger.path) if isinstance(ledger, SqliteCheckpointer) else ledger


@pytest.mark.parametrize("asynchronous", [False, True], ids=["plain", "async"])
@pytest.mark.parametrize("point", ["tool.before_invoke", "tool.after_return", "tool.after_record"])
def test_a_crash_leaves_the_write_and_its_record_together_and_the_resume_writes_once(
    point: str, asynchronous: bool, ledger: Any
) -> None:
    bookings = Bookings(ledger)
    with crashpoints.armed(point), pytest.raises(crashpoints.CrashInjected):
        bookings.agent(ledger, asynchronous).run_sync(PROMPT, run_id="r1")
    left = bookings.count()
    assert all(n == 1 for n in left.values()), left
    if point != "tool.after_record":
        assert len(left) <= 1, left  # the crashed call's row rolled back with its record
    result = bookings.agent(reopened(ledger), asynchronous).run_sync(PROMPT, run_id="r1")
    assert result.output == "booked A; booked B"
    assert bookings.count() == {"A": 1, "B": 1}  # every write once, whatever the crash
    views = {"Connection"} if not bookings.pg else {"LoopTransaction" if asynchronous else "BlockingTransaction"}
    assert set(bookings.seen) == views, bookings.seen


def test_a_tool_that_raises_rolls_its_writes_back_and_its_failure_is_recorded(ledger: Any) -> None:
    bookings = Bookings(ledger)

    def boom(messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
        if len(messages) > 1:  # (told how the call went)
            return ModelResponse(parts=[TextPart(f"told: {messages[-1].parts!r}")])
        return ModelResponse(parts=[ToolCallPart("book", {"order_id": "boom"})])

    with pytest.raises(ValueError, match="the bank said no"):
        bookings.agent(ledger, turns=boom).run_sync(PROMPT, run_id="r2")
    assert bookings.count().get("boom", 0) == 0  # its row rolled back with it
    again = bookings.agent(reopened(ledger), turns=boom).run_sync(PROMPT, run_id="r2")
    assert "the bank said no" in again.output  # (recorded as failed: the resumed run tells the model)
    assert bookings.runs == 1 and bookings.count().get("boom", 0) == 0


def test_an_approved_transactional_body_runs_once_and_its_pause_writes_nothing(ledger: Any) -> None:
    """The body raises ``ApprovalRequired`` inside its transaction: it rolls back, unrecorded; the approval, sent
    twice, runs the body once and writes once."""
    bookings = Bookings(ledger)
    paused = bookings.agent(ledger, approval=True).run_sync(PROMPT, run_id="r3")
    assert isinstance(paused.output, DeferredToolRequests) and len(paused.output.approvals) == 2
    assert bookings.count() == {} and bookings.runs == 0
    answers = DeferredToolResults(approvals={c.tool_call_id: True for c in paused.output.approvals})
    history = paused.all_messages()
    first = resume_once(bookings.agent(reopened(ledger), approval=True), answers, message_history=history)
    again = resume_once(bookings.agent(reopened(ledger), approval=True), answers, message_history=history)
    assert first.output == again.output == "booked A; booked B"
    assert bookings.count() == {"A": 1, "B": 1} and bookings.runs == 2


def test_an_async_run_on_postgresql_writes_through_the_ledgers_loop(request: pytest.FixtureRequest) -> None:
    """``agent.run`` on the caller's loop, the ledger's connection on the sync wrappers' loop: the body's
    statements go there and back, and the crash in between still leaves the write and its record together."""
    ledger = request.getfixturevalue("pg_checkpointer")
    bookings = Bookings(ledger)

    async def scenario() -> Any:
        with crashpoints.armed("tool.after_return", hit=2), pytest.raises(crashpoints.CrashInjected):
            await bookings.agent(ledger, asynchronous=True).run(PROMPT, run_id="r4")
        return await bookings.agent(ledger, asynchronous=True).run(PROMPT, run_id="r4")

    assert asyncio.run(scenario()).output == "booked A; booked B"
    assert bookings.count() == {"A": 1, "B": 1}
    assert set(bookings.seen) == {"LoopTransaction"}


def test_a_statement_after_the_transaction_ended_is_refused_not_written_outside_it(
    request: pytest.FixtureRequest,
) -> None:
    """The run is cancelled while the body's thread is between two statements (Pydantic AI cannot stop a plain
    function's thread): the transaction rolls back, and the thread's next statement is refused with
    TransactionEndedError, not run on the connection outside any transaction (where it would commit alone)."""
    ledger = request.getfixturevalue("pg_checkpointer")
    bookings = Bookings(ledger)
    wrote_first, go_on, done = threading.Event(), threading.Event(), threading.Event()
    seen: list[BaseException] = []
    agent: Agent[None, Any] = Agent(
        FunctionModel(model), capabilities=[LedgerDurability(ledger, name="slow", effects={"book": "transactional"})]
    )

    @agent.tool_plain
    def book(order_id: str) -> str:
        tx = current_transaction()
        try:
            tx.execute(f"INSERT INTO {bookings.table} (order_id) VALUES (%s)", (order_id + "-1",))
            wrote_first.set()
            go_on.wait(10)
            tx.execute(f"INSERT INTO {bookings.table} (order_id) VALUES (%s)", (order_id + "-2",))
        except BaseException as exc:
            seen.append(exc)
            raise
        finally:
            done.set()
        return "booked"

    async def cancelled() -> None:  # (on the ledger's own loop: the run's cancel reaches the transaction)
        run = asyncio.ensure_future(agent.run("book C", model=None, run_id="r5"))
        await asyncio.to_thread(wrote_first.wait, 10)
        run.cancel()
        with pytest.raises(asyncio.CancelledError):
            await run

    run_sync(cancelled())
    go_on.set()
    assert done.wait(10)
    assert [type(e) for e in seen] == [TransactionEndedError], seen
    assert bookings.count() == {}  # neither the first row (rolled back) nor the second (refused)


def test_a_ledger_without_transactions_is_refused_naming_the_fix() -> None:
    with pytest.raises(ConfigError, match="InMemoryCheckpointer ledger does not run: use SqliteCheckpointer"):
        LedgerDurability(InMemoryCheckpointer(), name="x", effects={"book": "transactional"})
    declared = LedgerDurability(InMemoryCheckpointer(), name="x")
    with pytest.raises(ConfigError, match="'book': effect='transactional'"):  # (said in the tool's metadata)
        declared.policy_of("book", {"effect": "transactional"})


def test_current_transaction_outside_a_transactional_body_says_where_it_is_open() -> None:
    with pytest.raises(RuntimeError, match="open only in the body of a tool declared effect='transactional'"):
        current_transaction()


pytest_plugins = ["pytester"]
ROOT = Path(__file__).resolve().parents[1]
#: The support agent's transactional refund under the crash matrix (SQLite), as examples/pydantic_ai_support
#: runs it; the effect is counted in the ledger's database, outside the run.
MATRIX = """
import pytest
from examples.pydantic_ai_support.agent import FINAL, build_agent

@pytest.mark.crash_matrix(framework="pydantic_ai", backends="sqlite")
def test_refund(crash_run, effects):
    book = lambda tx, payload: effects.apply_in(tx, "refund", payload)["effect_id"]
    agent = build_agent(effects, ledger=crash_run.checkpointer, book_refund=book)
    assert crash_run.invoke(agent, {"user_prompt": "Please refund order A-1042."}).final_text == FINAL
    assert effects.count("refund", thread_id=crash_run.thread_id) == 1
"""
#: The mutant: the body's writes and the call's record in two transactions (the body on a connection of its own
#: that commits each write at once, the record after it returns), as an engine that journals a step after it ran.
TWO_TRANSACTIONS = """
import asyncio, sqlite3
import tenxgraph.integrations.pydantic_ai.home_loop as h

async def atransact(self, thread_id, key, work):
    conn = sqlite3.connect(self.store.path, isolation_level=None, check_same_thread=False)
    try:
        record = await asyncio.to_thread(work, conn)
    finally:
        conn.close()
    return record, await self.aput_tool_result(thread_id, key, record)

h.HomeLoopLedger.atransact = atransact
"""


def run_matrix(pytester: pytest.Pytester, *args: str) -> list[dict[str, Any]]:
    pytester.makepyfile(test_refund=MATRIX)
    pytester.runpytest_subprocess("-p", "no:cacheprovider", "--crash-matrix", "--crash-backends=sqlite",
                                  "--crash-report=m.json", *args)  # fmt: skip
    cells: list[dict[str, Any]] = json.loads((pytester.path / "m.json").read_text())["cells"]
    return cells


def test_the_matrix_finds_the_transactional_refund_exactly_once(
    pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Killed in-process and by SIGKILL at every point, and resumed: no cell fails, and the refund is made once
    in each (the test asserts it)."""
    monkeypatch.setenv("PYTHONPATH", str(ROOT))
    cells = run_matrix(pytester, "--crash-modes=inprocess,sigkill")
    assert cells and {c["outcome"] for c in cells} <= {"protected", "exactly_once", "known_gap", "in_doubt_handled"}, (
        cells
    )
    assert {"tool.in_flight", "tool.after_return", "tool.after_record"} <= {c["point"] for c in cells}


def test_writes_committed_apart_from_their_record_are_caught(
    pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The mutant commits the refund's row before its record: killed in between, the resume refunds again, and
    the verdict names the refund's second effect."""
    monkeypatch.setenv("PYTHONPATH", str(ROOT))
    pytester.makeconftest(TWO_TRANSACTIONS)
    cells = run_matrix(pytester, "--crash-modes=inprocess", "--crash-points=tool.in_flight,tool.after_return")
    failing = [c for c in cells if c["outcome"] == "violation"]
    assert failing, cells
    assert all("refund" in str(c.get("detail")) for c in failing), [c.get("detail") for c in failing]
