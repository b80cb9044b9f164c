"""An OpenAI Agents SDK agent's MCP servers through the ledger: the SDK's own ``MCPServerStdio`` talking to a real
MCP server (the ticket desk of examples/mcp_tools, its effects rows in a database of its own), the run crashed
between turns and resumed in a new store object: the finished call is replayed (no second ticket), the rest runs
once, each tool's effect class comes from its MCP annotations, and the server got each call's idempotency key."""

from __future__ import annotations

import asyncio
import sqlite3
import sys
import uuid
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("agents")
pytest.importorskip("mcp")

from agents import Agent, RunConfig
from agents.items import ModelResponse
from agents.mcp import MCPServerStdio
from agents.models.interface import Model
from agents.usage import Usage
from openai.types.responses import ResponseFunctionToolCall, ResponseOutputMessage, ResponseOutputText

from tenxgraph.integrations.openai_agents import idempotency_meta, replay_safe, run_replay_safe, to_messages
from tenxgraph.storage.checkpointer import SqliteCheckpointer
from tenxgraph.utils.errors import ConfigError
from tests.helpers import ROOT

OFFLINE = RunConfig(tracing_disabled=True)
DONE = "Ticket opened and noted."


class Desk(Model):
    """Opens a ticket, looks it up and notes it (one call per turn, new ids on every answer, as a provider's);
    *fail_at*: the turn at which the first process dies (its model call raises), once."""

    def __init__(self, fail_at: int | None = None) -> None:
        self.fail_at = fail_at

    async def get_response(self, system_instructions: Any, input: Any, *args: Any, **kwargs: Any) -> ModelResponse:
        turn = sum(1 for item in input if isinstance(item, dict) and item.get("type") == "function_call_output")
        if turn == self.fail_at:
            self.fail_at = None
            raise RuntimeError("the process died here")
        script = [("open_ticket", '{"title": "refund A-1042"}'), ("get_ticket", '{"ticket": 1}'),
                  ("add_note", '{"ticket": 1, "note": "refunded"}')]  # fmt: skip
        if turn < len(script):
            name, arguments = script[turn]
            ids = {"id": f"fc_{uuid.uuid4().hex}", "call_id": f"call_{uuid.uuid4().hex[:24]}"}
            call = ResponseFunctionToolCall(**ids, name=name, arguments=arguments, type="function_call",
                                            status="completed")  # fmt: skip
            return ModelResponse(output=[call], usage=Usage(requests=1), response_id=f"resp_{uuid.uuid4().hex}")
        text = ResponseOutputText(text=DONE, type="output_text", annotations=[])
        answer = ResponseOutputMessage(id=f"msg_{uuid.uuid4().hex}", role="assistant", status="completed",
                                       type="message", content=[text])  # fmt: skip
        return ModelResponse(output=[answer], usage=Usage(requests=1), response_id=f"resp_{uuid.uuid4().hex}")

    def stream_response(self, *args: Any, **kwargs: Any) -> Any:
        raise NotImplementedError


def desk(db: Path) -> MCPServerStdio:
    params = {"command": sys.executable, "args": ["-m", "examples.mcp_tools.ticket_server", "--db", str(db)],
              "cwd": str(ROOT)}  # fmt: skip
    return MCPServerStdio(params, name="tickets", tool_meta_resolver=idempotency_meta, cache_tools_list=True)


async def run(db: Path, ledger: Path, model: Desk, run_id: str = "run-1", **declared: Any) -> Any:
    async with desk(db) as server:
        agent = Agent(name="desk", instructions="Handle tickets.", model=model, mcp_servers=[server])
        durable = replay_safe(agent, ledger=SqliteCheckpointer(ledger), run_id=run_id, **declared)
        return to_messages(await run_replay_safe(durable, "open a ticket for A-1042", run_config=OFFLINE))


def rows(db: Path, table: str) -> list[tuple[Any, ...]]:
    with sqlite3.connect(db) as conn:
        return list(conn.execute(f"SELECT * FROM {table}"))


def test_a_run_crashed_between_mcp_calls_resumes_without_running_a_finished_one(tmp_path: Path) -> None:
    db, ledger = tmp_path / "tickets.db", tmp_path / "ledger.db"
    with pytest.raises(RuntimeError, match="the process died here"):
        asyncio.run(run(db, ledger, Desk(fail_at=2)))  # after open_ticket and get_ticket
    assert len(rows(db, "tickets")) == 1 and rows(db, "notes") == []
    resumed = asyncio.run(run(db, ledger, Desk()))
    assert resumed[-1].text == DONE
    tickets, notes = rows(db, "tickets"), rows(db, "notes")
    assert len(tickets) == 1 and len(notes) == 1  # the ticket was not opened again; the note added once
    assert tickets[0][2] and notes[0][3]  # each write carried its call's idempotency key in _meta
    again = asyncio.run(run(db, ledger, Desk()))  # (the run once more, all done: every write replayed)
    assert [m.tool_calls for m in again] == [m.tool_calls for m in resumed] and again[-1].text == DONE
    assert len(rows(db, "tickets")) == 1 and len(rows(db, "notes")) == 1
    looked = [r.output for m in again for r in m.tool_results if '"title"' in str(r.output)]
    assert len(looked) == 1 and "refunded" in str(looked[0])  # get_ticket (read-only) ran again: it sees the note
    records = SqliteCheckpointer(ledger)
    calls = [c for m in resumed for c in m.tool_calls]
    found = asyncio.run(records.aget_tool_results("run-1", [f"{m.message_id}:{c.id}" for m in resumed
                                                           for c in m.tool_calls]))  # fmt: skip
    recorded = {key.split(":")[-1] for key in found}
    names = {c.id: c.name for c in calls}
    assert {names[i] for i in recorded} == {"open_ticket", "add_note"}  # get_ticket is read-only: no record


def test_mcp_tools_declared_per_run_are_checked_against_the_servers_listing(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=r"\['close_ticket'\] are neither function tools of the agent nor"):
        asyncio.run(run(tmp_path / "t.db", tmp_path / "l.db", Desk(), effects={"close_ticket": "read"}))
    done = asyncio.run(run(tmp_path / "t.db", tmp_path / "l.db", Desk(), "run-2", effects={"get_ticket": "external"}))
    assert done[-1].text == DONE
