"""A support agent whose tools come from an MCP server: examples/mcp_tools/ticket_server.py (built with the official
``mcp`` SDK), started as a subprocess. Offline, with a ScriptedModel."""

from __future__ import annotations

import contextlib
import socket
import subprocess
import sys
import time
import urllib.request
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from tenxgraph import CompiledGraph, ReactAgent, Reply, ScriptedModel
from tenxgraph.integrations.mcp import MCPSession, mcp_tools
from tenxgraph.storage.checkpointer import BaseCheckpointer

ROOT = Path(__file__).resolve().parents[2]


def ticket_server(db: str | Path) -> MCPSession:
    """The ticket desk, its rows in *db* (a file of its own, outside the agent's process)."""
    args = ["-m", "examples.mcp_tools.ticket_server", "--db", str(db)]
    return MCPSession.stdio(sys.executable, args, cwd=str(ROOT), name="tickets", trusted=True)  # (our own server)


@contextlib.contextmanager
def ticket_server_over_http(db: str | Path, log: str | Path) -> Iterator[str]:
    """The ticket desk as a long-running server on a free loopback port, reached over streamable HTTP: its URL.
    Stopped on exit; its log goes to *log*."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    args = [sys.executable, "-m", "examples.mcp_tools.ticket_server", "--db", str(db), "--http", "--port", str(port)]
    with open(log, "ab") as out:
        server = subprocess.Popen(args, cwd=ROOT, stdout=out, stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}/mcp"
    try:
        for _ in range(300):  # up to 30 s to start answering
            try:
                urllib.request.urlopen(url, timeout=1)
            except urllib.error.HTTPError:
                break  # it answers (a GET without a session is refused): it is up
            except OSError:
                if server.poll() is not None:
                    raise RuntimeError(f"the ticket server exited with {server.returncode}; its log: {log}") from None
                time.sleep(0.1)
        yield url
    finally:
        server.terminate()
        server.wait(timeout=30)


def build_agent(session: MCPSession, checkpointer: BaseCheckpointer | None = None) -> CompiledGraph[Any]:
    """Open a ticket and refund the order at once, note the refund on the ticket and read it back, answer."""
    model = ScriptedModel(
        [
            Reply(
                tool_calls=[
                    ("open_ticket", {"title": "refund order 1042"}),
                    ("refund", {"order_id": "1042", "amount": 20.0}),
                ]
            ),
            Reply(tool_calls=[("add_note", {"ticket": 1, "note": "refunded 20.00"}), ("get_ticket", {"ticket": 1})]),
            "Refunded 20.00 EUR on order 1042; ticket opened.",
        ]
    )
    tools = mcp_tools(session)  # open_ticket: external, refund and add_note: idempotent, get_ticket: read
    return ReactAgent(model, tools=tools).compile(checkpointer=checkpointer)


def git_server() -> MCPSession:
    """The official git MCP server (``mcp-server-git``, from the package index), as published."""
    return MCPSession.stdio(sys.executable, ["-m", "mcp_server_git"], name="git", trusted=True)  # (published)


def build_release_agent(git: MCPSession, repo: str | Path, checkpointer: BaseCheckpointer | None = None) -> Any:
    """Write the release notes (a tool of our own), stage them and commit them with the git server's tools:
    ``git_add`` is idempotent by its annotations, ``git_commit`` is not (external: never run twice)."""
    notes = Path(repo) / "NOTES.md"

    def write_notes() -> str:
        """Write this release's notes."""
        notes.write_text(f"release notes {uuid.uuid4().hex}\n")
        return "notes written"

    model = ScriptedModel(
        [
            Reply(tool_calls=[("write_notes", {})]),
            Reply(tool_calls=[("git_add", {"repo_path": str(repo), "files": ["NOTES.md"]})]),
            Reply(tool_calls=[("git_commit", {"repo_path": str(repo), "message": "release notes"})]),
            "Committed the release notes.",
        ]
    )
    tools = [write_notes, *mcp_tools(git, only=["git_add", "git_commit"])]
    return ReactAgent(model, tools=tools).compile(checkpointer=checkpointer)


def new_repo(root: str | Path) -> Path:
    """A fresh git repository under *root*, with a first commit (the release agent's workspace)."""
    repo = Path(root) / uuid.uuid4().hex
    repo.mkdir(parents=True)
    for args in (["init", "-q"], ["config", "user.email", "ci@example.com"], ["config", "user.name", "ci"]):
        subprocess.run(["git", *args], cwd=repo, check=True)
    (repo / "NOTES.md").write_text("none yet\n")
    subprocess.run(["git", "add", "NOTES.md"], cwd=repo, check=True)
    subprocess.run(["git", "commit", "-qm", "start"], cwd=repo, check=True)
    return repo
