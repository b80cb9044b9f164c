"""Pydantic AI agents durable on the ledger (tenxgraph.integrations.pydantic_ai): Pydantic AI's own ``Agent``,
``FunctionModel`` and tool decorators, through its durability API. Effects are counted outside the runtime: by the
provider the tools call (a SQLite file every process of a test writes to), and the model's turns by the model."""

from __future__ import annotations

import asyncio
import os
import sqlite3
import subprocess
import sys
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("pydantic_ai.durable_exec")

from pydantic_ai import Agent
from pydantic_ai.exceptions import UserError
from pydantic_ai.messages import ModelMessage, ModelResponse, TextPart, ToolCallPart
from pydantic_ai.models.function import AgentInfo, FunctionModel

from examples.payments import LocalProvider
from examples.pydantic_ai_support import agent as support
from tenxgraph.integrations.pydantic_ai import LedgerDurability
from tenxgraph.ledger import Effect
from tenxgraph.storage.checkpointer import BaseCheckpointer, InMemoryCheckpointer, SqliteCheckpointer
from tenxgraph.utils.errors import ConfigError

ROOT = Path(__file__).resolve().parents[1]
PROMPT = "Please refund order A-1042."


def kinds(effects_db: Path) -> Counter[str]:
    """The effects the provider applied, by kind (a replay that reached the provider with its key adds none)."""
    with sqlite3.connect(effects_db) as conn:
        return Counter(kind for (kind,) in conn.execute("SELECT kind FROM effects"))


def test_a_run_calls_each_tool_once_and_the_same_run_again_is_answered_from_its_records(
    checkpointer: BaseCheckpointer,
) -> None:
    provider = LocalProvider()
    agent = support.build_agent(provider, ledger=checkpointer)
    support.ASKED.clear()
    first = agent.run_sync(PROMPT, run_id="run-1")
    assert first.output == support.FINAL
    assert Counter(kind for kind, _ in provider.effects) == Counter({"refund": 1, "email": 1, "receipt": 1})
    assert len(support.ASKED) == 3
    again = agent.run_sync(PROMPT, run_id="run-1")  # (a resume of a run that finished: nothing runs again)
    assert again.output == support.FINAL and len(provider.effects) == 3
    assert len(support.ASKED) == 3  # (every turn journaled: the model is not asked again)
    assert said_of(again.all_messages()) == said_of(first.all_messages())
    other = agent.run_sync(PROMPT, run_id="run-2")  # (another run is other calls)
    assert other.output == support.FINAL and len(provider.effects) == 6


def said_of(messages: list[ModelMessage]) -> list[tuple[str, Any, Any]]:
    """What a conversation says, part by part (without the times the parts were made)."""
    return [(p.part_kind, getattr(p, "content", None), getattr(p, "tool_call_id", None))
            for m in messages for p in m.parts]  # fmt: skip


def run_process(effects_db: Path, where: str, run_id: str, crash_in: str = "") -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": f"{ROOT}{os.pathsep}{os.environ.get('PYTHONPATH', '')}"}
    args = [sys.executable, "-m", "examples.pydantic_ai_support.agent", str(effects_db), where, run_id]
    return subprocess.run(args + ([crash_in] if crash_in else []), capture_output=True, text=True, env=env,
                          cwd=ROOT, timeout=120)  # fmt: skip


@pytest.fixture(params=["sqlite", "postgres"])
def ledger_at(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    """Where the processes of a test keep the ledger: a SQLite file, or a PostgreSQL schema of the test's own."""
    if request.param == "sqlite":
        return str(tmp_path / "ledger.db")
    dsn = request.getfixturevalue("pg_dsn")
    return f"{dsn}#{request.getfixturevalue('pg_schema')}"


@pytest.mark.parametrize("crash_in", ["refund", "email", "receipt"])
def test_a_run_killed_after_an_effect_resumes_in_another_process_without_a_second_effect(
    tmp_path: Path, ledger_at: str, crash_in: str
) -> None:
    """The process dies right after a tool's effect, before the tool returns (its call in doubt); a new process
    runs the same run_id: no effect twice, the finished turns not asked again, the run finished."""
    effects_db = tmp_path / "effects.db"
    crashed = run_process(effects_db, ledger_at, "order-A-1042", crash_in)
    assert crashed.returncode == 9, crashed.stderr
    resumed = run_process(effects_db, ledger_at, "order-A-1042")
    assert resumed.returncode == 0, resumed.stderr
    assert support.FINAL in resumed.stdout
    applied = kinds(effects_db)
    assert max(applied.values()) == 1, applied  # (none twice)
    # the crashed tool's effect, and the receipt after it, once; its sibling (in parallel, maybe not started when
    # the process died, then in doubt) at most once
    assert applied[crash_in] == 1 and applied["receipt"] == 1
    turns_left = {"refund": 2, "email": 2, "receipt": 1}[crash_in]  # (the turns after the crashed one's)
    assert f"asked the model {turns_left} times" in resumed.stdout
    if crash_in == "refund":  # (declared external: in doubt, not run again, and the model is told)
        assert '"event": "tool_in_doubt"' in resumed.stdout + resumed.stderr


def test_k_processes_resuming_one_run_at_once_make_each_effect_once_and_agree(tmp_path: Path, ledger_at: str) -> None:
    """After the crash, 4 processes run the same run_id at once: they take the run's lock in turn, the first
    finishes the run and the others replay it: each effect at most once, the model asked only by the first, the
    same answer in all four."""
    effects_db = tmp_path / "effects.db"
    assert run_process(effects_db, ledger_at, "order-A-1042", "email").returncode == 9
    env = {**os.environ, "PYTHONPATH": f"{ROOT}{os.pathsep}{os.environ.get('PYTHONPATH', '')}"}
    args = [sys.executable, "-m", "examples.pydantic_ai_support.agent", str(effects_db), ledger_at, "order-A-1042"]
    procs = [subprocess.Popen(args, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env, cwd=ROOT)
             for _ in range(4)]  # fmt: skip
    outs = [p.communicate(timeout=120) for p in procs]
    assert [p.returncode for p in procs] == [0] * 4, [err[-2000:] for _, err in outs]
    assert all(support.FINAL in out for out, _ in outs)
    asked = sorted(int(out.split("asked the model ")[1].split()[0]) for out, _ in outs)
    assert asked == [0, 0, 0, 2]  # (turns 2 and 3, by the first to take the lock; the others replay them)
    applied = kinds(effects_db)
    assert max(applied.values()) == 1 and applied["email"] == 1 and applied["receipt"] == 1, applied


def test_the_bare_agent_run_again_after_the_same_crash_refunds_twice(tmp_path: Path) -> None:
    """What Pydantic AI alone does: the run's messages died with the process, so the run is run again from the
    prompt; the model asks for the refund again, with new ids, and the provider gets no key to tell."""
    effects_db = tmp_path / "effects.db"
    # (killed after the receipt, the second turn's call: both calls of the first turn had applied their effects)
    assert run_process(effects_db, "bare", "order-A-1042", "receipt").returncode == 9
    again = run_process(effects_db, "bare", "order-A-1042")
    assert again.returncode == 0 and "asked the model 3 times" in again.stdout
    assert kinds(effects_db) == Counter({"refund": 2, "email": 2, "receipt": 2})


def approve_process(effects_db: Path, where: str, history: Path, what: str) -> subprocess.Popen[str]:
    env = {**os.environ, "PYTHONPATH": f"{ROOT}{os.pathsep}{os.environ.get('PYTHONPATH', '')}"}
    args = [sys.executable, "-m", "examples.pydantic_ai_support.approve", str(effects_db), where, str(history), what]
    return subprocess.Popen(args, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env, cwd=ROOT)


def answered(procs: list[subprocess.Popen[str]]) -> list[str]:
    outs = [p.communicate(timeout=120) for p in procs]
    assert [p.returncode for p in procs] == [0] * len(procs), [err[-2000:] for _, err in outs]
    return [out.strip() for out, _ in outs]


def test_k_processes_sending_one_approval_at_once_refund_once_and_agree(tmp_path: Path, ledger_at: str) -> None:
    """The refund waits for a person (``requires_approval=True``); 4 processes send the approval at once through
    resume_once: one refund, one receipt (the later ones replay the run that took the answer), one answer."""
    effects_db, history = tmp_path / "effects.db", tmp_path / "history.json"
    assert answered([approve_process(effects_db, ledger_at, history, "ask")]) == ["paused on ['refund']"]
    outs = answered([approve_process(effects_db, ledger_at, history, "yes") for _ in range(4)])
    assert outs == [support.FINAL] * 4
    assert kinds(effects_db) == Counter({"refund": 1, "email": 1, "receipt": 1})


def test_the_bare_agent_given_one_approval_twice_refunds_twice(tmp_path: Path) -> None:
    """What Pydantic AI alone does (pydantic/pydantic-ai#5536): every run given the approval runs the tool."""
    effects_db, history = tmp_path / "effects.db", tmp_path / "history.json"
    answered([approve_process(effects_db, "bare", history, "bare-ask")])
    answered([approve_process(effects_db, "bare", history, "bare-yes")])
    answered([approve_process(effects_db, "bare", history, "bare-yes")])
    assert kinds(effects_db)["refund"] == 2


@pytest.mark.parametrize("first", ["yes", "no"])
def test_an_answer_other_than_the_recorded_one_is_refused_and_nothing_runs(
    checkpointer: BaseCheckpointer, first: str
) -> None:
    """One decision per call, ever: the second person's other answer is refused (InterruptDecidedError names the
    one that stands) and changes nothing; the same answer again gets the run's result (async entry too)."""
    from pydantic_ai import DeferredToolRequests, DeferredToolResults

    from tenxgraph.integrations.pydantic_ai import aresume_once, resume_once
    from tenxgraph.utils.errors import InterruptDecidedError

    provider = LocalProvider()
    agent = support.build_agent(provider, ledger=checkpointer, approval=True)
    paused = agent.run_sync(PROMPT)
    assert isinstance(paused.output, DeferredToolRequests)
    call = paused.output.approvals[0].tool_call_id
    history = paused.all_messages()
    said = resume_once(agent, DeferredToolResults(approvals={call: first == "yes"}), message_history=history)
    assert said.output == support.FINAL
    other = DeferredToolResults(approvals={call: first != "yes"})
    with pytest.raises(InterruptDecidedError, match="was already decided"):
        resume_once(agent, other, message_history=history)
    again = asyncio.run(aresume_once(agent, DeferredToolResults(approvals={call: first == "yes"}),
                                     message_history=history))  # fmt: skip
    assert said_of(again.new_messages()) == said_of(said.new_messages())
    refunds = sum(kind == "refund" for kind, _ in provider.effects)
    assert refunds == (1 if first == "yes" else 0)
    assert sum(kind == "receipt" for kind, _ in provider.effects) == 1


def test_run_stream_and_iter_are_journaled_as_run_is(tmp_path: Path) -> None:
    """A streamed model turn is journaled whole; the same run again, streamed or iterated node by node, asks the
    model nothing and runs no tool."""
    import json

    from pydantic_ai.messages import ModelRequest, ToolReturnPart
    from pydantic_ai.models.function import DeltaToolCall

    asked: list[int] = []
    ran: list[str] = []

    async def stream(messages: list[ModelMessage], info: AgentInfo) -> Any:
        asked.append(len(messages))
        if not any(isinstance(p, ToolReturnPart) for m in messages if isinstance(m, ModelRequest) for p in m.parts):
            yield {0: DeltaToolCall(name="refund", json_args=json.dumps({"order": "A"}), tool_call_id="c1")}
            return
        yield "all "
        yield "done"

    ledger = SqliteCheckpointer(tmp_path / "ledger.db")
    agent = Agent(FunctionModel(stream_function=stream), name="streamer", capabilities=[LedgerDurability(ledger)])

    @agent.tool_plain
    def refund(order: str) -> str:
        ran.append(order)
        return "refunded"

    async def streamed() -> str:
        async with agent.run_stream("go", run_id="s1") as run:
            return "".join([chunk async for chunk in run.stream_text(delta=True)])

    async def iterated() -> Any:
        async with agent.iter("go", run_id="s1") as run:
            async for _ in run:
                pass
        assert run.result is not None
        return run.result.output

    assert asyncio.run(streamed()) == "all done"
    assert (ran, asked) == (["A"], [1, 3])
    assert asyncio.run(streamed()) == "all done" and asyncio.run(iterated()) == "all done"
    assert (ran, asked) == (["A"], [1, 3])
    ledger.close()


def test_a_streamed_run_that_ends_on_a_deferred_call_keeps_its_other_calls_records(tmp_path: Path) -> None:
    """``run_stream`` runs the calls of a response that ends the run (here the refund waits for approval, the email
    beside it runs) before that response joins the run's history: the ledger keys them by the run's latest
    response all the same, so the same run again replays the email (found by the crash matrix's ``stream`` mode:
    it was run again, its record never found)."""
    from pytest_replaysafe.run.effects import Effects
    from tenxgraph.utils.sync import run_sync

    effects_db = tmp_path / "effects.db"
    ledger = SqliteCheckpointer(tmp_path / "ledger.db")
    agent = support.build_agent(Effects(effects_db), ledger, approval=True)

    async def streamed() -> tuple[object, list[Any]]:
        async with agent.run_stream(PROMPT, run_id="r1") as run:
            async for _ in run.stream_output(debounce_by=None):
                pass
            return await run.get_output(), list(run.all_messages())

    first, second = run_sync(streamed()), run_sync(streamed())
    assert [call.tool_name for call in first[0].approvals] == ["refund"]  # type: ignore[attr-defined]
    assert kinds(effects_db) == Counter({"email": 1})
    assert second[1][-1].parts[0].content == first[1][-1].parts[0].content  # (the email's recorded result)
    ledger.close()


def test_a_harness_completion_order_takes_only_the_calls_pydantic_ai_runs(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """Under a test harness's completion order, a step's calls take turns among those Pydantic AI runs in it: a
    call deferred for its approval, or skipped on resume, never comes in, and its siblings must not wait for it
    (they did: 5 s each, the order given up with a WARNING, a crash-matrix cell 45 s instead of 0.6 s)."""
    from pydantic_ai import DeferredToolRequests, DeferredToolResults

    from tenxgraph.core.graph.utils.instrument import set_completion_order
    from tenxgraph.integrations.pydantic_ai import resume_once

    asked: list[list[int]] = []

    def backwards(calls: list[Any]) -> list[int]:
        asked.append([call.index for call in calls])
        return [call.index for call in reversed(calls)]

    ledger = SqliteCheckpointer(tmp_path / "ledger.db")
    remove = set_completion_order(backwards)
    try:
        plain = support.build_agent(LocalProvider(), ledger=ledger)
        assert plain.run_sync(PROMPT, run_id="plain").output == support.FINAL
        assert asked == [[0, 1]]  # (the refund and the email, together; the receipt alone takes no turn)
        provider = LocalProvider()
        agent = support.build_agent(provider, ledger=ledger, approval=True)
        paused = agent.run_sync(PROMPT, run_id="asks")
        assert isinstance(paused.output, DeferredToolRequests)
        approval = DeferredToolResults(approvals={paused.output.approvals[0].tool_call_id: True})
        done = resume_once(agent, approval, message_history=paused.all_messages())
        assert done.output == support.FINAL
    finally:
        remove()
        ledger.close()
    assert asked == [[0, 1]]  # (the email ran alone, then the refund alone: neither waited for the other)
    assert Counter(kind for kind, _ in provider.effects) == Counter({"refund": 1, "email": 1, "receipt": 1})
    assert "completion order of a batch was not kept" not in caplog.text


def test_a_run_resumed_with_another_prompt_is_refused_before_anything_runs(tmp_path: Path) -> None:
    """A run's journal holds the model turns of the prompt it was started with: the same ``run_id`` given another
    prompt is refused, naming the run and the fix, before the model is asked or a tool runs (it was answered with
    the first prompt's turns); the same prompt again resumes it, and a new run_id is a new run."""
    provider = LocalProvider()
    ledger = SqliteCheckpointer(tmp_path / "ledger.db")
    agent = support.build_agent(provider, ledger=ledger)
    assert agent.run_sync(PROMPT, run_id="r1").output == support.FINAL
    support.ASKED.clear()
    with pytest.raises(ConfigError, match=r"run 'r1' was started with another user prompt .*another run_id"):
        agent.run_sync("Refund order A-2077 instead", run_id="r1")
    assert support.ASKED == [] and len(provider.effects) == 3
    assert agent.run_sync(PROMPT, run_id="r1").output == support.FINAL
    assert agent.run_sync("Refund order A-2077 instead", run_id="r2").output == support.FINAL
    assert len(provider.effects) == 6
    ledger.close()


def test_an_mcp_toolsets_calls_go_through_the_ledger_with_the_key_in_meta(tmp_path: Path) -> None:
    """Pydantic AI's own ``MCPToolset`` over our ticket server (a real MCP server, a process of its own): the call
    is recorded (the same run again opens no second ticket), the server got the call's idempotency key in
    ``_meta``, and each tool's effect class comes from its MCP annotations."""
    pytest.importorskip("fastmcp", reason="Pydantic AI's MCP toolsets need its mcp extra: pydantic-ai-slim[mcp]")
    from fastmcp.client.transports import StdioTransport
    from pydantic_ai.mcp import MCPToolset
    from pydantic_ai.messages import ModelRequest, ToolReturnPart

    from tenxgraph.integrations.pydantic_ai import send_idempotency_key

    def model(messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
        if not any(isinstance(p, ToolReturnPart) for m in messages if isinstance(m, ModelRequest) for p in m.parts):
            return ModelResponse(parts=[ToolCallPart("open_ticket", {"title": "refund A-1042"}, tool_call_id="t1")])
        return ModelResponse(parts=[TextPart("opened")])

    tickets_db = tmp_path / "tickets.db"
    server = StdioTransport(
        command=sys.executable,
        args=["-m", "examples.mcp_tools.ticket_server", "--db", str(tickets_db)],
        env={**os.environ, "PYTHONPATH": str(ROOT), "TICKETS_DB": str(tickets_db)},
        cwd=str(ROOT),
    )
    effects_seen: list[str | None] = []

    async def sending(ctx: Any, call_tool: Any, name: str, args: dict[str, Any]) -> Any:
        from tenxgraph.ledger import current_tool_call

        call = current_tool_call()
        effects_seen.append(call.effect if call is not None else None)  # (the class the ledger ran it with)
        return await send_idempotency_key(ctx, call_tool, name, args)

    toolset = MCPToolset(server, id="tickets", process_tool_call=sending)
    ledger = SqliteCheckpointer(tmp_path / "ledger.db")
    durability = LedgerDurability(ledger)
    agent = Agent(FunctionModel(model), name="desk", toolsets=[toolset], capabilities=[durability])
    assert agent.run_sync("open a ticket", run_id="m1").output == "opened"
    assert agent.run_sync("open a ticket", run_id="m1").output == "opened"
    with sqlite3.connect(tickets_db) as conn:
        rows = conn.execute("SELECT title, meta_key FROM tickets").fetchall()
    assert len(rows) == 1 and rows[0][1].startswith("tenx-")
    assert effects_seen == ["external"]  # (open_ticket's annotations: a write, not idempotent; run once)
    read = {"annotations": {"readOnlyHint": True, "idempotentHint": True}}
    adds = {"annotations": {"readOnlyHint": False, "idempotentHint": False}}
    assert (durability.policy_of("get_ticket", read).effect, durability.policy_of("open_ticket", adds).effect) == (
        Effect.READ, Effect.EXTERNAL)  # fmt: skip
    ledger.close()


def test_a_tool_that_raised_is_not_run_again_and_a_resumed_run_tells_the_model(tmp_path: Path) -> None:
    ran: list[str] = []
    seen: list[str] = []

    def model(messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
        if len(messages) == 1:
            return ModelResponse(parts=[ToolCallPart("charge", {"order": "A"})])
        seen.append(str(messages[-1].parts[0]))
        return ModelResponse(parts=[TextPart("done")])

    ledger = SqliteCheckpointer(tmp_path / "ledger.db")
    agent = Agent(FunctionModel(model), name="billing", capabilities=[LedgerDurability(ledger)])

    @agent.tool_plain
    def charge(order: str) -> str:
        ran.append(order)
        raise RuntimeError("card declined")

    with pytest.raises(RuntimeError, match="card declined"):  # (the run that ran it: its own exception)
        agent.run_sync("go", run_id="r")
    assert agent.run_sync("go", run_id="r").output == "done"
    assert ran == ["A"]
    assert len(seen) == 1 and "card declined" in seen[0]
    ledger.close()


def test_declarations_are_checked_and_named(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="not a tenxgraph ledger store"):
        LedgerDurability(object())  # type: ignore[arg-type]
    ledger = SqliteCheckpointer(tmp_path / "ledger.db")

    def model(messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
        if len(messages) == 1:
            return ModelResponse(parts=[ToolCallPart("book", {})])
        return ModelResponse(parts=[TextPart("done")])

    # a transactional tool on a ledger that runs no transaction (tests/test_pydantic_ai_transactional.py: on one)
    agent = Agent(FunctionModel(model), name="books", capabilities=[LedgerDurability(InMemoryCheckpointer())])

    @agent.tool_plain(metadata={"effect": "transactional"})
    def book() -> str:
        return "booked"

    with pytest.raises(ConfigError, match="'book': effect='transactional' writes in the ledger's own transaction"):
        agent.run_sync("go", run_id="r")
    with pytest.raises(UserError, match="name"):  # (Pydantic AI's own check: a durable agent needs a name)
        Agent(FunctionModel(model), capabilities=[LedgerDurability(ledger)])
    ledger.close()


def test_a_tools_effect_class_comes_from_its_metadata_or_its_mcp_hints(tmp_path: Path) -> None:
    """``metadata={"effect": "read"}``, or the MCP annotations an MCP toolset's tools carry."""
    ledger = SqliteCheckpointer(tmp_path / "ledger.db")
    durability: Any = LedgerDurability(ledger)
    assert durability.policy_of("lookup", {"effect": "read"}).effect.value == "read"
    assert durability.policy_of("lookup", {"readOnlyHint": True}).effect.value == "read"
    ledger.close()
