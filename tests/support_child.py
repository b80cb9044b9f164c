"""A child process for kill -9 tests: runs the support agent on a durable checkpointer.

usage: python tests/support_child.py BACKEND TARGET THREAD_ID EFFECTS_FILE
Each refund the agent makes appends a line to EFFECTS_FILE (fsynced), so counts survive a kill -9.
Arm a crash with TENXGRAPH_CRASH_AT; prints the final answer when the run finishes.
"""

from __future__ import annotations

import os
import sys
import time
from typing import Any

from examples.support_refund.agent import build_support_agent
from tenxgraph import Message
from tenxgraph.storage.checkpointer import BaseCheckpointer


def open_checkpointer(backend: str, target: str) -> BaseCheckpointer:
    if backend == "sqlite":
        from tenxgraph.storage.checkpointer import SqliteCheckpointer

        return SqliteCheckpointer(target)
    from tenxgraph.storage.checkpointer import PgCheckpointer

    dsn, _, schema = target.partition("#")
    return PgCheckpointer(postgres_dsn=dsn, schema=schema or "public")


class FilePayments:
    """Appends every refund to a file, fsynced: it ignores idempotency keys, to count raw executions."""

    def __init__(self, path: str) -> None:
        self.path = path

    def apply(self, kind: str, payload: Any = None, idempotency_key: str | None = None) -> dict[str, Any]:
        time.sleep(float(os.environ.get("TENX_SLOW_S", "0")))  # a slow provider (the graceful-shutdown test)
        fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        try:
            os.write(fd, f"{payload['order']} {payload['amount']}\n".encode())
            os.fsync(fd)
        finally:
            os.close(fd)
        return {"effect_id": "E-1", "applied": True}


def main() -> None:
    backend, target, thread_id, effects = sys.argv[1:5]

    cp = open_checkpointer(backend, target)
    app = build_support_agent(cp, FilePayments(effects))
    existing = cp.get_thread(thread_id)
    result = app.invoke(
        None if existing else {"messages": [Message.text_message("refund order 1042")]}, {"thread_id": thread_id}
    )
    print(result.final_text, flush=True)
    cp.close()


if __name__ == "__main__":
    main()
