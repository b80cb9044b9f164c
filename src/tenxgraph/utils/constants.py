"""Defaults of the runtime. Per-run values come from the run config."""

from __future__ import annotations

from typing import Final

NODE_TIMEOUT: Final[float] = 900
"""Seconds a node may run before ``NodeTimeoutError``; ``config['node_timeout']`` overrides, None/0 disables."""

TOOL_TIMEOUT: Final[float] = 300
"""Seconds a tool may run before it is cancelled; ``config['tool_timeout']`` overrides, None/0 disables."""

RECURSION_LIMIT: Final[int] = 25
"""Nodes one invocation may run before ``GraphRecursionError``; ``config['recursion_limit']`` overrides."""

THREAD_ID_MAX_BYTES: Final[int] = 512
"""The longest thread id, in UTF-8 bytes, on every backend (PostgreSQL indexes cap a key near 2.7 KB)."""

MESSAGE_ID_MAX_BYTES: Final[int] = 256
"""The longest message id and tool-call id, in UTF-8 bytes (a ledger key joins the two)."""

START: Final[str] = "__start__"
END: Final[str] = "__end__"

LOGGER_NAME: Final[str] = "tenxgraph"


DISTRIBUTION: Final[str] = "tenxgraph"
"""This project's distribution name. (The package index's ``10xgraph`` is a different project.)"""


def install_hint(extra: str) -> str:
    """How to install *extra* (``pg-checkpoint``, not ``pg_checkpoint``: the spelling every pip resolves; pip 23.2,
    which Python 3.11 ships, does not normalise a requested extra). tenxgraph installs from a checkout or a wheel
    built from one (see the README's Install section), never from the index's ``10xgraph``."""
    return f'pip install ".[{extra}]" in a tenxgraph checkout (or "tenxgraph[{extra}] @ <its path, URL or wheel>")'
