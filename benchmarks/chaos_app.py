"""The agent ``benchmarks/server_chaos.py`` serves from 3 processes: refund an order (a transactional tool: its
effect row commits with its ledger record), then email the customer (an ``external`` tool: in-doubt detection,
``fail``). Both write to ``<schema>.effects`` in PostgreSQL, one row per execution of a body, so duplicates are
counted outside the servers. Configured by ``CHAOS_DSN``, ``CHAOS_SCHEMA``, ``CHAOS_REDIS``."""

from __future__ import annotations

import asyncio
import os
from typing import Any

import psycopg

from tenxgraph import ReactAgent, Reply, ScriptedModel, ToolContext, tool
from tenxgraph.storage.checkpointer.pg import PgCheckpointer

DSN, SCHEMA = os.environ["CHAOS_DSN"], os.environ["CHAOS_SCHEMA"]
EFFECTS = f"{SCHEMA}.effects"


@tool(effect="transactional")
async def refund_order(order_id: str, tx: Any, ctx: ToolContext) -> str:
    """Refund an order.

    Args:
        order_id: The order.
    """
    await asyncio.sleep(0.02)  # a provider call's latency: a kill -9 can land inside it
    await tx.execute(
        f"INSERT INTO {EFFECTS} (thread_id, call_key, kind) VALUES (%s, %s, 'refund')", (ctx.thread_id, ctx.key)
    )
    return f"refunded order {order_id}"


@tool(effect="external")
async def send_email(to: str, ctx: ToolContext) -> str:
    """Email the customer.

    Args:
        to: The recipient.
    """
    await asyncio.sleep(0.02)
    async with await psycopg.AsyncConnection.connect(DSN, autocommit=True) as conn:
        await conn.execute(
            f"INSERT INTO {EFFECTS} (thread_id, call_key, kind) VALUES (%s, %s, 'email')", (ctx.thread_id, ctx.key)
        )
    return f"emailed {to}"


def app() -> Any:
    model = ScriptedModel(
        [
            Reply(tool_calls=[("refund_order", {"order_id": "1042"})]),
            Reply(tool_calls=[("send_email", {"to": "ada@example.com"})]),
            "Refunded and emailed.",
        ]
    )
    checkpointer = PgCheckpointer(
        postgres_dsn=DSN, redis_url=os.environ.get("CHAOS_REDIS") or None, schema=SCHEMA, max_pool_size=24
    )  # a run holds one connection (its lock), a transactional call one more
    return ReactAgent(model, tools=[refund_order, send_email]).compile(checkpointer)
