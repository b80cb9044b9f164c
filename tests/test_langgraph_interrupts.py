"""LangGraph's ``interrupt()`` consumed once under ReplaySafeToolNode: k processes resume one parked pause at once
(LangGraph's real SqliteSaver and PostgresSaver, our SQLite and PostgreSQL ledgers), and the refund runs once; a
different answer is refused, and the stored tool message, the ledger and the effect (counted outside the runtime)
agree. LangGraph's bare ToolNode, the control, refunds k times. Approvals declared on a LangGraph tool get the
same, through LangGraph's own ``interrupt()``."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("langgraph", reason="the langgraph extra is not installed: pip install 'tenxgraph[langgraph]'")

from langchain_core.messages import AIMessage, HumanMessage
from langchain_core.tools import tool
from langgraph.checkpoint.memory import InMemorySaver
from langgraph.graph import MessagesState, StateGraph
from langgraph.prebuilt import tools_condition
from langgraph.types import Command

from pytest_replaysafe.matrix import services
from tenxgraph.integrations.langgraph import ReplaySafeToolNode
from tenxgraph.storage.checkpointer import InMemoryCheckpointer
from tenxgraph.utils.errors import ConfigError
from tests import langgraph_resumers as resumers

WORKER = Path(resumers.__file__)


@pytest.fixture(params=["sqlite", "postgres"])
def where(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[dict[str, Any]]:
    """Where one test's ledger and LangGraph's saver live: SQLite files, or two schemas of its own."""
    if request.param == "sqlite":
        yield {"where": str(tmp_path)}
        return
    dsn, schema = request.getfixturevalue("pg_dsn"), request.getfixturevalue("pg_schema")
    yield {"where": str(tmp_path), "dsn": dsn, "schema": schema, "lg_schema": f"{schema}_lg"}
    services.drop_schema(dsn, f"{schema}_lg")


def resume_at_once(spec: dict[str, Any], answers: list[Any]) -> list[dict[str, Any]]:
    """One process per answer, each resuming the parked thread with it, released together."""
    where = Path(spec["where"])
    go = where / "go"
    procs = []
    for n, answer in enumerate(answers):
        mine = {**spec, "answer": answer, "ready": str(where / f"ready-{n}"), "go": str(go)}
        procs.append(
            subprocess.Popen([sys.executable, str(WORKER), json.dumps(mine)], stdout=subprocess.PIPE, text=True)
        )
    deadline = time.monotonic() + 120
    while not all((where / f"ready-{n}").exists() for n in range(len(answers))):
        assert time.monotonic() < deadline and all(p.poll() is None for p in procs), "a resumer did not start"
        time.sleep(0.01)
    go.touch()
    outs = [p.communicate(timeout=120)[0] for p in procs]
    assert [p.returncode for p in procs] == [0] * len(procs), outs
    return [json.loads(out.strip().splitlines()[-1]) for out in outs]


@pytest.mark.parametrize("ask", ["interrupt", "approval"])
def test_k_resumers_of_one_pause_refund_once_and_all_see_the_same_message(where: dict[str, Any], ask: str) -> None:
    spec = {**where, "node": "wrapped", "ask": ask}
    first = resumers.setup(spec)
    question = first["__interrupt__"][0].value
    assert question == "refund A-7?" if ask == "interrupt" else question["kind"] == "approval"
    yes = "yes" if ask == "interrupt" else True
    outcomes = resume_at_once(spec, [yes] * 4)
    assert resumers.effects(Path(spec["where"])) == [resumers.effects(Path(spec["where"]))[0]]  # one refund
    assert outcomes == [{"tool": ["refunded A-7"], "status": ["success"]}] * 4
    messages, records = resumers.final_state(spec)
    call = [r for r in records.values() if r["kind"] != "decision"]
    assert [m.content for m in messages if m.type == "tool"] == ["refunded A-7"] == [r["output"] for r in call]
    assert [r["value"] for r in records.values() if r["kind"] == "decision"] == [yes]


def test_a_bare_toolnode_refunds_once_per_resumer(where: dict[str, Any]) -> None:
    """The control: LangGraph alone runs the resumed step in every process that resumes it."""
    spec = {**where, "node": "bare", "ask": "interrupt"}
    resumers.setup(spec)
    outcomes = resume_at_once(spec, ["yes"] * 4)
    assert len(resumers.effects(Path(spec["where"]))) == 4
    assert outcomes == [{"tool": ["refunded A-7"], "status": ["success"]}] * 4


def test_conflicting_answers_one_stands_and_the_others_are_told(where: dict[str, Any]) -> None:
    spec = {**where, "node": "wrapped", "ask": "interrupt"}
    resumers.setup(spec)
    outcomes = resume_at_once(spec, ["yes", "no", "yes", "no"])
    messages, records = resumers.final_state(spec)
    (standing,) = [r["value"] for r in records.values() if r["kind"] == "decision"]
    refunds = resumers.effects(Path(spec["where"]))
    assert len(refunds) == (1 if standing == "yes" else 0)  # the effect matches the recorded decision
    content = "refunded A-7" if standing == "yes" else "not refunded A-7: no"
    (call,) = [r for r in records.values() if r["kind"] != "decision"]
    assert [m.content for m in messages if m.type == "tool"] == [content] == [call["output"]]
    for answer, outcome in zip(["yes", "no", "yes", "no"], outcomes, strict=True):
        if answer == standing:
            assert outcome == {"tool": [content], "status": ["success"]}
        else:  # told what stands, nothing ran for it
            assert outcome["raised"] == "InterruptDecidedError" and repr(standing) in outcome["message"]


def test_resumers_each_run_the_rest_of_the_thread_unless_they_resume_once(where: dict[str, Any]) -> None:
    """Past the paused step, LangGraph runs the rest of the thread in every resumer: a model turn after the refund
    asks for a receipt in each, with a new message id each (new calls to the ledger: 4 receipts). Through
    ``resume_once`` one resumer runs it, and the others get the thread as it stands."""
    spec = {**where, "node": "wrapped", "ask": "approval", "after": "receipt"}
    resumers.setup(spec)
    resume_at_once(spec, [True] * 4)
    sent = [line.split()[0] for line in resumers.effects(Path(spec["where"]))]
    assert sorted(sent) == ["receipt"] * 4 + ["refund"]

    spec = {**where, "where": str(Path(where["where"]) / "once"), "via": "resume_once", "node": "wrapped",
            "ask": "approval", "after": "receipt"}  # fmt: skip
    if spec.get("dsn"):  # (a thread of its own in the same schemas)
        spec["lg_schema"] = f"{spec['schema']}_lg"
    Path(spec["where"]).mkdir()
    _fresh(spec)
    resumers.setup(spec)
    outcomes = resume_at_once(spec, [True] * 4)
    assert sorted(line.split()[0] for line in resumers.effects(Path(spec["where"]))) == ["receipt", "refund"]
    assert outcomes == [{"tool": ["refunded A-7", "receipt sent for A-7"], "status": ["success"] * 2}] * 4


def test_resume_once_keeps_one_answer_and_tells_the_others(where: dict[str, Any]) -> None:
    spec = {**where, "node": "wrapped", "ask": "approval", "via": "resume_once"}
    resumers.setup(spec)
    outcomes = resume_at_once(spec, [True, "no", True, "no"])
    refunds = resumers.effects(Path(spec["where"]))
    told = [o for o in outcomes if "raised" in o]
    assert len(told) == 2 and {o["raised"] for o in told} == {"InterruptDecidedError"}
    ran = [o for o in outcomes if "tool" in o]
    (content,) = {o["tool"][0] for o in ran}
    assert len(refunds) == (1 if content == "refunded A-7" else 0)  # the effect matches the answer that stands


def test_resume_once_wants_the_ids_it_answers() -> None:
    from tenxgraph.integrations.langgraph import resume_once

    with pytest.raises(ConfigError, match=r"Command\(resume=\{interrupt_id: answer"):
        resume_once(object(), Command(resume=True), {"configurable": {"thread_id": "t"}},
                    ledger=InMemoryCheckpointer())  # fmt: skip


def _fresh(spec: dict[str, Any]) -> None:
    """Drop the PostgreSQL thread an earlier part of a test left (its ledger schema and LangGraph's)."""
    if spec.get("dsn"):
        import psycopg

        with psycopg.connect(spec["dsn"], autocommit=True) as conn:
            for table in ("checkpoints", "checkpoint_writes", "checkpoint_blobs"):
                conn.execute(f'DELETE FROM "{spec["lg_schema"]}".{table}')
            conn.execute(f'DELETE FROM "{spec["schema"]}".tool_executions')


def test_each_broken_consume_once_is_caught_for_its_own_reason(tmp_path: Path) -> None:
    """Mutants of pauses.py in the resumers' processes (SQLite): without the call lock the refund runs in every
    resumer; with the answers unrecorded a different answer is not refused, and its resumer is handed a result
    its answer did not make."""
    spec = {"where": str(tmp_path / "lock"), "node": "wrapped", "ask": "interrupt", "mutant": "no_call_lock"}
    Path(spec["where"]).mkdir()
    resumers.setup(spec)
    resume_at_once(spec, ["yes"] * 4)
    assert len(resumers.effects(Path(spec["where"]))) > 1  # caught: the refund ran again

    spec = {**spec, "where": str(tmp_path / "answers"), "mutant": "answers_unrecorded"}
    Path(spec["where"]).mkdir()
    resumers.setup(spec)
    outcomes = resume_at_once(spec, ["yes", "no", "yes", "no"])
    assert not any("raised" in o for o in outcomes)  # caught: nobody was told another answer stands
    assert len({o["tool"][0] for o in outcomes}) == 1  # (every resumer got the first one's result)


# -- approvals declared on a LangGraph tool, in one process --------------------------------------------------------
class Desk:
    """A refund declared ``approval`` (on the node, or in the tool's metadata), on LangGraph's InMemorySaver."""

    def __init__(self, how: str = "node", rule: Any = True) -> None:
        self.refunds: list[str] = []
        self.ledger = InMemoryCheckpointer()

        @tool
        def refund_order(order_id: str, amount: int) -> str:
            """Refund an order."""
            self.refunds.append(order_id)
            return f"refunded {order_id}"

        if how == "metadata":
            refund_order.metadata = {"approval": rule}
        approvals = {"refund_order": rule} if how == "node" else None

        def model(state: MessagesState) -> dict[str, Any]:
            if any(m.type == "tool" for m in state["messages"]):
                return {"messages": [AIMessage("done")]}
            calls = [{"name": "refund_order", "args": {"order_id": "A", "amount": 50}, "id": "c1"},
                     {"name": "refund_order", "args": {"order_id": "B", "amount": 500}, "id": "c2"}]  # fmt: skip
            return {"messages": [AIMessage("", tool_calls=calls[: 1 if rule is True else 2], id="ai-1")]}

        graph = StateGraph(MessagesState)
        graph.add_node("agent", model)
        graph.add_node("tools", ReplaySafeToolNode([refund_order], ledger=self.ledger, approvals=approvals))
        graph.set_entry_point("agent")
        graph.add_conditional_edges("agent", tools_condition)
        graph.add_edge("tools", "agent")
        self.app = graph.compile(checkpointer=InMemorySaver())
        self.cfg = {"configurable": {"thread_id": "desk"}}

    def start(self) -> dict[str, Any]:
        return dict(self.app.invoke({"messages": [HumanMessage("refund")]}, self.cfg, durability="sync"))

    def answer(self, value: Any) -> dict[str, Any]:
        return dict(self.app.invoke(Command(resume=value), self.cfg, durability="sync"))


def tool_texts(result: dict[str, Any]) -> list[str]:
    return [m.content for m in result["messages"] if m.type == "tool"]


@pytest.mark.parametrize("how", ["node", "metadata"])
def test_an_approved_call_runs_once_a_rejected_one_never(how: str) -> None:
    desk = Desk(how)
    first = desk.start()
    (pause,) = first["__interrupt__"]
    assert pause.value == {"kind": "approval", "tool": "refund_order", "args": {"amount": 50, "order_id": "A"},
                           "tool_call_id": "c1"} and desk.refunds == []  # fmt: skip
    assert tool_texts(desk.answer(True)) == ["refunded A"] and desk.refunds == ["A"]

    rejected = Desk(how)
    rejected.start()
    text = tool_texts(rejected.answer("not without a receipt"))
    assert text == ["the call to 'refund_order' was rejected by a person and did not run: not without a receipt"]
    assert rejected.refunds == [] and len(rejected.ledger.list_tool_results("desk")) == 2  # its answer, its result


def test_an_approval_predicate_asks_only_for_the_calls_it_names() -> None:
    desk = Desk("node", rule=lambda args: args["amount"] > 100)
    first = desk.start()
    assert [p.value["args"]["order_id"] for p in first["__interrupt__"]] == ["B"] and desk.refunds == ["A"]
    assert tool_texts(desk.answer(True)) == ["refunded A", "refunded B"] and desk.refunds == ["A", "B"]


def test_an_approval_answer_that_is_not_one_is_refused_and_nothing_is_recorded() -> None:
    desk = Desk()
    desk.start()
    with pytest.raises(ConfigError, match="takes Command\\(resume=True\\)"):
        desk.answer({"type": "approve"})
    assert desk.refunds == [] and desk.ledger.list_tool_results("desk") == {}
    assert tool_texts(desk.answer(True)) == ["refunded A"]


def test_a_bad_approval_rule_is_refused_when_the_node_is_built() -> None:
    with pytest.raises(ConfigError, match="'refund_order': approval='yes' is not a rule"):
        Desk("node", rule="yes")


def test_approvals_in_an_async_graph() -> None:
    desk = Desk()

    async def go() -> list[str]:
        first = await desk.app.ainvoke({"messages": [HumanMessage("refund")]}, desk.cfg, durability="sync")
        assert first["__interrupt__"][0].value["kind"] == "approval" and desk.refunds == []
        return tool_texts(await desk.app.ainvoke(Command(resume=True), desk.cfg, durability="sync"))

    assert asyncio.run(go()) == ["refunded A"] and desk.refunds == ["A"]


def test_a_resumed_step_of_more_calls_than_the_pool_has_connections_finishes(pg_dsn: str, pg_schema: str) -> None:
    """14 approved calls of one step (an async graph: all at once) on PostgreSQL's pool of 10: one lock per step
    and process, not one pool connection per call held while each waits to record (that stalled the pool)."""
    from tenxgraph.storage.checkpointer.pg import PgCheckpointer

    refunds: list[str] = []
    ledger = PgCheckpointer(postgres_dsn=pg_dsn, schema=pg_schema, max_pool_size=10)

    @tool
    async def refund_order(order_id: str) -> str:
        """Refund an order."""
        await asyncio.sleep(0.05)
        refunds.append(order_id)
        return f"refunded {order_id}"

    async def model(state: MessagesState) -> dict[str, Any]:
        if any(m.type == "tool" for m in state["messages"]):
            return {"messages": [AIMessage("done")]}
        calls = [{"name": "refund_order", "args": {"order_id": str(i)}, "id": f"c{i}"} for i in range(14)]
        return {"messages": [AIMessage("", tool_calls=calls, id="ai-1")]}

    graph = StateGraph(MessagesState)
    graph.add_node("agent", model)
    node = ReplaySafeToolNode([refund_order], ledger=ledger, approvals={"refund_order": True})
    graph.add_node("tools", node)
    graph.set_entry_point("agent")
    graph.add_conditional_edges("agent", tools_condition)
    graph.add_edge("tools", "agent")
    app = graph.compile(checkpointer=InMemorySaver())
    cfg = {"configurable": {"thread_id": "many"}}

    async def go() -> dict[str, Any]:
        result = await app.ainvoke({"messages": [HumanMessage("refund all")]}, cfg, durability="sync")
        for _ in range(20):  # (LangGraph shows a step's pauses a few at a time)
            if not result.get("__interrupt__"):
                break
            answers = {i.id: True for i in result["__interrupt__"]}
            result = await app.ainvoke(Command(resume=answers), cfg, durability="sync")
        await ledger.aclose()  # (its pool lives on this loop)
        return dict(result)

    result = asyncio.run(go())
    assert result["messages"][-1].content == "done"
    assert sorted(refunds, key=int) == [str(i) for i in range(14)]  # each once
