"""Storage faults as a matrix dimension: ``--crash-faults=cache,drop`` (default ``cache``; ``all``; ``none``).

- ``cache``: on a backend with a cache (``postgres+redis``), the cache is left stale, future or flushed before
  every resume (the backend's ``stale_cache``; see ``pytest_replaysafe.matrix``). No cells of its own.
- ``drop``: cells of their own, in the ``drop`` mode, on PostgreSQL backends. At the cell's point and hit, every
  PostgreSQL connection of the run's process is terminated for real (``pg_terminate_backend`` from a connection
  of the harness's own; the connections are found by their client ports in ``/proc``), as a failover, a
  restarted connection pooler or an idle-session killer would. The process does not die: the run goes on and
  either finishes or fails (its run lock went with its connection), and a failed run is resumed. Nothing may run
  twice: a drop is no crash, so no gap of the crash table applies (only calls unprotected by nature, timed out or
  without an id, may re-run).
"""

from __future__ import annotations

import os
import time
from typing import TYPE_CHECKING
from urllib.parse import urlsplit

from pytest_replaysafe.modes import Crash, Hit, InProcess, Runner, arm_crash

if TYPE_CHECKING:
    from tenxgraph.storage.checkpointer.base import BaseCheckpointer

FAULTS = ("cache", "drop")
DEFAULT_FAULTS = frozenset({"cache"})


def parse(raw: str | None) -> frozenset[str]:
    import pytest

    if raw is None or not str(raw).strip():
        return DEFAULT_FAULTS
    names = {n.strip().lower() for n in str(raw).split(",") if n.strip()}
    if names == {"all"}:
        return frozenset(FAULTS)
    if names == {"none"}:
        return frozenset()
    unknown = sorted(names - set(FAULTS))
    if unknown or not names:
        raise pytest.UsageError(
            f"replaysafe: --crash-faults={raw!r}: unknown fault(s) {', '.join(map(repr, unknown))}; give a "
            f"comma-separated list of {', '.join(FAULTS)}, or all, or none"
        )
    return frozenset(names)


def _socket_inodes() -> set[str]:
    inodes = set()
    for fd in os.listdir("/proc/self/fd"):
        try:
            target = os.readlink(f"/proc/self/fd/{fd}")
        except OSError:  # closed while we looked
            continue
        if target.startswith("socket:["):
            inodes.add(target[8:-1])
    return inodes


def client_ports(server_port: int) -> list[int]:
    """Local TCP ports of this process's connections to *server_port* (from ``/proc/net/tcp`` and ``tcp6``)."""
    mine, ports = _socket_inodes(), []
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        try:
            with open(table) as fh:
                rows = fh.read().splitlines()[1:]
        except OSError:
            continue
        for row in rows:
            cols = row.split()
            local, remote, inode = cols[1], cols[2], cols[9]
            if inode in mine and int(remote.rsplit(":", 1)[1], 16) == server_port:
                ports.append(int(local.rsplit(":", 1)[1], 16))
    return ports


def drop_connections(checkpointer: BaseCheckpointer) -> str:
    """Terminate every PostgreSQL connection of this process and wait until each backend has exited."""
    import psycopg

    dsn = getattr(checkpointer, "postgres_dsn", None)
    if not dsn:
        raise RuntimeError(f"the drop fault needs a PostgreSQL checkpointer built from a DSN, got {checkpointer!r}")
    port = _port_of(dsn)
    ports = client_ports(port)
    if not ports:
        return "no PostgreSQL connection of the run's process was open"
    with psycopg.connect(dsn, autocommit=True, connect_timeout=5) as conn:
        rows = conn.execute(
            "SELECT pid, pg_terminate_backend(pid) FROM pg_stat_activity WHERE client_port = ANY(%s) "
            "AND client_addr IS NOT DISTINCT FROM inet_client_addr() AND pid <> pg_backend_pid()",
            (ports,),
        ).fetchall()
        pids = [pid for pid, _ in rows]
        deadline = time.monotonic() + 5.0  # (pg_terminate_backend's own wait polls every 100 ms, per backend)
        while conn.execute("SELECT count(*) FROM pg_stat_activity WHERE pid = ANY(%s)", (pids,)).fetchone() != (0,):
            if time.monotonic() > deadline:
                raise RuntimeError(f"PostgreSQL backends {pids} were signalled but still run after 5 s")
            time.sleep(0.005)
    return f"{len(rows)} PostgreSQL connection(s) of the run's process terminated (pg_terminate_backend)"


def _port_of(dsn: str) -> int:
    if "://" in dsn:
        return urlsplit(dsn).port or 5432
    words = dict(w.split("=", 1) for w in dsn.split() if "=" in w)
    return int(words.get("port", 5432))


class Drop(InProcess):
    """At the point, the process's PostgreSQL connections are terminated; the run goes on, and is resumed (in
    the same process, with a new graph object) only if it failed."""

    name = "drop"

    def crash(self, run: Runner, hit: Hit) -> Crash:
        from tenxgraph.core import crashpoints

        window: dict[str, str] = {}
        done: list[str] = []

        def drop(name: str, n: int) -> None:
            done.append(drop_connections(run.checkpointer.inner))

        crashpoints.reset()
        try:
            arm_crash(hit.point, hit.hit, window, drop)
            result = run.run_graph(hit.app, hit.input, hit.thread, hit.config, hit.stream, "crash")
        except Exception as exc:
            if not done:
                return Crash(False, error=f"the run failed before its fault: {type(exc).__name__}: {exc}")
            return Crash(True, window.get("id"), note=f"{done[0]}; the run failed: {type(exc).__name__}: {exc}")
        finally:
            crashpoints.reset()
        if not done:
            return Crash(False)
        return Crash(True, window.get("id"), note=f"{done[0]}; the run went on and finished", result=result)
