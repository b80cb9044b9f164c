"""One support agent on LangGraph's real savers, whose refund waits for a person: run as a process, it resumes the
parked thread with the answer it is given, after a barrier, so that k of them resume one pause at once.

``python tests/langgraph_resumers.py '<json>'`` with ``{"where": ..., "node": "wrapped" | "bare", "ask":
"interrupt" | "approval", "answer": ..., "ready": path, "go": path}`` (and ``"after": "receipt"``: the model's
turn after the refund asks for a receipt email; ``"via": "resume_once"``: it resumes through
``tenxgraph.integrations.langgraph.resume_once``) prints one JSON line: what its resume
returned (the tool message) or raised. Effects are counted outside the runtime: the refund appends a line to
``<where>/effects`` (one ``write`` of an ``O_APPEND`` file: lines of processes never mix)."""

from __future__ import annotations

import json
import os
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from langchain_core.messages import AIMessage, HumanMessage
from langchain_core.tools import tool
from langgraph.graph import MessagesState, StateGraph
from langgraph.prebuilt import ToolNode, tools_condition
from langgraph.types import Command, interrupt

from tenxgraph.integrations.langgraph import ReplaySafeToolNode, resume_once
from tenxgraph.storage.checkpointer import BaseCheckpointer, SqliteCheckpointer

CFG = {"configurable": {"thread_id": "ticket-7"}}
#: How long the refund takes before its effect: k resumers that start together overlap in it.
REFUND_S = 0.3


def effects(where: Path) -> list[str]:
    path = where / "effects"
    return path.read_text().splitlines() if path.exists() else []


def record_effect(where: Path, kind: str, order_id: str) -> None:
    """One effect, as a line of ``<where>/effects`` (one ``write`` of an ``O_APPEND`` file)."""
    fd = os.open(where / "effects", os.O_WRONLY | os.O_APPEND | os.O_CREAT)
    try:
        os.write(fd, f"{kind} {order_id} pid={os.getpid()}\n".encode())
    finally:
        os.close(fd)


def build(spec: dict[str, Any], ledger: BaseCheckpointer, saver: Any) -> Any:
    where, asks = Path(spec["where"]), spec["ask"]

    @tool
    def refund_order(order_id: str) -> str:
        """Refund an order (a person says yes first)."""
        answer: Any = interrupt(f"refund {order_id}?") if asks == "interrupt" else True
        time.sleep(REFUND_S)
        if answer not in (True, "yes"):
            return f"not refunded {order_id}: {answer}"
        record_effect(where, "refund", order_id)
        return f"refunded {order_id}"

    @tool
    def send_receipt(order_id: str) -> str:
        """Email the customer a receipt."""
        record_effect(where, "receipt", order_id)
        return f"receipt sent for {order_id}"

    def model(state: MessagesState) -> dict[str, Any]:
        done = [m.name for m in state["messages"] if m.type == "tool"]
        if done == ["refund_order"] and spec.get("after") == "receipt":  # (a new message: a new id per process)
            call = {"name": "send_receipt", "args": {"order_id": "A-7"}, "id": "call_2"}
            return {"messages": [AIMessage("", tool_calls=[call])]}
        if done:
            return {"messages": [AIMessage("done")]}
        call = {"name": "refund_order", "args": {"order_id": "A-7"}, "id": "call_1"}
        return {"messages": [AIMessage("", tool_calls=[call], id="ai-1")]}

    if spec["node"] == "bare":
        node: Any = ToolNode([refund_order, send_receipt])
    else:
        approvals = {"refund_order": True} if asks == "approval" else None
        node = ReplaySafeToolNode([refund_order, send_receipt], ledger=ledger, approvals=approvals)
    graph = StateGraph(MessagesState)
    graph.add_node("agent", model)
    graph.add_node("tools", node)
    graph.set_entry_point("agent")
    graph.add_conditional_edges("agent", tools_condition)
    graph.add_edge("tools", "agent")
    return graph.compile(checkpointer=saver)


@contextmanager
def opened(spec: dict[str, Any]) -> Iterator[tuple[BaseCheckpointer, Any]]:
    """The ledger and LangGraph's saver of *spec*: SQLite files in its folder, or two PostgreSQL schemas."""
    if spec.get("dsn"):
        import psycopg
        from langgraph.checkpoint.postgres import PostgresSaver
        from psycopg.rows import dict_row

        from tenxgraph.storage.checkpointer.pg import PgCheckpointer

        ledger: BaseCheckpointer = PgCheckpointer(postgres_dsn=spec["dsn"], schema=spec["schema"])
        conn = psycopg.Connection.connect(
            spec["dsn"], autocommit=True, prepare_threshold=0, row_factory=dict_row,
            options=f"-c search_path={spec['lg_schema']}",
        )  # fmt: skip
        saver: Any = PostgresSaver(conn)  # type: ignore[arg-type]
    else:
        import sqlite3

        from langgraph.checkpoint.sqlite import SqliteSaver

        ledger = SqliteCheckpointer(Path(spec["where"]) / "ledger.db")
        conn = sqlite3.connect(Path(spec["where"]) / "langgraph.db", check_same_thread=False)  # type: ignore[assignment]
        saver = SqliteSaver(conn)  # type: ignore[arg-type]
    try:
        yield ledger, saver
    finally:
        conn.close()
        ledger.close()


def setup(spec: dict[str, Any]) -> dict[str, Any]:
    """Create LangGraph's tables and park the thread at the refund's question: what the first run returned."""
    if spec.get("dsn"):
        import psycopg

        with psycopg.connect(spec["dsn"], autocommit=True) as conn:
            conn.execute(f'CREATE SCHEMA IF NOT EXISTS "{spec["lg_schema"]}"')
    with opened(spec) as (ledger, saver):
        saver.setup()
        app = build(spec, ledger, saver)
        return dict(app.invoke({"messages": [HumanMessage("refund A-7")]}, CFG, durability="sync"))


def final_state(spec: dict[str, Any]) -> tuple[list[Any], dict[str, Any]]:
    """The thread's stored messages (LangGraph's saver) and the ledger's records."""
    with opened(spec) as (ledger, saver):
        app = build(spec, ledger, saver)
        return list(app.get_state(CFG).values.get("messages", [])), ledger.list_tool_results("ticket-7")


def mutate(name: str) -> None:
    """Break consume-once in this process, one way (the mutants the test must catch, each for its own reason)."""
    from contextlib import asynccontextmanager

    from tenxgraph.integrations.langgraph import pauses

    async def forget(*args: Any) -> None:
        return None

    @asynccontextmanager
    async def unlocked(*args: Any) -> Any:
        yield

    if name == "no_call_lock":
        pauses.call_lock = unlocked  # type: ignore[assignment]
    elif name == "answers_unrecorded":
        pauses.settle_answers = forget  # type: ignore[assignment]
    else:
        raise ValueError(f"no mutant named {name!r}")


def resume(spec: dict[str, Any]) -> dict[str, Any]:
    if spec.get("mutant"):
        mutate(spec["mutant"])
    with opened(spec) as (ledger, saver):
        app = build(spec, ledger, saver)
        Path(spec["ready"]).touch()
        while not Path(spec["go"]).exists():
            time.sleep(0.005)
        try:
            if spec.get("via") == "resume_once":  # our helper: the rest of the thread runs in one resumer
                (pending,) = app.get_state(CFG).interrupts
                command = Command(resume={pending.id: spec["answer"]})
                result = resume_once(app, command, CFG, ledger=ledger, durability="sync")
            else:
                result = app.invoke(Command(resume=spec["answer"]), CFG, durability="sync")
        except Exception as exc:  # (what this resumer is told: the test reads it)
            return {"raised": type(exc).__name__, "message": str(exc)}
        tools = [m for m in result["messages"] if m.type == "tool"]
        return {"tool": [m.content for m in tools], "status": [m.status for m in tools]}


if __name__ == "__main__":
    print(json.dumps(resume(json.loads(sys.argv[1]))), flush=True)
