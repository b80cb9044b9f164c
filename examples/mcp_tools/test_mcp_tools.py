"""`pytest --crash-matrix examples/mcp_tools` kills (and crashes in-process) this agent at every crash point, on
SQLite and PostgreSQL, while its tools run in an MCP server process of their own; the server's effects are counted
in its own database, outside the agent's process."""

from __future__ import annotations

import sqlite3
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

pytest.importorskip("mcp.client.session", reason="the mcp extra is not installed: pip install '.[mcp]'")

from examples.mcp_tools.agent import build_agent, build_release_agent, git_server, new_repo, ticket_server_over_http
from pytest_replaysafe import CrashRun
from tenxgraph import Message
from tenxgraph.integrations.mcp import MCPSession

POINTS = [
    "run.before_node",
    "tool.before_ledger_read",
    "ledger.read_error",
    "tool.before_invoke",
    "tool.in_flight",
    "tool.after_return",
    "ledger.write_error",
    "tool.after_record",
    "node.after_complete",
    "run.after_advance",
]
#: Per tool, the server's table of its effects and the column holding the call's idempotency key.
WRITES = {"open_ticket": ("tickets", "meta_key"), "refund": ("refunds", "key"), "add_note": ("notes", "key")}


@pytest.fixture(scope="module")
def server_db(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("tickets") / "tickets.db"


@pytest.fixture(scope="module")
def session(server_db: Path) -> Iterator[MCPSession]:
    """One ticket server for the module, over streamable HTTP (a forked SIGKILL child opens its own session to it,
    as a new worker would)."""
    with (
        ticket_server_over_http(server_db, server_db.with_suffix(".log")) as url,
        MCPSession.http(url, trusted=True) as opened,  # (our own server: its annotations are its truth)
    ):
        yield opened


@pytest.mark.crash_matrix(points=POINTS, backends=["sqlite", "postgres"], modes=["inprocess", "sigkill"])
def test_mcp_tools_are_replay_safe(crash_run: CrashRun, session: MCPSession, server_db: Path) -> None:
    request = {"messages": [Message.text_message("refund order 1042")]}
    result = crash_run.invoke(build_agent(session, crash_run.checkpointer), request)
    assert result.final_text == "Refunded 20.00 EUR on order 1042; ticket opened."
    # what the server did, counted in its own database by each call's idempotency key: the idempotent writes once
    # (a re-run sends the same key), open_ticket (external) at most once (a call a crash left in doubt is not run
    # again: the model is told, and no second ticket is opened)
    keys = {(e.tool, e.ikey) for e in crash_run.entries(crash_run.thread_id) if e.event == "start" and e.ikey}
    assert {tool for tool, _ in keys} >= {"refund", "add_note"}  # (open_ticket never starts if killed before it)
    with sqlite3.connect(server_db) as db:
        for tool, key in keys:
            if tool in WRITES:
                table, column = WRITES[tool]
                rows = db.execute(f"SELECT count(*) FROM {table} WHERE {column} = ?", (key,)).fetchone()[0]
                assert rows == 1 or (rows == 0 and tool == "open_ticket"), f"{tool} applied {rows} times"
    doubted = [r for m in result.messages for r in m.tool_results if r.status == "in_doubt"]
    assert all("open_ticket" in str(r.output) for r in doubted)
    failed = [r.output for m in result.messages for r in m.tool_results if r.is_error and r.status != "in_doubt"]
    assert not failed, f"a call failed: {failed}"  # (no call of this run fails; one that did would skip its effect)


@pytest.fixture(scope="module")
def git() -> Iterator[MCPSession]:
    """The official git MCP server, one for the module (a forked SIGKILL child starts its own)."""
    with git_server() as session:
        yield session


#: The git test's points: those around each call and the node's end, in-process (the ticket test is the one killed
#: at every point: the git server is a process of its own either way).
GIT_POINTS = ["tool.before_invoke", "tool.in_flight", "tool.after_return", "tool.after_record", "node.after_complete"]


@pytest.mark.crash_matrix(points=GIT_POINTS, backends=["sqlite"], modes=["inprocess"])
def test_git_commits_through_the_official_server_are_replay_safe(
    crash_run: CrashRun, git: MCPSession, tmp_path_factory: pytest.TempPathFactory
) -> None:
    repo = new_repo(tmp_path_factory.mktemp("repos"))
    request = {"messages": [Message.text_message("commit the release notes")]}
    result = crash_run.invoke(build_release_agent(git, repo, crash_run.checkpointer), request)
    assert result.final_text == "Committed the release notes."
    # git_commit ran at most once on this hit's thread (a commit a crash left in doubt is not made again), and the
    # repository agrees: at most one commit per run on it (this execution's crashed run, and the clean run when this
    # is the test's first execution)
    commits = [e for e in crash_run.entries(crash_run.thread_id) if e.event == "start" and e.tool == "git_commit"]
    assert len(commits) <= 1
    count = subprocess.run(["git", "rev-list", "--count", "HEAD"], cwd=repo, capture_output=True, text=True)
    assert 0 <= int(count.stdout) - 1 <= 2
