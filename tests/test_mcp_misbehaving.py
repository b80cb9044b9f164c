"""MCP servers that never answer (#49 items 16-18): a connect or a call that times out ends the server's process
and leaves nothing reading; the next call reconnects. Each test starts tests/bad_mcp_server.py and looks for its
process by a marker of its own."""

from __future__ import annotations

import asyncio
import sys
import time
from pathlib import Path

import pytest

pytest.importorskip("mcp.client.session", reason="the mcp extra is not installed: pip install '.[mcp]'")

from tenxgraph import Message, ReactAgent, Reply, ScriptedModel
from tenxgraph.integrations.mcp import MCPSession, mcp_tools
from tenxgraph.storage.checkpointer import SqliteCheckpointer
from tenxgraph.utils.errors import ToolUnavailableError

SERVER = Path(__file__).with_name("bad_mcp_server.py")


def server(mode: str, marker: Path) -> MCPSession:
    return MCPSession.stdio(sys.executable, [str(SERVER), mode, str(marker)], name="bad", connect_timeout=1)


def running(marker: Path) -> int:
    """How many processes have *marker* on their command line."""
    found = 0
    for cmdline in Path("/proc").glob("[0-9]*/cmdline"):
        try:
            found += str(marker).encode() in cmdline.read_bytes()
        except OSError:
            continue
    return found


def gone_within(marker: Path, seconds: float) -> bool:
    deadline = time.monotonic() + seconds
    while running(marker):
        if time.monotonic() > deadline:
            return False
        time.sleep(0.1)
    return True


@pytest.mark.parametrize("mode", ["init", "list"])
def test_a_connect_that_times_out_ends_the_servers_process(tmp_path: Path, mode: str) -> None:
    marker = tmp_path / f"bad-{mode}"
    session = server(mode, marker)
    try:
        for _ in range(2):  # each attempt: its own process, ended when it timed out (none left behind)
            started = time.monotonic()
            with pytest.raises(ToolUnavailableError, match="did not answer within 1s"):
                session.connect()
            assert time.monotonic() - started < 5
            assert gone_within(marker, 5), f"{running(marker)} server process(es) left running"
    finally:
        session.close()


def test_a_call_that_times_out_mid_answer_ends_the_server_and_the_next_reconnects(tmp_path: Path) -> None:
    marker = tmp_path / "bad-line"
    session = server("line", marker)
    try:
        tools = mcp_tools(session)
        assert running(marker) == 1
        model = ScriptedModel([Reply(tool_calls=[("slow", {})]), "ok"])
        app = ReactAgent(model, tools=tools).compile(SqliteCheckpointer(tmp_path / "a.db"))
        result = app.invoke({"messages": [Message.text_message("go")]}, {"thread_id": "t", "tool_timeout": 1})
        (answer,) = [r for m in result.messages for r in m.tool_results]
        assert answer.status == "timeout"
        assert gone_within(marker, 5), "the server still sends its endless line to a reader"
        assert [t.name for t in asyncio.run(session.aconnect())] == ["slow"] and running(marker) == 1  # reconnected
    finally:
        session.close()


# -- #50 item 5: what a session tells its user ------------------------------------------------------------------------
def test_a_stdio_server_gets_the_sdks_default_environment_unless_told_to_inherit(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("AGENT_SECRET_FOR_TEST", "x")
    script = [str(Path(__file__).with_name("env_mcp_server.py"))]
    answers = {}
    for inherit in (False, True):
        with MCPSession.stdio(sys.executable, script, name="env", inherit_env=inherit) as session:
            asyncio.run(session.aconnect())
            result = asyncio.run(session.acall_tool("has", {"name": "AGENT_SECRET_FOR_TEST"}, {}))
            answers[inherit] = result.structured_content
    assert answers == {False: {"result": False}, True: {"result": True}}


def test_a_server_that_prints_something_else_is_named_with_what_it_printed(tmp_path: Path) -> None:
    chatty = tmp_path / "chatty.py"
    chatty.write_text("import time\nprint('Welcome to the ticket server v2!', flush=True)\ntime.sleep(30)\n")
    session = MCPSession.stdio(sys.executable, [str(chatty)], name="chatty", connect_timeout=1)
    try:
        with pytest.raises(ToolUnavailableError, match="it sent what is not MCP: 'Welcome to the ticket server v2!'"):
            session.connect()
    finally:
        session.close()


def test_a_policy_that_does_not_fit_is_told_in_tool_options_words(tmp_path: Path) -> None:
    from examples.mcp_tools.agent import ticket_server
    from tenxgraph.integrations.mcp import ToolOptions
    from tenxgraph.utils.errors import ConfigError

    with ticket_server(tmp_path / "t.db") as desk, pytest.raises(ConfigError) as refused:
        mcp_tools(desk, ToolOptions(on_in_doubt={"get_ticket": "fail"}))
    assert "say ToolOptions(effects={'get_ticket': 'external'})" in str(refused.value)
    assert "drop 'get_ticket' from ToolOptions(on_in_doubt=...)" in str(refused.value)
