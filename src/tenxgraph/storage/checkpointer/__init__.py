"""Checkpointers: versioned thread state, message log and tool ledger behind one base class."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from tenxgraph.storage.checkpointer.base import BaseCheckpointer, ThreadSnapshot
from tenxgraph.storage.checkpointer.delegating import DelegatingCheckpointer
from tenxgraph.storage.checkpointer.memory import InMemoryCheckpointer

if TYPE_CHECKING:
    from tenxgraph.storage.checkpointer.pg import PgCheckpointer
    from tenxgraph.storage.checkpointer.sqlite import SqliteCheckpointer

__all__ = [
    "BaseCheckpointer",
    "DelegatingCheckpointer",
    "InMemoryCheckpointer",
    "PgCheckpointer",
    "SqliteCheckpointer",
    "ThreadSnapshot",
]


def __getattr__(name: str) -> Any:  # lazy: the PostgreSQL driver is an optional extra
    if name == "SqliteCheckpointer":
        from tenxgraph.storage.checkpointer.sqlite import SqliteCheckpointer

        return SqliteCheckpointer
    if name == "PgCheckpointer":
        from tenxgraph.storage.checkpointer.pg import PgCheckpointer

        return PgCheckpointer
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
