"""Approvals and interrupt(): a call that waits for a person runs once when approved and never when rejected; the
pause and the decision are durable on every backend; one decision per interrupt, ever."""

from __future__ import annotations

import contextlib
import threading
from datetime import timedelta
from typing import Any

import pytest

from tenxgraph import (
    END,
    AgentState,
    ConfigError,
    GraphInterrupt,
    InterruptDecidedError,
    Message,
    ReactAgent,
    Reply,
    Resume,
    ScriptedModel,
    StateGraph,
    ToolCallBlock,
    interrupt,
    tool,
)
from tenxgraph.core import crashpoints
from tenxgraph.core.crashpoints import CrashInjected
from tenxgraph.core.graph.utils.invoke_node_handler import invoke_tool_calls
from tenxgraph.core.tools.interrupts import Pauses, approval_id, decision_key
from tenxgraph.server.recovery import Recovery
from tenxgraph.storage.checkpointer import BaseCheckpointer
from tenxgraph.utils.sync import run_sync

GO = {"messages": [Message.text_message("refund them", message_id="req-1")]}


class Ledger:
    """What the refund tool did, in order."""

    def __init__(self) -> None:
        self.runs: list[tuple[str, float]] = []


def agent(cp: BaseCheckpointer, ran: Ledger, calls: list[tuple[str, float]], limit: float = 100.0) -> Any:
    @tool(approval=lambda args: args["amount"] > limit)
    def refund_order(order_id: str, amount: float) -> str:
        """Refund an amount on an order."""
        ran.runs.append((order_id, amount))
        return f"refunded {amount:.2f} on {order_id}"

    replies = [Reply(tool_calls=[("refund_order", {"order_id": o, "amount": a}) for o, a in calls]), "Done."]
    return ReactAgent(ScriptedModel(replies), tools=[refund_order]).compile(checkpointer=cp)


def cfg(thread: str = "t", **more: Any) -> dict[str, Any]:
    return {"thread_id": thread, **more}


def test_an_approved_call_runs_once_and_a_repeated_resume_changes_nothing(checkpointer: BaseCheckpointer) -> None:
    ran = Ledger()
    paused = agent(checkpointer, ran, [("1042", 250.0)]).invoke(GO, cfg())
    assert paused.status == "interrupted" and ran.runs == []
    (waits,) = paused.interrupts
    assert (waits.kind, waits.tool, waits.args, waits.call_id) == ("approval", "refund_order", {"order_id": "1042",
            "amount": 250.0}, "call_1")  # fmt: skip
    assert waits.message_id == paused.messages[-1].message_id and waits.value == {"tool": "refund_order",
            "args": {"order_id": "1042", "amount": 250.0}}  # fmt: skip
    again = agent(checkpointer, ran, [("1042", 250.0)]).invoke(None, cfg())  # a bare resume: still waiting
    assert again.status == "interrupted" and again.version == paused.version and again.interrupts == [waits]
    done = agent(checkpointer, ran, [("1042", 250.0)]).invoke(Resume({waits.id: True}), cfg())
    assert done.status == "done" and done.final_text == "Done." and ran.runs == [("1042", 250.0)]
    assert done.messages[2].tool_results[0].output == "refunded 250.00 on 1042"
    twice = agent(checkpointer, ran, [("1042", 250.0)]).invoke(Resume({waits.id: True}), cfg())
    assert twice.version == done.version and ran.runs == [("1042", 250.0)]  # answered as the thread stands
    with pytest.raises(InterruptDecidedError, match=r"already decided \(True\); a second, different decision"):
        agent(checkpointer, ran, [("1042", 250.0)]).invoke(Resume({waits.id: False}), cfg())
    assert ran.runs == [("1042", 250.0)]
    record = checkpointer.get_tool_results("t", [decision_key(waits.id)])[decision_key(waits.id)]
    assert (record["kind"], record["value"], record["interrupt"]) == ("decision", True, waits.id)


def test_a_rejected_call_never_runs_and_the_model_is_told(checkpointer: BaseCheckpointer) -> None:
    ran = Ledger()
    paused = agent(checkpointer, ran, [("1042", 250.0), ("7", 5.0)]).invoke(GO, cfg())
    assert paused.status == "interrupted" and ran.runs == []  # the small one waits with its batch
    done = agent(checkpointer, ran, [("1042", 250.0), ("7", 5.0)]).invoke(
        Resume({paused.interrupts[0].id: "no receipt"}), cfg()
    )
    assert done.status == "done" and ran.runs == [("7", 5.0)]
    (rejected,) = done.messages[2].tool_results
    assert rejected.is_error and rejected.status == "rejected"
    assert rejected.output == "the call to 'refund_order' was rejected by a person and did not run: no receipt"
    records = checkpointer.list_tool_results("t")
    assert sorted(r.get("status", r.get("kind")) for r in records.values()) == ["decision", "rejected", "success"]
    checkpointer.delete_thread("t")


def test_pending_approvals_of_one_batch_are_decided_one_by_one(checkpointer: BaseCheckpointer) -> None:
    ran = Ledger()
    calls = [("1", 200.0), ("2", 300.0)]
    first = agent(checkpointer, ran, calls).invoke(GO, cfg())
    a, b = first.interrupts
    assert [i.args for i in (a, b)] == [{"order_id": "1", "amount": 200.0}, {"order_id": "2", "amount": 300.0}]
    half = agent(checkpointer, ran, calls).invoke(Resume({a.id: True}), cfg())
    assert half.status == "interrupted" and half.interrupts == [b] and ran.runs == []  # nothing runs until all in
    done = agent(checkpointer, ran, calls).invoke(Resume({b.id: False}), cfg())
    assert done.status == "done" and ran.runs == [("1", 200.0)]
    both = agent(checkpointer, ran, calls).invoke(Resume({a.id: True, b.id: False}), cfg())  # all again: idempotent
    assert both.version == done.version and ran.runs == [("1", 200.0)]


def test_a_resume_that_cannot_be_taken_is_refused_before_anything_is_recorded(checkpointer: BaseCheckpointer) -> None:
    ran = Ledger()
    app = agent(checkpointer, ran, [("1042", 250.0)])
    with pytest.raises(ConfigError, match=r"thread 'nobody' has no stored run to resume"):
        app.invoke(Resume({"approval-x": True}), cfg("nobody"))
    paused = app.invoke(GO, cfg())
    waits = paused.interrupts[0].id
    with pytest.raises(ConfigError, match=rf"no pending interrupt 'approval-x' \(pending: \['{waits}'\]\)"):
        app.invoke(Resume({"approval-x": True, waits: True}), cfg())
    with pytest.raises(ConfigError, match=r"takes True \(approve\), False or a reason string \(reject\), got 5"):
        app.invoke(Resume({waits: 5}), cfg())
    with pytest.raises(ConfigError, match=r"waits for a person's answer .* answer them with Resume"):
        app.invoke({"messages": ["and another thing"]}, cfg())
    with pytest.raises(ConfigError, match=r"Resume takes a non-empty dict of interrupt id -> decision"):
        Resume({})
    with pytest.raises(ConfigError, match=r"the decision for 'x' must be a JSON value"):
        Resume({"x": object()})
    assert checkpointer.get_tool_results("t", [decision_key(waits)]) == {} and ran.runs == []
    assert app.invoke(Resume({waits: True}), cfg()).status == "done" and ran.runs == [("1042", 250.0)]


def test_an_approval_covers_exactly_its_call_and_arguments() -> None:
    assert approval_id("m:call_1", {"amount": 250.0}) != approval_id("m:call_1", {"amount": 2500.0})
    assert approval_id("m:call_1", {"a": 1, "b": 2}) == approval_id("m:call_1", {"b": 2, "a": 1})
    assert approval_id("m:call_1", {"a": 1}) != approval_id("m:call_2", {"a": 1})
    ran = Ledger()

    @tool(approval=True)
    def wipe(what: str) -> str:
        """Wipe something."""
        ran.runs.append((what, 0.0))
        return "wiped"

    from tenxgraph import InMemoryCheckpointer

    message = Message.assistant("", tool_calls=[ToolCallBlock("call_1", "wipe", {"what": "db"})], message_id="m")
    other = Pauses(decisions={approval_id("m:call_1", {"what": "logs"}): True})  # approved: other arguments
    with pytest.raises(GraphInterrupt) as paused:
        run_sync(invoke_tool_calls(message, {"wipe": wipe}, InMemoryCheckpointer(), "t", pauses=other))
    assert [i.args for i in paused.value.interrupts] == [{"what": "db"}] and ran.runs == []


def test_a_crash_after_the_decision_is_finished_by_a_bare_resume(checkpointer: BaseCheckpointer) -> None:
    ran = Ledger()
    waits = agent(checkpointer, ran, [("1042", 250.0)]).invoke(GO, cfg()).interrupts[0].id
    with crashpoints.armed("approval.after_decision", 1), pytest.raises(CrashInjected):
        agent(checkpointer, ran, [("1042", 250.0)]).invoke(Resume({waits: True}), cfg())
    assert ran.runs == [] and checkpointer.get_thread("t").values["meta"]["status"] == "interrupted"  # type: ignore[union-attr]
    done = agent(checkpointer, ran, [("1042", 250.0)]).invoke(None, cfg())  # the decision is in: it goes on
    assert done.status == "done" and ran.runs == [("1042", 250.0)]


def test_a_crash_in_the_approved_call_leaves_a_running_thread_for_recovery(checkpointer: BaseCheckpointer) -> None:
    ran = Ledger()
    app = agent(checkpointer, ran, [("1042", 250.0)])
    waits = app.invoke(GO, cfg()).interrupts[0].id
    assert "t" not in checkpointer_interrupted(checkpointer)  # a thread that waits is no recovery's business
    assert run_sync(Recovery(app).recover("t")) == "gone"
    with crashpoints.armed("tool.after_record", 1), pytest.raises(CrashInjected):
        agent(checkpointer, ran, [("1042", 250.0)]).invoke(Resume({waits: True}), cfg())
    assert "t" in checkpointer_interrupted(checkpointer)  # approved and under way: recovery finishes it
    assert run_sync(Recovery(agent(checkpointer, ran, [("1042", 250.0)])).recover("t")) == "recovered"
    assert checkpointer.get_thread("t").values["meta"]["status"] == "done" and ran.runs == [("1042", 250.0)]  # type: ignore[union-attr]


def checkpointer_interrupted(checkpointer: BaseCheckpointer) -> list[str]:
    try:
        return checkpointer.list_interrupted_threads()
    except NotImplementedError:
        return []


def test_two_resumes_at_once_decide_once_and_run_the_call_once(checkpointer: BaseCheckpointer) -> None:
    ran = Ledger()
    waits = agent(checkpointer, ran, [("1042", 250.0)]).invoke(GO, cfg()).interrupts[0].id
    outcomes: list[Any] = []
    start = threading.Barrier(2)

    def click(value: Any) -> None:
        start.wait()
        try:
            result = agent(checkpointer, ran, [("1042", 250.0)]).invoke(Resume({waits: value}), cfg(lock_timeout=20))
            outcomes.append(result.status)
        except InterruptDecidedError as exc:
            outcomes.append(type(exc).__name__)

    clicks = [threading.Thread(target=click, args=(v,)) for v in (True, True)]
    for c in clicks:
        c.start()
    for c in clicks:
        c.join()
    assert outcomes == ["done", "done"] and ran.runs == [("1042", 250.0)]


def test_pruning_keeps_the_records_of_a_thread_that_waits(checkpointer: BaseCheckpointer) -> None:
    ran = Ledger()
    calls = [("1", 200.0), ("2", 300.0)]
    a = agent(checkpointer, ran, calls).invoke(GO, cfg()).interrupts[0]
    agent(checkpointer, ran, calls).invoke(Resume({a.id: "no"}), cfg())  # one decided (and kept), one waiting
    before = checkpointer.list_tool_results("t")
    assert len(before) == 1 and checkpointer.prune_tool_executions(timedelta(0)) == 0
    assert checkpointer.list_tool_results("t") == before


def graph_that_asks(cp: BaseCheckpointer, seen: list[Any]) -> Any:
    def ask(state: AgentState) -> dict[str, Any]:
        name = interrupt({"question": "your name?"})
        seen.append(name)
        city = interrupt({"question": "your city?"})
        return {"messages": [Message.assistant(f"hello {name} from {city}")]}

    g = StateGraph(AgentState)
    g.add_node("ask", ask)
    g.set_entry_point("ask")
    g.add_edge("ask", END)
    return g.compile(checkpointer=cp)


def test_interrupt_in_a_node_returns_each_answer_in_order(checkpointer: BaseCheckpointer) -> None:
    seen: list[Any] = []
    first = graph_that_asks(checkpointer, seen).invoke({"messages": ["hi"]}, cfg())
    assert first.status == "interrupted" and [i.value for i in first.interrupts] == [{"question": "your name?"}]
    assert (first.interrupts[0].kind, first.interrupts[0].node) == ("interrupt", "ask")
    second = graph_that_asks(checkpointer, seen).invoke(Resume({first.interrupts[0].id: "Ada"}), cfg())
    assert [i.value for i in second.interrupts] == [{"question": "your city?"}] and seen == ["Ada"]
    done = graph_that_asks(checkpointer, seen).invoke(Resume({second.interrupts[0].id: "London"}), cfg())
    assert done.final_text == "hello Ada from London" and seen == ["Ada", "Ada"]  # code before a pause runs again
    assert done.state.meta.interrupts == []


def test_a_paused_body_is_not_in_doubt_once_answered_but_its_next_attempt_is(
    checkpointer: BaseCheckpointer,
) -> None:
    runs: list[str] = []

    @tool(on_in_doubt="fail")
    def send(to: str) -> str:
        """Send a message after a person confirms it."""
        answer = interrupt({"confirm": to})
        runs.append(f"{to}:{answer}")
        return f"sent to {to}"

    def app() -> Any:
        model = ScriptedModel([Reply(tool_calls=[("send", {"to": "bob"})]), "ok"])
        return ReactAgent(model, tools=[send]).compile(checkpointer=checkpointer)

    asked = app().invoke(GO, cfg()).interrupts[0]
    assert asked.tool == "send" and asked.value == {"confirm": "bob"} and runs == []
    with crashpoints.armed("tool.after_return", 1), pytest.raises(CrashInjected):  # the answered attempt dies
        app().invoke(Resume({asked.id: "yes"}), cfg())
    assert runs == ["bob:yes"]
    done = app().invoke(None, cfg())  # the intent of the paused attempt says nothing; the answered one's does
    assert runs == ["bob:yes"] and done.messages[2].tool_results[0].status == "in_doubt"


def test_a_paused_body_answered_runs_once_with_its_answer(checkpointer: BaseCheckpointer) -> None:
    runs: list[str] = []

    @tool(on_in_doubt="fail")
    def send(to: str) -> str:
        """Send a message after a person confirms it."""
        runs.append(f"{to}:{interrupt({'confirm': to})}")
        return f"sent to {to}"

    app = ReactAgent(ScriptedModel([Reply(tool_calls=[("send", {"to": "bob"})]), "ok"]), tools=[send])
    graph = app.compile(checkpointer=checkpointer)
    asked = graph.invoke(GO, cfg()).interrupts[0]
    done = graph.invoke(Resume({asked.id: "yes"}), cfg())
    assert runs == ["bob:yes"] and done.messages[2].tool_results[0].output == "sent to bob"


def test_a_caught_interrupt_pauses_the_run_all_the_same(checkpointer: BaseCheckpointer) -> None:
    def sloppy(state: AgentState) -> dict[str, Any]:
        with contextlib.suppress(Exception):  # a node that catches too much
            interrupt("approve?")
        return {"messages": [Message.assistant("went on without an answer")]}

    g = StateGraph(AgentState)
    g.add_node("sloppy", sloppy)
    g.set_entry_point("sloppy")
    g.add_edge("sloppy", END)
    result = g.compile(checkpointer=checkpointer).invoke({"messages": ["hi"]}, cfg())
    assert result.status == "interrupted" and [i.value for i in result.interrupts] == ["approve?"]
    assert [m.text for m in result.messages] == ["hi"]  # what it returned without the answer is not kept


def test_interrupt_outside_a_run_and_a_bad_approval_rule_are_clear_errors() -> None:
    with pytest.raises(RuntimeError, match=r"interrupt\(\) pauses a run: call it inside a node or a tool"):
        interrupt("hello?")
    with pytest.raises(TypeError, match=r"approval='yes' is invalid; use True, False, or a predicate"):

        @tool(approval="yes")  # type: ignore[arg-type]
        def pay(amount: float) -> str:
            """Pay."""
            return "paid"


def test_an_approval_rule_that_raises_stops_the_node_with_nothing_run(checkpointer: BaseCheckpointer) -> None:
    ran = Ledger()

    @tool(approval=lambda args: args["currency"] != "EUR")  # the model sends no currency
    def refund_order(order_id: str, amount: float) -> str:
        """Refund."""
        ran.runs.append((order_id, amount))
        return "refunded"

    model = ScriptedModel([Reply(tool_calls=[("refund_order", {"order_id": "1", "amount": 5.0})]), "Done."])
    app = ReactAgent(model, tools=[refund_order]).compile(checkpointer=checkpointer)
    with pytest.raises(KeyError, match="currency"):
        app.invoke(GO, cfg())
    assert ran.runs == [] and checkpointer.get_thread("t").values["meta"]["status"] == "error"  # type: ignore[union-attr]


def test_resume_value_answers_the_one_pending_interrupt_and_only_it(checkpointer: BaseCheckpointer) -> None:
    seen: list[Any] = []
    first = graph_that_asks(checkpointer, seen).invoke({"messages": ["hi"]}, cfg())
    second = graph_that_asks(checkpointer, seen).invoke(Resume(value="Ada"), cfg())
    assert [i.value for i in second.interrupts] == [{"question": "your city?"}] and seen == ["Ada"]
    assert checkpointer.get_tool_results("t", [decision_key(first.interrupts[0].id)])  # recorded under its id
    done = graph_that_asks(checkpointer, seen).invoke(Resume(value="London"), cfg())
    assert done.final_text == "hello Ada from London"
    with pytest.raises(ConfigError, match=r"thread 't' waits for 0 \(\[\]\): answer by id"):
        graph_that_asks(checkpointer, seen).invoke(Resume(value="Paris"), cfg())
    ran = Ledger()
    calls = [("1", 200.0), ("2", 300.0)]
    agent(checkpointer, ran, calls).invoke(GO, cfg("two"))
    with pytest.raises(ConfigError, match=r"waits for 2 \(\['approval-.*', 'approval-.*'\]\): answer by id"):
        agent(checkpointer, ran, calls).invoke(Resume(value=True), cfg("two"))
    with pytest.raises(ConfigError, match=r"by id or value= for the one pending interrupt, not both"):
        Resume({"x": True}, value=True)
    assert ran.runs == []
