"""An HTTP API over a compiled graph (optional ``server`` extra: Starlette + uvicorn).

The server uses the checkpointer carried by the compiled graph, so a thread interrupted by a crashed server is
resumed by the next request to it, from any server process::

    POST /threads/{thread_id}/runs   {"messages": [{"role": "user", "text": "...", "message_id": "..."}],
                                      "config": {"tool_timeout": 60}}
    POST /threads/{thread_id}/runs/stream    (server-sent events; a body of {} resumes)
    GET  /threads/{thread_id}/state
    GET  /metrics                           (Prometheus text)
    GET  /healthz

Send each message with a stable ``message_id`` (for example the client's request id): a retried request then
finishes the interrupted run instead of adding the message twice. Without any request, the server's recovery
(:mod:`tenxgraph.server.recovery`) finishes interrupted threads on start-up and every 30 s.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from tenxgraph.server.app import create_app

__all__ = ["create_app"]


def __getattr__(name: str) -> Any:
    """``create_app`` is imported on first use: the package's other modules (the doors, the limits, the command
    line's options) work without the server extra installed."""
    if name == "create_app":
        from tenxgraph.server.app import create_app

        return create_app
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
