"""A child process for kill -9 tests: runs the support agent on a durable checkpointer.

usage: python tests/support_child.py BACKEND TARGET THREAD_ID EFFECTS_FILE
Each execution of refund_order's body appends a line to EFFECTS_FILE (fsynced), so counts survive a kill -9.
Arm a crash with TENXGRAPH_CRASH_AT; prints the final answer when the run finishes.
"""

from __future__ import annotations

import os
import sys

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


def main() -> None:
    backend, target, thread_id, effects = sys.argv[1:5]

    def pay(order_id: str, amount: float) -> str:
        fd = os.open(effects, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        try:
            os.write(fd, f"{order_id} {amount}\n".encode())
            os.fsync(fd)
        finally:
            os.close(fd)
        return "payment ok"

    cp = open_checkpointer(backend, target)
    app = build_support_agent(cp, pay)
    existing = cp.get_thread(thread_id)
    result = app.invoke(
        None if existing else {"messages": [Message.text_message("refund order 1042")]}, {"thread_id": thread_id}
    )
    print(result.final_text, flush=True)
    cp.close()


if __name__ == "__main__":
    main()
