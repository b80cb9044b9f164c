"""An MCP server (the official SDK's ``MCPServer``, as mcp 2.x names it) whose one tool tells whether a variable is
in its environment: tests/test_mcp_misbehaving.py starts it to see what ``MCPSession.stdio`` passes on."""

from __future__ import annotations

import os

from mcp.server.mcpserver import MCPServer
from mcp.types import ToolAnnotations

server = MCPServer("env")


@server.tool(annotations=ToolAnnotations(readOnlyHint=True))
def has(name: str) -> bool:
    """Whether *name* is set in this server's environment."""
    return name in os.environ


if __name__ == "__main__":
    server.run()
