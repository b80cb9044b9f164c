"""ReplaySafeToolNode, ReplaySafeToolCalls and ReplaySafeMiddleware on LangGraph's real ToolNode, savers and agent
factories: what a crash leaves, what a resume replays, the key, the thread, effect classes, in-doubt policies,
bad input, and the lazy import."""

from __future__ import annotations

import asyncio
import json
import logging
import operator
import subprocess
import sys
from collections import Counter
from pathlib import Path
from typing import Annotated, Any, TypedDict

import pytest

pytest.importorskip("langgraph", reason="the langgraph extra is not installed: pip install 'tenxgraph[langgraph]'")

from langchain_core.language_models.chat_models import BaseChatModel
from langchain_core.messages import AIMessage, AnyMessage, BaseMessage, HumanMessage, ToolMessage
from langchain_core.outputs import ChatGeneration, ChatResult
from langchain_core.tools import tool
from langgraph.checkpoint.memory import InMemorySaver
from langgraph.graph import START, MessagesState, StateGraph
from langgraph.prebuilt import ToolNode, tools_condition
from langgraph.types import Command

from tenxgraph.core import crashpoints
from tenxgraph.core.graph.utils.ledger_record import result_message_id
from tenxgraph.integrations.langgraph import ReplaySafeToolCalls, ReplaySafeToolNode, current_idempotency_key
from tenxgraph.storage.checkpointer import InMemoryCheckpointer, SqliteCheckpointer
from tenxgraph.utils.errors import ConfigError

ROOT = Path(__file__).resolve().parent.parent
CFG = {"configurable": {"thread_id": "t1"}}


class Counted:
    """Three tools whose bodies count their runs and remember the idempotency key each run saw."""

    def __init__(self, asynchronous: bool = False) -> None:
        self.runs: Counter[str] = Counter()
        self.keys: list[str | None] = []
        self.asynchronous = asynchronous  # email is an async tool (LangGraph runs those in async graphs only)

    def tools(self) -> list[Any]:
        @tool
        def refund(order_id: str) -> str:
            """Refund an order."""
            self.runs[f"refund:{order_id}"] += 1
            self.keys.append(current_idempotency_key())
            return f"refunded {order_id}"

        def send(to: str) -> str:
            self.runs[f"email:{to}"] += 1
            self.keys.append(current_idempotency_key())
            return f"emailed {to}"

        async def email_async(to: str) -> str:
            """Send an email."""
            await asyncio.sleep(0)
            return send(to)

        def email_sync(to: str) -> str:
            """Send an email."""
            return send(to)

        email = tool("email")(email_async if self.asynchronous else email_sync)

        @tool
        def lookup(order_id: str) -> str:
            """Look an order up."""
            self.runs[f"lookup:{order_id}"] += 1
            return f"order {order_id}: paid"

        return [refund, email, lookup]


def calls(*specs: tuple[str, dict[str, Any]]) -> AIMessage:
    return AIMessage("", tool_calls=[{"name": n, "args": a, "id": f"call_{i}"} for i, (n, a) in enumerate(specs)])


def scripted(turns: list[AIMessage]) -> Any:
    """A model node answering turn by turn from the conversation (the same reply in every run)."""

    def model(state: MessagesState) -> dict[str, Any]:
        done = sum(1 for m in state["messages"] if isinstance(m, AIMessage))
        return {"messages": [turns[min(done, len(turns) - 1)].model_copy()]}

    return model


TURNS = [
    calls(("refund", {"order_id": "A"}), ("email", {"to": "ada"}), ("refund", {"order_id": "B"})),
    calls(("refund", {"order_id": "C"})),  # call_0 again, in a new message
    AIMessage("done"),
]


def build(node: Any, saver: Any, turns: list[AIMessage] = TURNS) -> Any:
    graph = StateGraph(MessagesState)
    graph.add_node("agent", scripted(turns))
    graph.add_node("tools", node)
    graph.add_edge(START, "agent")
    graph.add_conditional_edges("agent", tools_condition)
    graph.add_edge("tools", "agent")
    return graph.compile(checkpointer=saver)


def tool_messages(result: dict[str, Any]) -> list[ToolMessage]:
    return [m for m in result["messages"] if isinstance(m, ToolMessage)]


@pytest.fixture
def ledger(tmp_path: Path) -> Any:
    cp = SqliteCheckpointer(tmp_path / "ledger.db")
    yield cp
    cp.close()


def test_a_clean_run_records_each_call_under_its_message_and_call_id(ledger: Any) -> None:
    counted = Counted()
    app = build(ReplaySafeToolNode(counted.tools(), ledger=ledger), InMemorySaver())
    result = app.invoke({"messages": [HumanMessage("go")]}, CFG)
    assert result["messages"][-1].content == "done"
    assert [m.content for m in tool_messages(result)] == ["refunded A", "emailed ada", "refunded B", "refunded C"]
    ais = [m for m in result["messages"] if isinstance(m, AIMessage) and m.tool_calls]
    keys = sorted(ledger.list_tool_results("t1"))
    assert keys == sorted(f"{ai.id}:{c['id']}" for ai in ais for c in ai.tool_calls)  # call_0 twice, two keys
    assert all(m.id == result_message_id(f"{ais[0].id}:{m.tool_call_id}") for m in tool_messages(result)[:3])
    assert len(set(counted.keys)) == 4 and None not in counted.keys  # one idempotency key per call


def test_after_a_crash_finished_calls_are_replayed_and_only_the_rest_run(ledger: Any) -> None:
    counted = Counted()
    saver = InMemorySaver()
    with crashpoints.armed("tool.after_record", hit=2), pytest.raises(crashpoints.CrashInjected):
        build(ReplaySafeToolNode(counted.tools(), ledger=ledger), saver).invoke({"messages": [HumanMessage("go")]}, CFG)
    recorded = set(ledger.list_tool_results("t1"))
    assert len(recorded) in (2, 3)  # the crash came after the second record; a sibling may have been recorded
    first_keys = list(counted.keys)
    result = build(ReplaySafeToolNode(counted.tools(), ledger=ledger), saver).invoke(None, CFG)
    assert result["messages"][-1].content == "done"
    assert set(counted.runs.values()) == {1}, counted.runs  # every body ran exactly once across both runs
    replayed = [m for m in tool_messages(result) if m.response_metadata.get("replayed")]
    assert len(replayed) == len(recorded)
    assert [m.content for m in tool_messages(result)] == ["refunded A", "emailed ada", "refunded B", "refunded C"]
    assert set(first_keys) <= set(counted.keys)


def test_the_async_graph_goes_through_awrap_tool_call(ledger: Any) -> None:
    counted = Counted(asynchronous=True)
    saver = InMemorySaver()

    async def scenario() -> dict[str, Any]:
        app = build(ReplaySafeToolNode(counted.tools(), ledger=ledger), saver)
        with crashpoints.armed("tool.after_record", hit=3), pytest.raises(crashpoints.CrashInjected):
            await app.ainvoke({"messages": [HumanMessage("go")]}, CFG)
        return await build(ReplaySafeToolNode(counted.tools(), ledger=ledger), saver).ainvoke(None, CFG)

    result = asyncio.run(scenario())
    assert result["messages"][-1].content == "done"
    assert set(counted.runs.values()) == {1}, counted.runs


def test_a_bare_tool_node_runs_finished_siblings_again() -> None:
    """The before, for contrast: LangGraph's ToolNode re-runs the whole batch after the same crash."""
    counted = Counted()
    saver = InMemorySaver()

    def crash_second(name: str, hit: int) -> None:
        if sum(counted.runs.values()) >= 2:
            raise crashpoints.CrashInjected(name, hit)

    app = build(ToolNode(counted.tools()), saver)
    with pytest.raises(crashpoints.CrashInjected):
        app.invoke({"messages": [HumanMessage("go")]}, {**CFG, "callbacks": [_Crasher(crash_second)]})
    app.invoke(None, CFG)
    assert max(counted.runs.values()) == 2
    assert current_idempotency_key() is None


class _Crasher:
    """A callback handler that calls *crash* after each tool returns (LangChain's public callback API)."""

    def __new__(cls, crash: Any) -> Any:
        from langchain_core.callbacks import BaseCallbackHandler

        class Handler(BaseCallbackHandler):
            run_inline = True
            raise_error = True

            def on_tool_end(self, output: Any, **kw: Any) -> None:
                crash("test.after_tool", 1)

        return Handler()


def test_read_tools_are_not_recorded_and_the_policies_are_the_runtimes(ledger: Any) -> None:
    counted = Counted()
    node = ReplaySafeToolNode(counted.tools(), ledger=ledger, effects={"lookup": "read"})
    turns = [calls(("lookup", {"order_id": "A"}), ("refund", {"order_id": "A"})), AIMessage("done")]
    build(node, InMemorySaver(), turns).invoke({"messages": [HumanMessage("go")]}, CFG)
    assert [k.split(":")[-1] for k in ledger.list_tool_results("t1")] == ["call_1"]  # the read left no record


def test_a_call_in_doubt_is_not_run_again_under_on_in_doubt_fail(ledger: Any) -> None:
    counted = Counted()
    saver = InMemorySaver()
    turns = [calls(("refund", {"order_id": "A"})), AIMessage("done")]

    def node() -> ReplaySafeToolNode:
        return ReplaySafeToolNode(counted.tools(), ledger=ledger, effects={"refund": "external"})  # policy "fail"

    with crashpoints.armed("tool.after_return"), pytest.raises(crashpoints.CrashInjected):
        build(node(), saver, turns).invoke({"messages": [HumanMessage("go")]}, CFG)
    result = build(node(), saver, turns).invoke(None, CFG)
    (answer,) = tool_messages(result)
    assert counted.runs["refund:A"] == 1
    assert answer.status == "error" and "in doubt" in str(answer.content)


def test_the_key_needs_the_ai_message_id_and_a_missing_one_is_named(
    ledger: Any, caplog: pytest.LogCaptureFixture
) -> None:
    class Plain(TypedDict):  # a list reducer, not add_messages: stored messages get no id
        messages: Annotated[list[AnyMessage], operator.add]

    counted = Counted()
    graph = StateGraph(Plain)
    graph.add_node("agent", lambda s: {"messages": [TURNS[-1] if len(s["messages"]) > 2 else TURNS[1]]})
    graph.add_node("tools", ReplaySafeToolNode(counted.tools(), ledger=ledger))
    graph.add_edge(START, "agent")
    graph.add_conditional_edges("agent", tools_condition)
    graph.add_edge("tools", "agent")
    with caplog.at_level(logging.WARNING, logger="tenxgraph"):
        graph.compile(checkpointer=InMemorySaver()).invoke({"messages": [HumanMessage("go")]}, CFG)
    assert counted.runs["refund:C"] == 1
    assert ledger.list_tool_results("t1") == {}  # unprotected: nothing recorded
    assert "its AIMessage has no id" in caplog.text and "add_messages" in caplog.text


def test_a_run_without_a_thread_is_refused_before_any_tool_runs(ledger: Any) -> None:
    counted = Counted()
    app = build(ReplaySafeToolNode(counted.tools(), ledger=ledger), None)
    with pytest.raises(ConfigError, match=r"config=\{'configurable': \{'thread_id'"):
        app.invoke({"messages": [HumanMessage("go")]})
    assert not counted.runs


def test_bad_declarations_name_the_tool_and_the_fix(ledger: Any) -> None:
    tools = Counted().tools()
    with pytest.raises(ConfigError, match=r"'refund'.*transactional"):  # no database transaction to share
        ReplaySafeToolNode(tools, ledger=InMemoryCheckpointer(), effects={"refund": "transactional"})
    ReplaySafeToolNode(tools, ledger=ledger, effects={"refund": "transactional"})  # SQLite shares its own
    with pytest.raises(ConfigError, match=r"'refund'.*effect='read' with on_in_doubt='fail'"):
        ReplaySafeToolNode(tools, ledger=ledger, effects={"refund": "read"}, on_in_doubt={"refund": "fail"})
    with pytest.raises(ConfigError, match="no tool named 'refnud'"):
        ReplaySafeToolNode(tools, ledger=ledger, effects={"refnud": "read"})
    with pytest.raises(ConfigError, match="not a tenxgraph ledger store"):
        ReplaySafeToolNode(tools, ledger=InMemorySaver())  # type: ignore[arg-type]
    with pytest.raises(ConfigError, match="invalid; use one of"):
        ReplaySafeToolNode(tools, ledger=ledger, effects={"refund": "sideways"})


def test_a_command_result_is_answered_with_an_error_that_is_recorded(ledger: Any) -> None:
    runs: list[str] = []

    @tool
    def jump(where: str) -> Command:  # type: ignore[type-arg]
        """Go somewhere."""
        runs.append(where)
        return Command(goto="agent")

    saver = InMemorySaver()
    turns = [calls(("jump", {"where": "x"})), AIMessage("done")]
    result = build(ReplaySafeToolNode([jump], ledger=ledger), saver, turns).invoke(
        {"messages": [HumanMessage("go")]}, CFG
    )
    (answer,) = tool_messages(result)
    assert answer.status == "error" and "cannot record yet" in str(answer.content)
    assert len(ledger.list_tool_results("t1")) == 1 and runs == ["x"]


def test_your_own_wrapper_runs_inside_the_ledger(ledger: Any) -> None:
    attempts: list[int] = []

    @tool
    def flaky(n: int) -> str:
        """Fails the first time."""
        attempts.append(n)
        if len(attempts) == 1:
            raise RuntimeError("try again")
        return "ok"

    def retry(request: Any, execute: Any) -> Any:
        result = execute(request)
        return execute(request) if result.status == "error" else result

    async def aretry(request: Any, execute: Any) -> Any:
        result = await execute(request)
        return await execute(request) if result.status == "error" else result

    node = ReplaySafeToolNode(
        [flaky], ledger=ledger, wrap_tool_call=retry, awrap_tool_call=aretry, handle_tool_errors=True
    )
    turns = [calls(("flaky", {"n": 1})), AIMessage("done")]
    result = build(node, InMemorySaver(), turns).invoke({"messages": [HumanMessage("go")]}, CFG)
    assert [m.content for m in tool_messages(result)] == ["ok"] and len(attempts) == 2
    (record,) = ledger.list_tool_results("t1").values()
    assert record["output"] == "ok"  # one recorded call: the retry's outcome


def test_the_wrappers_fit_a_tool_node_you_keep(ledger: Any) -> None:
    counted = Counted()
    calls_ = ReplaySafeToolCalls(ledger)
    node = ToolNode(counted.tools(), wrap_tool_call=calls_.wrap_tool_call, awrap_tool_call=calls_.awrap_tool_call)
    build(node, InMemorySaver()).invoke({"messages": [HumanMessage("go")]}, CFG)
    assert len(ledger.list_tool_results("t1")) == 4


def test_async_durability_is_warned_about_once(ledger: Any, caplog: pytest.LogCaptureFixture) -> None:
    app = build(ReplaySafeToolNode(Counted().tools(), ledger=ledger), InMemorySaver())
    with caplog.at_level(logging.WARNING, logger="tenxgraph"):
        app.invoke({"messages": [HumanMessage("go")]}, {"configurable": {"thread_id": "sync"}}, durability="sync")
        assert "durability" not in caplog.text
        app.invoke({"messages": [HumanMessage("go")]}, CFG)
    assert caplog.text.count("durability='async'") == 1 and "durability='sync'" in caplog.text


class ScriptedChat(BaseChatModel):
    """A chat model that answers turn by turn (LangChain's own BaseChatModel; no provider, no key)."""

    turns: list[AIMessage]

    def _generate(self, messages: list[BaseMessage], stop: Any = None, run_manager: Any = None, **kw: Any) -> Any:
        done = sum(1 for m in messages if isinstance(m, AIMessage))
        return ChatResult(generations=[ChatGeneration(message=self.turns[min(done, len(self.turns) - 1)])])

    def bind_tools(self, tools: Any, **kw: Any) -> Any:
        return self

    @property
    def _llm_type(self) -> str:
        return "scripted"


@pytest.mark.filterwarnings("ignore:create_react_agent has been moved")
def test_create_react_agent_takes_a_replay_safe_tool_node(ledger: Any) -> None:
    from langgraph.prebuilt import create_react_agent

    counted = Counted()
    saver = InMemorySaver()

    def agent() -> Any:
        node = ReplaySafeToolNode(counted.tools(), ledger=ledger)
        return create_react_agent(ScriptedChat(turns=TURNS), node, checkpointer=saver)

    with crashpoints.armed("tool.after_record", hit=2), pytest.raises(crashpoints.CrashInjected):
        agent().invoke({"messages": [HumanMessage("go")]}, CFG)
    result = agent().invoke(None, CFG)
    assert result["messages"][-1].content == "done" and set(counted.runs.values()) == {1}


def test_create_agent_middleware(ledger: Any) -> None:
    pytest.importorskip("langchain.agents", reason="langchain is not installed: pip install langchain")
    from langchain.agents import create_agent

    from tenxgraph.integrations.langgraph import ReplaySafeMiddleware

    counted = Counted()
    saver = InMemorySaver()

    def agent() -> Any:
        return create_agent(
            ScriptedChat(turns=TURNS), counted.tools(), middleware=[ReplaySafeMiddleware(ledger)], checkpointer=saver
        )

    with crashpoints.armed("tool.after_record", hit=2), pytest.raises(crashpoints.CrashInjected):
        agent().invoke({"messages": [HumanMessage("go")]}, CFG)
    result = agent().invoke(None, CFG)
    assert result["messages"][-1].content == "done" and set(counted.runs.values()) == {1}
    assert len(ledger.list_tool_results("t1")) == 4


def test_without_langgraph_the_error_names_the_extra() -> None:
    code = (
        "import sys; sys.modules['langgraph'] = None; sys.modules['langgraph.prebuilt'] = None\n"
        "import tenxgraph.integrations.langgraph as lg\n"
        "try:\n    lg.ReplaySafeToolNode\nexcept ImportError as exc:\n    print(exc)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert "pip install 'tenxgraph[langgraph]'" in out


def test_to_messages_keeps_roles_ids_calls_and_results() -> None:
    from tenxgraph.integrations.langgraph import to_messages

    ai = calls(("refund", {"order_id": "A"}))
    ai.id = "ai-1"
    out = to_messages([HumanMessage("go", id="h"), ai, ToolMessage("no", tool_call_id="call_0", status="error")])
    assert [m.role for m in out] == ["user", "assistant", "tool"]
    assert out[1].message_id == "ai-1" and out[1].tool_calls[0].args == {"order_id": "A"}
    assert out[2].tool_results[0].is_error and out[2].tool_results[0].call_id == "call_0"


def test_in_memory_ledger_works_too() -> None:
    counted = Counted()
    build(ReplaySafeToolNode(counted.tools(), ledger=InMemoryCheckpointer()), InMemorySaver()).invoke(
        {"messages": [HumanMessage("go")]}, CFG
    )
    assert sum(counted.runs.values()) == 4


# -- the plugin's side: the marker, the fixture, the closing line ---------------------------------------------
pytest_plugins = ["pytester"]

LG_TEST = """
import pytest
from langchain_core.messages import AIMessage
from langchain_core.tools import tool
from langgraph.graph import START, MessagesState, StateGraph
from langgraph.prebuilt import ToolNode, tools_condition


def build(saver):
    @tool
    def refund(order_id: str) -> str:
        '''Refund.'''
        return "refunded " + order_id

    def model(state):
        if any(m.type == "tool" for m in state["messages"]):
            return {"messages": [AIMessage("done")]}
        calls = [{"name": "refund", "args": {"order_id": o}, "id": f"call_{i}"} for i, o in enumerate("AB")]
        return {"messages": [AIMessage("", tool_calls=calls)]}

    graph = StateGraph(MessagesState)
    graph.add_node("agent", model)
    graph.add_node("tools", ToolNode([refund]))
    graph.add_edge(START, "agent")
    graph.add_conditional_edges("agent", tools_condition)
    graph.add_edge("tools", "agent")
    return graph.compile(checkpointer=saver)


@pytest.mark.xfail(reason="the before")
@pytest.mark.crash_matrix(framework="langgraph", points="tool.after_return,langgraph.after_put")
def test_bare(crash_run):
    result = crash_run.invoke(build(crash_run.langgraph_checkpointer), {"messages": [("user", "go")]})
    assert result.final_text == "done"
"""


def test_the_marker_names_the_frameworks(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(
        test_bad="""
import pytest

@pytest.mark.crash_matrix(framework="langchain")
def test_x(crash_run):
    pass
"""
    )
    result = pytester.runpytest_subprocess("-p", "no:cacheprovider", "--crash-matrix")
    assert result.ret != 0
    assert "crash_matrix(framework='langchain'): use one of tenxgraph, langgraph" in result.stdout.str()


def test_a_langgraph_test_gets_langgraphs_points_and_an_xfail_counts_apart(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(test_lg=LG_TEST)
    args = ["-p", "no:cacheprovider", "--crash-matrix", "--crash-backends=sqlite", "--crash-report=r.json"]
    result = pytester.runpytest_subprocess(*args)
    assert result.ret == 0  # the test is marked xfail: its violations are expected
    out = result.stdout.str()
    assert "VIOLATION (expected: xfail) test_bare at tool.after_return" in out
    assert "expected to fail:" in out and "NOT PROVED" not in out
    header = ("rootdir", "replaysafe", "plugins:")  # (pytest's header: its plugins' names and versions)
    assert [line for line in out.splitlines() if len(line) > 100 and not line.startswith(header)] == []
    cells = json.loads((pytester.path / "r.json").read_text())["cells"]
    assert all(c["expected"] for c in cells)
    kinds = {(c["point"], c["mode"]) for c in cells}  # its points only, and no contest, recovery or prune cell
    assert kinds == {
        (p, m) for p in ("tool.after_return", "langgraph.after_put") for m in ("inprocess", "sigkill", "stream")
    }
    again = pytester.runpytest_subprocess(*args, "--runxfail")
    assert again.ret != 0 and "NOT PROVED" in again.stdout.str()


def test_a_conversation_of_a_langgraph_app_is_a_usage_error(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(
        test_lg=LG_TEST.split("@pytest.mark.xfail")[0]
        + """
def test_turns(crash_run):
    crash_run.conversation(build(crash_run.langgraph_checkpointer), [{"messages": [("user", "go")]}])
"""
    )
    result = pytester.runpytest_subprocess("-p", "no:cacheprovider")
    result.stdout.fnmatch_lines(["*crash_run.conversation drives tenxgraph graphs*"])


def test_an_interrupt_in_a_tool_passes_through_unrecorded_and_the_resumed_call_is_recorded(ledger: Any) -> None:
    from langgraph.types import interrupt

    approved: list[str] = []

    @tool
    def refund(order_id: str) -> str:
        """Refund, once a person approves."""
        answer = interrupt(f"refund {order_id}?")
        approved.append(answer)
        return f"refunded {order_id}: {answer}"

    saver = InMemorySaver()
    turns = [calls(("refund", {"order_id": "A"})), AIMessage("done")]
    app = build(ReplaySafeToolNode([refund], ledger=ledger), saver, turns)
    first = app.invoke({"messages": [HumanMessage("go")]}, CFG)
    assert "__interrupt__" in first and ledger.list_tool_results("t1") == {}  # nothing recorded at the interrupt
    result = app.invoke(Command(resume="yes"), CFG)
    assert [m.content for m in tool_messages(result)] == ["refunded A: yes"] and approved == ["yes"]
    records = ledger.list_tool_results("t1")  # the call's result, and the answer it consumed (recorded first)
    assert sorted(r["kind"] for r in records.values()) == ["decision", "value"]
    assert [r["value"] for r in records.values() if r["kind"] == "decision"] == ["yes"]


def test_tools_from_an_mcp_server_get_their_effect_class_from_their_annotations(ledger: Any) -> None:
    """langchain-mcp-adapters (0.3.2: tools.py, convert_mcp_tool_to_langchain_tool) puts an MCP tool's annotations
    in the LangChain tool's ``metadata`` (``annotations.model_dump()``, with the ``mcp`` 1.x field names); the
    wrapper reads the effect class from them, as tenxgraph.integrations.mcp does from the SDK's own objects."""
    counted = Counted()

    def mcp_tools() -> list[Any]:
        refund, email, lookup = counted.tools()
        lookup.metadata = {"title": None, "readOnlyHint": True, "destructiveHint": False, "idempotentHint": True,
                           "openWorldHint": False}  # fmt: skip
        refund.metadata = {"title": None, "readOnlyHint": False, "destructiveHint": True, "idempotentHint": False,
                           "openWorldHint": True}  # fmt: skip
        email.metadata = {"idempotent_hint": True}  # (the 2.x SDK's field names)
        return [refund, email, lookup]

    wrapper = ReplaySafeToolCalls(ledger)
    policies = {t.name: wrapper._policy(t) for t in mcp_tools()}
    assert {name: (effect.value if effect else None, policy) for name, (policy, _, effect) in policies.items()} == {
        "refund": ("external", None), "email": ("idempotent", None), "lookup": ("read", None)
    }  # fmt: skip
    saver = InMemorySaver()
    # (one call per step: the crash's second hit is the refund's, whichever of two siblings would return first)
    turns = [calls(("lookup", {"order_id": "A"})), calls(("refund", {"order_id": "A"})), AIMessage("done")]
    with crashpoints.armed("tool.after_return", 2), pytest.raises(crashpoints.CrashInjected):
        build(ReplaySafeToolNode(mcp_tools(), ledger=ledger), saver, turns).invoke(
            {"messages": [HumanMessage("go")]}, CFG
        )
    result = build(ReplaySafeToolNode(mcp_tools(), ledger=ledger), saver, turns).invoke(None, CFG)
    assert counted.runs["refund:A"] == 1  # external, from its hints: found in doubt, not run again
    (refunded,) = [m for m in tool_messages(result) if m.name == "refund"]
    assert "in doubt" in str(refunded.content)
    (record,) = ledger.list_tool_results("t1").values()  # the read left no record; refund's answer is recorded
    assert record["tool"] == "refund"


def test_the_witness_reads_each_guarded_tools_declaration_itself(ledger: Any) -> None:
    """The gate's witness learns a LangGraph tool's effect class and policy from what its user said (the node's
    ``effects=`` / ``on_in_doubt=`` first, then the tool's ``metadata``, MCP hints mapped), not from the wrapper;
    through ``create_agent``'s middleware too; a bare ``ToolNode`` guards nothing and declares nothing."""
    from pytest_replaysafe.run.witness import langgraph_declarations

    tools = Counted().tools()
    tools[0].metadata = {"effect": "read"}  # overridden by the node's effects= below
    tools[1].metadata = {"on_in_doubt": "retry", "destructiveHint": True}  # MCP annotations: external
    tools[2].metadata = {"readOnlyHint": True}

    def graph(node: Any) -> Any:
        g = StateGraph(MessagesState)
        g.add_node("tools", node)
        g.add_edge(START, "tools")
        return g.compile()

    node = ReplaySafeToolNode(tools, ledger=ledger, effects={"refund": "external"}, on_in_doubt={"refund": "fail"})
    assert langgraph_declarations(graph(node)) == {
        "refund": ("external", "fail"),
        tools[1].name: ("external", "retry"),
        tools[2].name: ("read", None),
    }
    assert langgraph_declarations(graph(ToolNode(tools))) == {}
    pytest.importorskip("langchain.agents", reason="langchain is not installed: pip install langchain")
    from langchain.agents import create_agent

    from tenxgraph.integrations.langgraph import ReplaySafeMiddleware

    middleware = ReplaySafeMiddleware(ledger, effects={"refund": "idempotent"})
    agent = create_agent(ScriptedChat(turns=TURNS), tools, middleware=[middleware])
    assert langgraph_declarations(agent)["refund"] == ("idempotent", None)
