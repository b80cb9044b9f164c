"""What ``compile`` checks and settles before any run: which nodes are async, the graph-wide in-doubt default, and
whether the checkpointer can hold a transactional tool's writes."""

from __future__ import annotations

import inspect
from collections.abc import Mapping
from typing import Any

from tenxgraph.storage.checkpointer.base import BaseCheckpointer
from tenxgraph.utils.errors import ConfigError


def is_async(fn: Any) -> bool:
    return inspect.iscoroutinefunction(fn) or inspect.iscoroutinefunction(getattr(fn, "__call__", None))  # noqa: B004


#: The graph-wide in-doubt defaults (``reconcile`` needs a function of each tool's own).
GRAPH_IN_DOUBT_DEFAULTS = ("retry", "fail")


def with_in_doubt_default(fn: Any, policy: str | None) -> Any:
    """*fn*, or the tool node it is with *policy* for each tool that says nothing of ``on_in_doubt``."""
    if policy is not None and policy not in GRAPH_IN_DOUBT_DEFAULTS:
        hint = (
            "; reconcile needs each tool's own function: @tool(on_in_doubt='reconcile', reconcile=...)"
            if policy == "reconcile"
            else ""
        )
        raise ConfigError(
            f"compile(on_in_doubt={policy!r}): a graph-wide default is one of {', '.join(GRAPH_IN_DOUBT_DEFAULTS)}"
            f"{hint}"
        )
    return fn.with_in_doubt_default(policy) if policy is not None and hasattr(fn, "with_in_doubt_default") else fn


def check_transactional(nodes: Mapping[str, Any], checkpointer: BaseCheckpointer) -> None:
    """A transactional tool needs a checkpointer whose database can hold its writes: an error now, not at run time."""
    kind = checkpointer.transactions
    name = type(getattr(checkpointer, "inner", checkpointer)).__name__
    for fn in nodes.values():
        for tool in getattr(fn, "tools", {}).values():
            if getattr(tool, "effect", None) != "transactional":
                continue
            if kind is None:
                raise ConfigError(
                    f"tool {tool.name!r} is transactional (its writes commit with its ledger record), and {name} "
                    "cannot run a tool in the ledger's transaction: compile it with a SqliteCheckpointer or a "
                    "PgCheckpointer"
                )
            if tool.is_async != (kind == "async"):
                want = (
                    "an async def getting a psycopg.AsyncConnection"
                    if kind == "async"
                    else ("a plain function getting a sqlite3.Connection (it runs in a worker thread)")
                )
                raise ConfigError(f"tool {tool.name!r} is transactional over {name}: make it {want}")
