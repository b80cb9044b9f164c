"""MCP tools through the ledger, against real servers over the official SDK: our ticket desk
(examples/mcp_tools/ticket_server.py, stdio and streamable HTTP) and the official git server from the package index
(``mcp-server-git``), whose effects are counted where they land (the desk's rows, the repository's commits)."""

from __future__ import annotations

import os
import signal
import sqlite3
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("mcp.client.session", reason="the mcp extra is not installed: pip install '.[mcp]'")

from examples.mcp_tools.agent import ROOT, new_repo, ticket_server, ticket_server_over_http
from tenxgraph import ConfigError, Message, ReactAgent, Reply, ScriptedModel
from tenxgraph.core import crashpoints
from tenxgraph.core.crashpoints import CrashInjected
from tenxgraph.core.tools.effects import Effect
from tenxgraph.integrations.mcp import KEY_META, MCPSession, ToolOptions, mcp_tools
from tenxgraph.storage.checkpointer import SqliteCheckpointer
from tenxgraph.utils.errors import ToolUnavailableError

GO = {"messages": [Message.text_message("go", message_id="req-1")]}


@pytest.fixture
def desk(tmp_path: Path) -> Iterator[tuple[MCPSession, Path]]:
    db = tmp_path / "tickets.db"
    with ticket_server(db) as session:
        yield session, db


def rows(db: Path, sql: str, *args: Any) -> list[tuple[Any, ...]]:
    with sqlite3.connect(db) as conn:
        return conn.execute(sql, args).fetchall()


def agent(session: MCPSession, cp: Any, replies: list[Any], options: ToolOptions | None = None) -> Any:
    return ReactAgent(ScriptedModel(replies), tools=mcp_tools(session, options)).compile(checkpointer=cp)


@pytest.fixture
def repo(tmp_path: Path) -> Path:
    repo = new_repo(tmp_path)
    (repo / "notes.md").write_text("v1\n")
    subprocess.run(["git", "add", "notes.md"], cwd=repo, check=True)
    subprocess.run(["git", "commit", "-qm", "init"], cwd=repo, check=True)
    return repo


def git_server(repo: Path, trusted: bool = True) -> MCPSession:
    args = ["-m", "mcp_server_git", "--repository", str(repo)]
    return MCPSession.stdio(sys.executable, args, name="git", trusted=trusted)


def commits(repo: Path) -> int:
    return int(subprocess.run(["git", "rev-list", "--count", "HEAD"], cwd=repo, capture_output=True, text=True,
                              check=True).stdout)  # fmt: skip


def test_tools_get_their_effect_class_from_their_annotations(desk: tuple[MCPSession, Path], repo: Path) -> None:
    session, _ = desk
    ours = {t.name: (t.effect, t.policy, t.recorded) for t in mcp_tools(session)}
    assert ours["get_ticket"] == (Effect.READ, None, False)  # readOnlyHint: may simply run again
    assert ours["add_note"] == (Effect.IDEMPOTENT, None, True)  # idempotentHint: re-run with the same key
    assert ours["open_ticket"] == (Effect.EXTERNAL, "fail", True)  # a write that is not idempotent: watched
    with git_server(repo) as git:  # the official git server, as published
        theirs = {t.name: t.effect for t in mcp_tools(git)}
    assert theirs["git_status"] == theirs["git_log"] == Effect.READ
    assert theirs["git_add"] == theirs["git_reset"] == Effect.IDEMPOTENT
    assert theirs["git_commit"] == theirs["git_create_branch"] == theirs["git_checkout"] == Effect.EXTERNAL
    with git_server(repo, trusted=False) as untrusted:  # a server not marked trusted: its hints are only hints
        hinted = {t.name: (t.effect, t.policy) for t in mcp_tools(untrusted)}
        told = {t.name: t.effect for t in mcp_tools(untrusted, ToolOptions(effects={"git_status": "read"}))}
    assert set(hinted.values()) == {(Effect.EXTERNAL, "fail")}  # git_status too: every call recorded and watched
    assert told["git_status"] == Effect.READ  # what its user says still counts
    changed = {t.name: t.effect for t in mcp_tools(session, ToolOptions(effects={"get_ticket": "external"}))}
    assert changed["get_ticket"] == Effect.EXTERNAL
    with pytest.raises(ConfigError, match=r"MCP server 'tickets' has no tool \['close_ticket'\]; its tools: \["):
        mcp_tools(session, ToolOptions(effects={"close_ticket": "read"}))
    with pytest.raises(ConfigError, match=r"MCP tool 'get_ticket' of server 'tickets': effect='read' with on_in_"):
        mcp_tools(session, ToolOptions(on_in_doubt={"get_ticket": "fail"}))


def test_the_call_key_reaches_the_server_in_meta_and_as_its_declared_argument(
    desk: tuple[MCPSession, Path], tmp_path: Path
) -> None:
    session, db = desk
    tools = {t.name: t for t in mcp_tools(session)}
    assert "idempotency_key" not in tools["refund"].parameters["properties"]  # the model never sees it
    assert tools["refund"].parameters["required"] == ["order_id", "amount"]
    replies = [Reply(tool_calls=[("open_ticket", {"title": "a"}), ("refund", {"order_id": "7", "amount": 5.0})]), "ok"]
    cp = SqliteCheckpointer(tmp_path / "agent.db")
    result = agent(session, cp, replies).invoke(GO, {"thread_id": "t"})
    ((ticket_key,),) = rows(db, "SELECT meta_key FROM tickets")
    ((refund_key,),) = rows(db, "SELECT key FROM refunds")
    assert ticket_key.startswith("tenx-") and refund_key.startswith("tenx-") and ticket_key != refund_key
    assert result.messages[3].tool_results[0].output == {"refund_id": "R-1", "order_id": "7", "amount": 5.0}
    assert KEY_META == "tenxgraph/idempotency-key"


def test_a_recorded_call_is_replayed_and_never_sent_to_the_server_again(
    desk: tuple[MCPSession, Path], tmp_path: Path
) -> None:
    session, db = desk
    replies = [Reply(tool_calls=[("open_ticket", {"title": "a"})]), "ok"]
    cp = SqliteCheckpointer(tmp_path / "agent.db")
    with crashpoints.armed("node.after_complete", 2), pytest.raises(CrashInjected):  # after the tool node
        agent(session, cp, replies).invoke(GO, {"thread_id": "t"})
    done = agent(session, cp, replies).invoke(None, {"thread_id": "t"})
    assert rows(db, "SELECT count(*) FROM tickets") == [(1,)]
    assert done.messages[2].tool_results[0].output == "opened ticket #1: a" and done.final_text == "ok"


def test_a_call_a_crash_left_in_doubt_is_not_sent_again(desk: tuple[MCPSession, Path], tmp_path: Path) -> None:
    session, db = desk
    replies = [Reply(tool_calls=[("open_ticket", {"title": "a"})]), "ok"]
    cp = SqliteCheckpointer(tmp_path / "agent.db")
    with crashpoints.armed("tool.in_flight", 1), pytest.raises(CrashInjected):  # the server opened it; no answer
        agent(session, cp, replies).invoke(GO, {"thread_id": "t"})
    done = agent(session, cp, replies).invoke(None, {"thread_id": "t"})
    assert rows(db, "SELECT count(*) FROM tickets") == [(1,)]
    (answer,) = done.messages[2].tool_results
    assert answer.status == "in_doubt" and "'open_ticket' is in doubt" in str(answer.output)


def test_an_error_the_server_answers_is_recorded_like_a_result(desk: tuple[MCPSession, Path], tmp_path: Path) -> None:
    session, _ = desk
    options = ToolOptions(effects={"get_ticket": "external"})  # recorded, so that its replay can be checked
    replies = [Reply(tool_calls=[("get_ticket", {"ticket": 99})]), "ok"]
    cp = SqliteCheckpointer(tmp_path / "agent.db")
    result = agent(session, cp, replies, options).invoke(GO, {"thread_id": "t"})
    (answer,) = result.messages[2].tool_results
    assert answer.is_error and "no ticket #99" in str(answer.output)
    (record,) = cp.list_tool_results("t").values()
    assert record["is_error"] is True and "no ticket #99" in str(record["output"])


def test_a_server_that_cannot_start_is_an_error_naming_it(tmp_path: Path) -> None:
    missing = MCPSession.stdio(str(tmp_path / "no-such-server"), ["--x"], name="ghost")
    with pytest.raises(ToolUnavailableError, match=r"MCP server 'ghost' \(.*no-such-server --x\) could not be"):
        mcp_tools(missing)
    crashing = MCPSession.stdio(sys.executable, ["-c", "import sys; print('bad config: no token', file=sys.stderr)"],
                                name="crashy")  # fmt: skip
    started = time.monotonic()
    with pytest.raises(ToolUnavailableError, match=r"'crashy'.*its stderr ended with: bad config: no token"):
        mcp_tools(crashing)
    assert time.monotonic() - started < 10


def test_a_server_that_exits_mid_run_stops_the_node_naming_it_and_a_resume_reconnects(
    desk: tuple[MCPSession, Path], tmp_path: Path
) -> None:
    session, db = desk
    replies = [
        Reply(tool_calls=[("exit_server", {"code": 3})]),
        Reply(tool_calls=[("open_ticket", {"title": "a"})]),
        "ok",
    ]
    cp = SqliteCheckpointer(tmp_path / "agent.db")
    started = time.monotonic()
    with pytest.raises(ToolUnavailableError, match=r"MCP server 'tickets' .* went away during the call to 'exit_s"):
        agent(session, cp, replies).invoke(GO, {"thread_id": "t"})
    assert time.monotonic() - started < 10  # not a hang
    assert cp.get_thread("t").values["meta"]["status"] == "error"  # type: ignore[union-attr]
    done = agent(session, cp, replies).invoke(None, {"thread_id": "t"})  # reconnects; the call is in doubt
    assert done.messages[2].tool_results[0].status == "in_doubt" and done.final_text == "ok"
    assert rows(db, "SELECT title FROM tickets") == [("a",)]


def test_a_forked_child_opens_its_own_session(desk: tuple[MCPSession, Path]) -> None:
    session, db = desk
    mcp_tools(session)  # the parent is connected
    pid = os.fork()
    if pid == 0:  # the child: its own server, never the parent's pipes
        code = 0
        try:
            from tenxgraph.utils.sync import run_sync

            run_sync(session.acall_tool("open_ticket", {"title": "child"}, {KEY_META: "k-child"}))
        except BaseException:
            code = 1
        os._exit(code)
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0
    from tenxgraph.utils.sync import run_sync

    run_sync(session.acall_tool("open_ticket", {"title": "parent"}, {KEY_META: "k-parent"}))
    assert sorted(rows(db, "SELECT title FROM tickets")) == [("child",), ("parent",)]


def test_over_streamable_http(tmp_path: Path) -> None:
    db = tmp_path / "tickets.db"
    with ticket_server_over_http(db, tmp_path / "server.log") as url, MCPSession.http(url, name="desk") as session:
        replies = [Reply(tool_calls=[("open_ticket", {"title": "a"}), ("add_note", {"ticket": 1, "note": "n"})]), "ok"]
        result = agent(session, SqliteCheckpointer(tmp_path / "agent.db"), replies).invoke(GO, {"thread_id": "t"})
        assert result.final_text == "ok" and rows(db, "SELECT count(*) FROM notes") == [(1,)]


def test_tools_gone_after_a_restart_replay_their_records_and_answer_unknown(
    desk: tuple[MCPSession, Path], tmp_path: Path
) -> None:
    session, db = desk
    replies = [Reply(tool_calls=[("open_ticket", {"title": "a"})]), Reply(tool_calls=[("add_note", {"ticket": 1,
               "note": "n"})]), "ok"]  # fmt: skip
    cp = SqliteCheckpointer(tmp_path / "agent.db")
    with crashpoints.armed("tool.after_record", 1), pytest.raises(CrashInjected):  # open_ticket is recorded
        agent(session, cp, replies).invoke(GO, {"thread_id": "t"})
    fewer = ReactAgent(ScriptedModel(replies), tools=mcp_tools(session, only=["get_ticket"]))  # both are gone now
    done = fewer.compile(checkpointer=cp).invoke(None, {"thread_id": "t"})
    opened, noted = (m.tool_results[0] for m in done.messages if m.role == "tool")
    assert opened.output == "opened ticket #1: a" and not opened.is_error  # replayed from its record
    assert noted.is_error and "unknown tool 'add_note'; available tools: get_ticket" in str(noted.output)
    assert rows(db, "SELECT count(*) FROM tickets") == [(1,)] and rows(db, "SELECT count(*) FROM notes") == [(0,)]


def test_a_real_git_server_commits_once_across_a_kill(repo: Path, tmp_path: Path) -> None:
    """The official git server: git_add (idempotent), git_commit (external). The agent process is killed (-9)
    right after the server committed; the resumed run finds the commit in doubt and does not commit again."""
    child = f"""
import sys
sys.path[:0] = [{str(ROOT)!r}]
from tests.test_mcp import git_agent
git_agent({str(repo)!r}, {str(tmp_path / "agent.db")!r})
"""
    env = {**os.environ, crashpoints.ENV_CRASH_AT: "tool.in_flight:2:kill", crashpoints.ENV_CRASH_TEST: "1",
           crashpoints.ENV_MARKER: str(tmp_path / "marker")}  # fmt: skip
    (repo / "notes.md").write_text("v2\n")
    killed = subprocess.run([sys.executable, "-c", child], env=env, capture_output=True, timeout=120)
    assert killed.returncode == -signal.SIGKILL, killed.stderr.decode()[-2000:]
    assert commits(repo) == 3  # the server committed before the kill
    result = git_agent(str(repo), str(tmp_path / "agent.db"))
    assert commits(repo) == 3 and result.final_text == "committed"
    asked = next(i for i, m in enumerate(result.messages) if any(c.name == "git_commit" for c in m.tool_calls))
    (commit,) = result.messages[asked + 1].tool_results
    assert commit.status == "in_doubt" and "'git_commit' is in doubt" in str(commit.output)


def git_agent(repo: str, db: str) -> Any:
    replies = [
        Reply(tool_calls=[("git_add", {"repo_path": repo, "files": ["notes.md"]})]),
        Reply(tool_calls=[("git_commit", {"repo_path": repo, "message": "notes v2"})]),
        "committed",
    ]
    with git_server(Path(repo)) as git:
        cp = SqliteCheckpointer(db)
        app = ReactAgent(ScriptedModel(replies), tools=mcp_tools(git)).compile(checkpointer=cp)
        thread = {"thread_id": "release", "lock_timeout": 10}
        return app.invoke(None if cp.get_thread("release") else GO, thread)


def test_a_server_that_died_between_calls_is_reconnected_before_the_next(desk: tuple[MCPSession, Path]) -> None:
    session, db = desk
    from tenxgraph.utils.sync import run_sync

    run_sync(session.acall_tool("open_ticket", {"title": "before"}, {KEY_META: "k1"}))
    mine = [p for p in Path("/proc").iterdir() if p.name.isdigit() and str(db) in _cmdline(p)]
    assert len(mine) == 1
    os.kill(int(mine[0].name), signal.SIGKILL)  # the server dies while nothing is asked of it
    time.sleep(0.2)
    run_sync(session.acall_tool("open_ticket", {"title": "after"}, {KEY_META: "k2"}))  # a ping finds it gone
    assert rows(db, "SELECT title FROM tickets ORDER BY id") == [("before",), ("after",)]


def _cmdline(proc: Path) -> str:
    try:
        return (proc / "cmdline").read_bytes().replace(b"\0", b" ").decode()
    except OSError:
        return ""


def test_calls_that_find_the_server_gone_together_reconnect_it_once(desk: tuple[MCPSession, Path]) -> None:
    session, db = desk
    from tenxgraph.utils.sync import run_sync

    run_sync(session.acall_tool("open_ticket", {"title": "first"}, {KEY_META: "k0"}))
    (server,) = [p for p in Path("/proc").iterdir() if p.name.isdigit() and str(db) in _cmdline(p)]
    os.kill(int(server.name), signal.SIGKILL)
    time.sleep(0.2)

    async def both() -> None:
        import asyncio

        await asyncio.gather(*(session.acall_tool("open_ticket", {"title": t}, {KEY_META: t}) for t in "ab"))

    run_sync(both())
    servers = [p for p in Path("/proc").iterdir() if p.name.isdigit() and str(db) in _cmdline(p)]
    assert len(servers) == 1  # one new server, not one per call
    assert sorted(rows(db, "SELECT title FROM tickets")) == [("a",), ("b",), ("first",)]
