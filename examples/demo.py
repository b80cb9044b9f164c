"""`make demo`: run the support agent on the embedded SQLite checkpointer, crash it, resume it."""

from __future__ import annotations

import tempfile
from pathlib import Path

from examples.support_refund.agent import build_support_agent
from tenxgraph import Message
from tenxgraph.core import crashpoints
from tenxgraph.storage.checkpointer import SqliteCheckpointer


def main() -> None:
    refunds: list[str] = []

    def pay(order_id: str, amount: float) -> str:
        refunds.append(order_id)
        return f"payment ref R-{order_id}-{len(refunds)}"

    with tempfile.TemporaryDirectory() as tmp:
        cp = SqliteCheckpointer(Path(tmp) / "demo.db")
        config = {"thread_id": "demo-thread"}
        print("1. run the support agent; the process 'dies' right after refund_order is recorded")
        try:
            with crashpoints.armed("tool.after_record", hit=2):
                build_support_agent(cp, pay).invoke({"messages": [Message.text_message("refund order 1042")]}, config)
        except crashpoints.CrashInjected as crash:
            print(f"   crashed: {crash}")
        print("2. resume the thread with a brand-new graph object")
        result = build_support_agent(cp, pay).invoke(None, config)
        for message in result.messages:
            body = message.text or [c.name for c in message.tool_calls] or message.tool_results[0].output
            print(f"   {message.role:9} {body}")
        print(f"3. refund_order moved money {len(refunds)} time(s); final answer: {result.final_text!r}")
        cp.close()
        if len(refunds) != 1:
            raise SystemExit("replay protection failed: the refund ran more than once")


if __name__ == "__main__":
    main()
