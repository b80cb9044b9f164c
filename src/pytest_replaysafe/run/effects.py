"""A side-effect provider simulator: durable, countable effects that honour idempotency keys like a payment API.

Tools call ``effects.apply("refund", {"order": "1042"}, idempotency_key=...)``. The effect is stored in a SQLite
file (WAL, so it survives a kill -9 of the applying process and is visible to every process of the cell). A key
seen before returns the first result without applying the effect again. Right after an effect is applied, the
crash point ``tool.in_flight`` fires: the effect is done, the tool has not returned.

Every effect is stored with the thread and node that applied it, inside a tool or not: the crash matrix counts an
effect that a plain graph node applied again after a resume as a violation.

A transactional tool applies its effect with ``effects.apply_in(tx, kind, payload)``: the effect is a row in the
checkpointer's own database, written in the tool's transaction, so it commits (or rolls back) with the tool's
ledger record; :meth:`Effects.applied` reads those rows too, and the crash matrix checks they committed once.
"""

from __future__ import annotations

import contextlib
import json
import sqlite3
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from tenxgraph.core.crashpoints import crash_point
from tenxgraph.core.tools.context import current_run, current_tool_call

_SCHEMA = """CREATE TABLE IF NOT EXISTS effects (
    seq INTEGER PRIMARY KEY AUTOINCREMENT,
    kind TEXT NOT NULL,
    payload TEXT NOT NULL,
    idempotency_key TEXT UNIQUE,
    execution_id TEXT,
    thread_id TEXT,
    node TEXT
)"""


_TX_SCHEMA = _SCHEMA.replace("effects (", "replaysafe_effects (", 1).replace(" UNIQUE", "")
_COLUMNS = "kind, payload, idempotency_key, execution_id, thread_id, node"


def _committed(database: str, sql: str, params: list[Any]) -> list[Any]:
    """The rows of ``replaysafe_effects`` in a transactional tool's database: a SQLite file, or ``DSN#schema``."""
    if "#" in database:
        import psycopg

        dsn, _, schema = database.rpartition("#")
        query = sql.replace("FROM effects", f"FROM {schema}.replaysafe_effects").replace("?", "%s")
        # The DSN is the tool's transaction's: in an outage cell, the harness's fault proxy, which may still be
        # refusing connections right after a run that outlived its fault. Evidence waits for it (about 0.2 s).
        for attempt in range(100):
            try:
                with psycopg.connect(dsn, autocommit=True, connect_timeout=2) as pg:
                    found = pg.execute("SELECT to_regclass(%s)", (f"{schema}.replaysafe_effects",)).fetchone()
                    return pg.execute(query + " ORDER BY seq", params).fetchall() if found and found[0] else []
            except psycopg.OperationalError:
                if attempt == 99:
                    raise
                time.sleep(0.05)
    conn = sqlite3.connect(database, timeout=30)
    try:
        if not conn.execute("SELECT 1 FROM sqlite_master WHERE name = 'replaysafe_effects'").fetchone():
            return []
        return conn.execute(sql.replace("FROM effects", "FROM replaysafe_effects") + " ORDER BY seq", params).fetchall()
    finally:
        conn.close()


#: The thread of the plain loop the harness runs in this process (:mod:`.loop_app`), if it runs one: an effect
#: applied outside any tool call there is the loop's own code (node ``loop``), on that thread.
_loop_threads: list[str] = []
LOOP_NODE = "loop"


@contextlib.contextmanager
def in_loop(thread_id: str) -> Iterator[None]:
    """Effects applied outside a tool call, while the harness runs a plain loop on *thread_id*, are its own."""
    _loop_threads.append(thread_id)
    try:
        yield
    finally:
        _loop_threads.pop()


def loop_thread() -> str | None:
    """The thread of the plain loop the harness runs in this process now (None: none)."""
    return _loop_threads[-1] if _loop_threads else None


class Effects:
    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)
        with self._connect() as conn:
            conn.execute(_SCHEMA)
            conn.execute("CREATE TABLE IF NOT EXISTS tx_databases (path TEXT PRIMARY KEY)")

    def _connect(self) -> sqlite3.Connection:
        conn = sqlite3.connect(self.path, timeout=30, isolation_level=None)
        conn.execute("PRAGMA journal_mode=WAL")
        conn.execute("PRAGMA synchronous=NORMAL")  # WAL + NORMAL: an applied effect survives a killed process
        return conn

    def apply(self, kind: str, payload: Any = None, idempotency_key: str | None = None) -> dict[str, Any]:
        """Apply an effect; with a known *idempotency_key*, return the first result and apply nothing."""
        call = current_tool_call()
        run = current_run()
        loop = _loop_threads[-1] if _loop_threads and run is None else None
        thread = call.thread_id if call else (run.thread_id if run else loop)
        node = run.node if run else (LOOP_NODE if loop else None)
        text = json.dumps(payload, sort_keys=True)
        conn = self._connect()
        try:
            conn.execute("BEGIN IMMEDIATE")
            if idempotency_key is not None:
                row = conn.execute("SELECT seq FROM effects WHERE idempotency_key = ?", (idempotency_key,)).fetchone()
                if row is not None:
                    conn.execute("COMMIT")
                    return {"effect_id": f"E-{row[0]}", "applied": False}
            cur = conn.execute(
                "INSERT INTO effects (kind, payload, idempotency_key, execution_id, thread_id, node)"
                " VALUES (?, ?, ?, ?, ?, ?)",
                (kind, text, idempotency_key, call.execution_id if call else None, thread, node),
            )
            conn.execute("COMMIT")
            effect_id = f"E-{cur.lastrowid}"
        finally:
            conn.close()
        crash_point("tool.in_flight")
        return {"effect_id": effect_id, "applied": True}

    def apply_in(self, tx: sqlite3.Connection, kind: str, payload: Any = None) -> dict[str, Any]:
        """Apply an effect inside a transactional tool's transaction *tx* (SQLite): it commits with the tool's
        ledger record, or not at all. ``tool.in_flight`` fires once it is written (not yet committed)."""
        call = current_tool_call()
        run = current_run()
        database = next(str(row[2]) for row in tx.execute("PRAGMA database_list") if row[1] == "main")
        with self._connect() as conn:  # where to find these effects, from any process of the cell
            conn.execute("INSERT OR IGNORE INTO tx_databases (path) VALUES (?)", (database,))
        tx.execute(_TX_SCHEMA)
        cur = tx.execute(
            f"INSERT INTO replaysafe_effects ({_COLUMNS}) VALUES (?, ?, NULL, ?, ?, ?)",
            (kind, json.dumps(payload, sort_keys=True), call.execution_id if call else None,
             call.thread_id if call else None, run.node if run else None),
        )  # fmt: skip
        crash_point("tool.in_flight")
        return {"effect_id": f"T-{cur.lastrowid}", "applied": True}

    async def aapply_in(self, tx: Any, kind: str, payload: Any, schema: str) -> dict[str, Any]:
        """:meth:`apply_in` for PostgreSQL: *tx* is the tool's ``psycopg.AsyncConnection``; the effect is a row of
        ``schema.replaysafe_effects`` (the checkpointer's schema)."""
        call = current_tool_call()
        run = current_run()
        with self._connect() as conn:
            conn.execute("INSERT OR IGNORE INTO tx_databases (path) VALUES (?)", (f"{tx.info.dsn}#{schema}",))
        table = f"{schema}.replaysafe_effects"
        ddl = _TX_SCHEMA.replace("replaysafe_effects", table).replace("INTEGER PRIMARY KEY AUTOINCREMENT", "BIGSERIAL")
        await tx.execute(ddl.replace("seq BIGSERIAL", "seq BIGSERIAL PRIMARY KEY"))
        cur = await tx.execute(
            f"INSERT INTO {table} ({_COLUMNS}) VALUES (%s, %s, NULL, %s, %s, %s) RETURNING seq",
            (kind, json.dumps(payload, sort_keys=True), call.execution_id if call else None,
             call.thread_id if call else None, run.node if run else None),
        )  # fmt: skip
        row = await cur.fetchone()
        crash_point("tool.in_flight")
        return {"effect_id": f"T-{row[0] if row else '?'}", "applied": True}

    def lookup(self, idempotency_key: str) -> dict[str, Any] | None:
        """What a provider answers to "did you apply this key?": the effect's result, or None. For ``reconcile``."""
        conn = self._connect()
        try:
            row = conn.execute("SELECT seq FROM effects WHERE idempotency_key = ?", (idempotency_key,)).fetchone()
        finally:
            conn.close()
        return None if row is None else {"effect_id": f"E-{row[0]}", "applied": True}

    def applied(self, kind: str | None = None, thread_id: str | None = None) -> list[dict[str, Any]]:
        """Every applied effect, oldest first."""
        sql = "SELECT kind, payload, idempotency_key, execution_id, thread_id, node FROM effects WHERE 1=1"
        params: list[Any] = []
        if kind is not None:
            sql += " AND kind = ?"
            params.append(kind)
        if thread_id is not None:
            sql += " AND thread_id = ?"
            params.append(thread_id)
        conn = self._connect()
        try:
            rows = conn.execute(sql + " ORDER BY seq", params).fetchall()
            databases = [str(r[0]) for r in conn.execute("SELECT path FROM tx_databases")]
        finally:
            conn.close()
        for database in databases:  # the committed effects of transactional tools
            rows += _committed(database, sql, params)
        return [
            {"kind": k, "payload": json.loads(p), "idempotency_key": i, "execution_id": e, "thread_id": t, "node": n}
            for k, p, i, e, t, n in rows
        ]

    def count(self, kind: str | None = None, thread_id: str | None = None) -> int:
        return len(self.applied(kind, thread_id))
