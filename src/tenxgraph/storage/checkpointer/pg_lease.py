"""The PostgreSQL run lease: who runs a thread, held across a connection blip, and given up only when its holder
is gone.

A run holds two things: the session advisory lock on its lock connection (PostgreSQL frees it the moment that
connection dies) and a row in ``run_leases`` (owner token, host, pid and process start time, expiry), claimed in
the same statement. A second run may take the thread only when it gets the advisory lock *and* the lease is free,
expired, or held by a process known to be dead:

- a blip (a terminated connection, a failover, an outage shorter than the lease) frees the advisory lock but not
  the lease: a second run is refused while the holder lives, and the holder takes the lock again on a new
  connection (:meth:`PgCheckpointer._reclaim`) and goes on;
- a killed holder on the same host (same host name, boot and pid namespace) is known dead at once (its pid is
  gone, or is another process now): recovery stays immediate;
- a killed holder on another host stops renewing: its lease runs out within ``run_lease`` seconds.

:class:`Renewer` renews the leases of this process's runs in a thread of its own, on a connection of its own,
every third of the lease: an event loop busy in a blocking call does not lose the thread. A renewal that finds a
lease gone marks the run lost; the run's fencing check (:meth:`PgCheckpointer.acheck_run_lock`) then stops it
before it starts another tool or writes state.
"""

from __future__ import annotations

import contextlib
import logging
import threading
import time
import uuid
from dataclasses import dataclass, field
from typing import Any

from tenxgraph.storage.checkpointer.holders import Holder, Process
from tenxgraph.utils.constants import LOGGER_NAME

__all__ = ["DEFAULT_LEASE_S", "Holder", "Lease", "Process", "Renewer"]

log = logging.getLogger(LOGGER_NAME)

#: The default lease, in seconds: how long a thread whose holder stopped renewing (killed on another host, or cut
#: off from PostgreSQL) stays refused to other runs; a blip shorter than about two thirds of it is survived.
DEFAULT_LEASE_S = 10.0


@dataclass(slots=True)
class Lease:
    """This process's lease on one thread, for one run."""

    thread_id: str
    key: int
    owner: str = field(default_factory=lambda: uuid.uuid4().hex)
    confirmed_until: float = 0.0  # monotonic time until which the lease is surely held (from the last renewal)
    lost: str | None = None  # why it is no longer held

    def confirm(self, sent_at: float, lease_s: float) -> None:
        """The lease was set to expire *lease_s* after a statement sent at *sent_at* (monotonic): until then it
        is surely held (the server's clock had started the statement no earlier)."""
        self.confirmed_until = max(self.confirmed_until, sent_at + lease_s)


class Renewer:
    """Renews this process's leases every ``lease_s / 3`` seconds, in one statement for all of them, in a daemon
    thread with a connection of its own (reconnected after a failure). A lease no longer found is marked lost."""

    def __init__(self, conninfo: str, kwargs: dict[str, Any], query: str, lease_s: float, connect_timeout: float):
        self.conninfo, self.kwargs, self.query = conninfo, {**kwargs, "autocommit": True}, query
        self.lease_s, self.connect_timeout = lease_s, connect_timeout
        self._leases: dict[str, Lease] = {}
        self._guard = threading.Lock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._conn: Any = None

    def add(self, lease: Lease) -> None:
        with self._guard:
            self._leases[lease.owner] = lease
            if self._thread is None:
                self._thread = threading.Thread(target=self._run, name="tenxgraph-lease-renewer", daemon=True)
                self._thread.start()

    def remove(self, lease: Lease) -> None:
        with self._guard:
            self._leases.pop(lease.owner, None)

    def close(self) -> None:
        self._stop.set()
        thread = self._thread
        if thread is not None and thread is not threading.current_thread():
            thread.join(timeout=self.connect_timeout + 1)
        self._close_conn()

    def _close_conn(self) -> None:
        conn, self._conn = self._conn, None
        if conn is not None:
            with contextlib.suppress(Exception):
                conn.close()

    def _run(self) -> None:
        interval = self.lease_s / 3
        while not self._stop.wait(interval):
            with self._guard:
                leases = list(self._leases.values())
            if leases:
                interval = self.lease_s / 3 if self.renew(leases) else min(self.lease_s / 10, 0.5)

    def renew(self, leases: list[Lease]) -> bool:
        """One renewal of *leases*; False when PostgreSQL could not be reached (tried again sooner)."""
        import psycopg

        sent = time.monotonic()
        try:
            if self._conn is None or self._conn.closed:
                self._conn = psycopg.connect(
                    self.conninfo, connect_timeout=max(1, round(self.connect_timeout)), **self.kwargs
                )
            rows = self._conn.execute(
                self.query, (self.lease_s, [x.thread_id for x in leases], [x.owner for x in leases])
            ).fetchall()
        except psycopg.Error as exc:
            log.warning("renewing %d run lease(s) failed (%s: %s); retrying", len(leases), type(exc).__name__, exc)
            self._close_conn()
            return False
        renewed = {row[0] for row in rows}
        with self._guard:
            for lease in leases:
                if lease.owner in renewed:
                    lease.confirm(sent, self.lease_s)
                elif lease.owner in self._leases and lease.lost is None:  # (not released meanwhile)
                    lease.lost = "its lease was taken by another run after it expired (renewals did not reach it)"
                    log.error("thread %r: %s; the run stops before its next tool or write", lease.thread_id, lease.lost)
        return True
