"""The idempotency key of an MCP tool call, sent to the server: :func:`send_idempotency_key`, a Pydantic AI
``ProcessToolCallback`` for ``MCPToolset(..., process_tool_call=send_idempotency_key)``. The call runs through the
ledger (its toolset's operations are durable units like a function tool's); the key travels in the request's
``_meta`` under :data:`KEY_META`, where our own MCP path puts it (docs/mcp.md), for a server that applies a key
once."""

from __future__ import annotations

from typing import Any

from tenxgraph.integrations.pydantic_ai.durability import current_idempotency_key

__all__ = ["KEY_META", "send_idempotency_key"]

#: Where the key travels in an MCP request's ``_meta`` (the same as ``tenxgraph.integrations.mcp.KEY_META``).
KEY_META = "tenxgraph/idempotency-key"


async def send_idempotency_key(ctx: Any, call_tool: Any, name: str, args: dict[str, Any]) -> Any:
    """Call the MCP tool with the ledger's idempotency key in ``_meta`` (none outside a recorded call)."""
    key = current_idempotency_key()
    return await call_tool(name, args, metadata={KEY_META: key} if key is not None else None)
