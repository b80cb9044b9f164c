"""Replay-safe tools from any Model Context Protocol server (the ``mcp`` extra: ``pip install ".[mcp]"``, the
official ``mcp`` SDK).

- :class:`MCPSession`: one server, ``MCPSession.stdio(command, args)`` or ``MCPSession.http(url)``, connected on
  first use, reconnected after the server exits or in a forked process, closed by ``close()``.
- :func:`mcp_tools` / :func:`amcp_tools`: its tools as tenxgraph tools, for ``ReactAgent(tools=...)`` or a
  ``ToolNode``; effect classes from their annotations (:func:`effect_of`), overridable with :class:`ToolOptions`;
  the call's idempotency key in the request's ``_meta`` (:data:`KEY_META`).

See docs/mcp.md. Importing this package needs no ``mcp``; its names import it on first use.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from tenxgraph.utils.constants import install_hint
from tenxgraph.utils.lazy import lazy_names

if TYPE_CHECKING:
    from tenxgraph.integrations.mcp.session import MCPSession
    from tenxgraph.integrations.mcp.tools import KEY_META, ToolOptions, amcp_tools, effect_of, mcp_tools, output_of

__all__ = ["KEY_META", "MCPSession", "ToolOptions", "amcp_tools", "effect_of", "mcp_tools", "output_of"]
_WHERE = {name: "tenxgraph.integrations.mcp.tools" for name in __all__} | {
    "MCPSession": "tenxgraph.integrations.mcp.session"
}


def require_mcp() -> None:
    """Raise an ImportError that names the extra if the official ``mcp`` SDK is missing."""
    try:
        import mcp.client.session  # noqa: F401
    except ImportError as exc:
        raise ImportError(f"tenxgraph.integrations.mcp needs the mcp SDK ({exc.name} is missing): "
                          f"{install_hint('mcp')}") from exc  # fmt: skip


__getattr__ = lazy_names(__name__, _WHERE, require_mcp)
