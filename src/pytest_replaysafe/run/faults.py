"""Storage faults as a matrix dimension: ``--crash-faults=cache,drop,outage,redis-down,readonly`` (default
``cache``; ``all``; ``none``).

- ``cache``: on a backend with a cache (``postgres+redis``), the cache is left stale, future or flushed before
  every resume (the backend's ``stale_cache``; see ``pytest_replaysafe.matrix.cells``). No cells of its own.
- ``drop``: cells of their own, in the ``drop`` mode, on PostgreSQL backends. At the cell's point and hit, every
  PostgreSQL connection of the run's process is terminated for real (``pg_terminate_backend`` from a connection
  of the harness's own; the connections are found by their client ports in ``/proc``), as a failover, a
  restarted connection pooler or an idle-session killer would. The process does not die: the run goes on (it
  takes its run lock again on a new connection: its lease kept the thread) and either finishes or fails, and a
  failed run is resumed. Meanwhile a second worker tries to resume the thread and must be refused
  (:mod:`.intruder`). Nothing may run twice: a drop is no crash, so no gap of the crash table applies (only calls
  unprotected by nature, timed out or without an id, may re-run).
- ``outage``: like ``drop``, on PostgreSQL backends whose cell checkpointer connects through a :class:`Proxy` of
  the harness: at the point every connection through it is cut and new ones are refused for :data:`OUTAGE_S`,
  then PostgreSQL is reachable again.
- ``redis-down``: on ``postgres+redis``, Redis (through a proxy) is unreachable from the point to the end of the
  cell; the run and its resume must go on with PostgreSQL alone.
- ``readonly``: on SQLite, every write is refused (SQLITE_READONLY) from the point until the resume, as on a
  filesystem remounted read-only after an I/O error; a call whose record write was refused may run again.
"""

from __future__ import annotations

import contextlib
import math
import os
import socket
import sqlite3
import threading
import time
from typing import TYPE_CHECKING, Any
from urllib.parse import urlsplit

from pytest_replaysafe.run.modes import Crash, Hit, InProcess, Runner, arm_crash

if TYPE_CHECKING:
    from tenxgraph.storage.checkpointer.base import BaseCheckpointer

FAULTS = ("cache", "drop", "outage", "redis-down", "readonly")
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
    if not ports:  # never a silent no-op: a cell whose fault did nothing would pass for nothing
        raise RuntimeError(
            f"the drop fault found no TCP connection of this process to PostgreSQL port {port} (a Unix-socket DSN "
            "cannot be dropped this way: give REPLAYSAFE_PG_DSN a host and port)"
        )
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
    from psycopg.conninfo import conninfo_to_dict

    return int(conninfo_to_dict(dsn).get("port") or 5432)


class Proxy:
    """A TCP forwarder the harness owns, between a cell's checkpointer and PostgreSQL or Redis, so that a fault
    can cut that path without touching the server (which other workers and the user's own data share)."""

    def __init__(self, host: str, port: int) -> None:
        self.target = (host, port)
        self.server = socket.create_server(("127.0.0.1", 0))
        self.port: int = self.server.getsockname()[1]
        self._down_until = 0.0
        self._open: set[socket.socket] = set()
        self._lock = threading.Lock()
        PROXIES[self.port] = self
        threading.Thread(target=self._accept, name=f"replaysafe-proxy-{self.port}", daemon=True).start()

    def _accept(self) -> None:
        while True:
            try:
                client, _ = self.server.accept()
            except OSError:  # closed
                return
            if time.monotonic() < self._down_until:
                client.close()  # unreachable: the connection is closed at once
                continue
            try:
                upstream = socket.create_connection(self.target, timeout=5)
            except OSError:
                client.close()
                continue
            upstream.settimeout(None)
            with self._lock:
                self._open |= {client, upstream}
            for src, dst in ((client, upstream), (upstream, client)):
                threading.Thread(target=self._pump, args=(src, dst), daemon=True).start()

    def _pump(self, src: socket.socket, dst: socket.socket) -> None:
        try:
            while data := src.recv(65536):
                dst.sendall(data)
        except OSError:
            pass
        finally:
            self._close(src, dst)

    def _close(self, *socks: socket.socket) -> None:
        with self._lock:
            for sock in socks:
                self._open.discard(sock)
                with contextlib.suppress(OSError):
                    sock.shutdown(socket.SHUT_RDWR)
                sock.close()

    def cut(self, seconds: float | None) -> int:
        """Close every connection through the proxy and refuse new ones for *seconds* (None: until
        :meth:`restore`). Returns how many connections were cut."""
        self._down_until = math.inf if seconds is None else time.monotonic() + seconds
        with self._lock:
            cut = list(self._open)
        self._close(*cut)
        return len(cut) // 2

    def restore(self) -> None:
        self._down_until = 0.0

    def close(self) -> None:
        PROXIES.pop(self.port, None)
        self.server.close()
        self.cut(None)


#: Proxies by their local port: how a fault mode finds the proxy its cell's checkpointer connects through.
PROXIES: dict[int, Proxy] = {}


def _proxy_to(proxies: dict[tuple[str, int], Proxy], host: str, port: int) -> Proxy:
    """The proxy to *host*:*port* in *proxies*, made on first use."""
    if (host, port) not in proxies:
        proxies[host, port] = Proxy(host, port)
    return proxies[host, port]


def proxied_dsn(dsn: str, proxies: dict[tuple[str, int], Proxy]) -> str:
    """*dsn* with its host and port replaced by a proxy's (made on first use) to the same server."""
    from psycopg.conninfo import conninfo_to_dict, make_conninfo

    params = conninfo_to_dict(dsn)
    host, port = str(params.get("host") or "localhost"), int(params.get("port") or 5432)
    if host.startswith("/"):
        raise RuntimeError(f"the outage fault needs PostgreSQL over TCP; {dsn!r} connects over a Unix socket")
    return make_conninfo(dsn, host="127.0.0.1", port=str(_proxy_to(proxies, host, port).port))


def proxied_redis_url(url: str, proxies: dict[tuple[str, int], Proxy]) -> str:
    parts = urlsplit(url)
    host, port = parts.hostname or "localhost", parts.port or 6379
    proxy = _proxy_to(proxies, host, port)
    auth = parts.netloc.rpartition("@")[0]
    return parts._replace(netloc=f"{auth}@" * bool(auth) + f"127.0.0.1:{proxy.port}").geturl()


def _proxy_at(port: int | None) -> Proxy:
    proxy = PROXIES.get(port or 0)
    if proxy is None:
        raise RuntimeError(f"no harness proxy listens on port {port}: this cell's checkpointer is not proxied")
    return proxy


def _pg_proxy(checkpointer: Any) -> Proxy:
    return _proxy_at(_port_of(getattr(checkpointer, "postgres_dsn", None) or ""))


def _redis_proxy(checkpointer: Any) -> Proxy:
    return _proxy_at(urlsplit(getattr(checkpointer, "redis_url", None) or "").port)


class FaultMode(InProcess):
    """At the point the fault is injected; the process does not die: the run goes on, and is resumed (in the same
    process, with a new graph object) only if it failed. :meth:`recover` ends the fault: after the cell, or
    before the resume when the fault does not last through it (``lasts_through_resume``)."""

    lasts_through_resume = True
    #: Whether a second worker tries to resume the thread while the faulted run holds it (:mod:`.intruder`).
    second_worker = False

    def inject(self, run: Runner) -> str:
        raise NotImplementedError

    def recover(self, run: Runner) -> None:
        return None

    def crash(self, run: Runner, hit: Hit) -> Crash:
        from tenxgraph.core import crashpoints

        window: dict[str, str] = {}
        done: list[str] = []
        at: list[float] = []
        failed: list[str] = []  # the fault could not be applied (the runtime may swallow the error: a tool's)

        def inject(name: str, n: int) -> None:
            at.append(time.monotonic())
            try:
                done.append(self.inject(run))
            except Exception as exc:
                failed.append(f"{type(exc).__name__}: {exc}")
                raise
            if self.second_worker:  # while the run is held here: a client's retry, another server's recovery
                from pytest_replaysafe.run.intruder import intrude  # (asyncio: only when a fault cell runs)

                seen = intrude(run, hit, name)
                done[0] += f"; {seen}" if seen else ""

        crashpoints.reset()
        try:
            arm_crash(hit.point, hit.arrival, window, inject)
            result = run.run_graph(hit.app, hit.input, hit.thread, hit.config, hit.stream, "crash")
        except Exception as exc:
            if failed:
                self.recover(run)
                return Crash(False, error=f"the {self.name} fault could not be applied: {failed[0]}")
            if not done:
                self.recover(run)
                return Crash(False, error=f"the run failed before its fault: {type(exc).__name__}: {exc}")
            note = f"{done[0]}; the run failed: {type(exc).__name__}: {exc}"
            return Crash(True, window.get("id"), note=note, at=at[0])
        finally:
            crashpoints.reset()
        self.recover(run)
        if failed:
            return Crash(False, error=f"the {self.name} fault could not be applied: {failed[0]}")
        if not done:
            return Crash(False)
        return Crash(True, window.get("id"), note=f"{done[0]}; the run went on and finished", result=result, at=at[0])

    def resume(self, run: Runner, hit: Hit) -> Any:
        if not self.lasts_through_resume:
            self.recover(run)
        try:
            return super().resume(run, hit)
        finally:
            self.recover(run)


class Drop(FaultMode):
    """Every PostgreSQL connection of the run's process terminated by the server."""

    name = "drop"
    second_worker = True

    def inject(self, run: Runner) -> str:
        return drop_connections(run.checkpointer.inner)


#: How long PostgreSQL stays unreachable in an ``outage`` cell: within the checkpointer's default retries
#: (3, after 0.05 + 0.2 + 0.8 s): the second retry finds PostgreSQL back.
OUTAGE_S = 0.2


class Outage(FaultMode):
    """PostgreSQL unreachable for :data:`OUTAGE_S` (its connections cut, new ones refused), then back."""

    name = "outage"
    second_worker = True

    def inject(self, run: Runner) -> str:
        cut = _pg_proxy(run.checkpointer.inner).cut(OUTAGE_S)
        return f"PostgreSQL unreachable for {OUTAGE_S:g} s ({cut} connection(s) cut, new ones refused)"


class RedisDown(FaultMode):
    """Redis unreachable from the point to the end of the cell (its connections cut, new ones refused): the run
    and its resume go on with PostgreSQL alone."""

    name = "redis-down"

    def inject(self, run: Runner) -> str:
        cut = _redis_proxy(run.checkpointer.inner).cut(None)
        return f"Redis unreachable until the cell ends ({cut} connection(s) cut, new ones refused)"

    def recover(self, run: Runner) -> None:
        _redis_proxy(run.checkpointer.inner).restore()


class ReadOnly(FaultMode):
    """SQLite's storage goes read-only from the point (``PRAGMA query_only``: every write fails with
    SQLITE_READONLY, as on a filesystem remounted read-only after an I/O error), and is writable again for the
    resume. A call whose record write failed may run again (gap ``failed_record_write``); nothing else may."""

    name = "readonly"
    lasts_through_resume = False

    def inject(self, run: Runner) -> str:
        from pytest_replaysafe.matrix.cells import SQLITE_CONNECTIONS

        if not SQLITE_CONNECTIONS:
            raise RuntimeError("the readonly fault needs the matrix's SQLite checkpointer (no connection was made)")
        for conn in SQLITE_CONNECTIONS:
            conn.execute("PRAGMA query_only = ON")
        return "SQLite storage read-only (every write fails with SQLITE_READONLY) until the resume"

    def recover(self, run: Runner) -> None:
        from pytest_replaysafe.matrix.cells import SQLITE_CONNECTIONS

        for conn in SQLITE_CONNECTIONS:
            with contextlib.suppress(sqlite3.ProgrammingError):  # closed with its checkpointer
                conn.execute("PRAGMA query_only = OFF")


FAULT_MODE_OBJECTS: dict[str, FaultMode] = {m.name: m for m in (Drop(), Outage(), RedisDown(), ReadOnly())}
