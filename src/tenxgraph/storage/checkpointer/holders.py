"""Who holds a thread's run lock, and whether it still lives: the process identity a run lock records (host,
pid, process start) and the liveness check that lets a run take over from a holder known dead at once. Shared by
PostgreSQL's lease (:mod:`.pg_lease`) and SQLite's (:mod:`.sqlite_lock`)."""

from __future__ import annotations

import dataclasses
import logging
import os
import socket
from dataclasses import dataclass
from typing import Any

from tenxgraph.utils.constants import LOGGER_NAME

log = logging.getLogger(LOGGER_NAME)


def _read(path: str) -> str:
    try:
        with open(path, encoding="ascii") as fh:
            return fh.read().strip()
    except OSError:
        return ""


def host_identity() -> str:
    """This machine as its processes see it: host name, boot id and pid namespace. Two processes with the same
    identity see each other's pids; another container (its own pid namespace) or a rebooted host is elsewhere."""
    try:
        namespace = os.readlink("/proc/self/ns/pid")
    except OSError:
        namespace = ""
    return "|".join((socket.gethostname(), _read("/proc/sys/kernel/random/boot_id"), namespace))


def process_start(pid: int) -> int:
    """When process *pid* started, in clock ticks since boot (``/proc/<pid>/stat``): a pid reused by another
    process has another start. 0 when unknown (no ``/proc``), or -1 when no such process exists."""
    stat = _read(f"/proc/{pid}/stat")
    if not stat:
        return -1 if os.path.isdir("/proc/self") else 0
    try:
        return int(stat.rsplit(")", 1)[1].split()[19])
    except (IndexError, ValueError):
        return 0


def process_alive(pid: int, start: int) -> bool:
    """Whether process *pid*, started at *start* (0: unknown), still runs on this host."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # another user's process: it exists
        pass
    now = process_start(pid)
    if now == -1:
        return False
    return start == 0 or now == 0 or now == start


@dataclass(frozen=True, slots=True)
class Process:
    """A process that can hold leases: where it runs, its pid and its start."""

    host: str
    pid: int
    start: int

    @classmethod
    def current(cls, host: str | None = None) -> Process:
        """This process (read once per pid), with *host* as its host identity when given."""
        global _this_process
        pid = os.getpid()
        if _this_process is None or _this_process.pid != pid:
            _this_process = cls(host_identity(), pid, max(process_start(pid), 0))
        return _this_process if host is None else dataclasses.replace(_this_process, host=host)


_this_process: Process | None = None


#: The lease owner tokens that runs of this process hold right now (every checkpointer's): a lease row naming
#: this process with a token not in it was left by a run that ended without releasing it.
LIVE_OWNERS: set[str] = set()


@dataclass(frozen=True, slots=True)
class Holder:
    """A lease row as it was when another run asked for the thread."""

    owner: str
    host: str
    pid: int
    start: int
    live: bool
    left_s: float

    @classmethod
    def from_row(cls, row: Any) -> Holder | None:
        """From the columns ``owner, host, pid, pid_start, live, left_s`` (None: no lease row)."""
        if row[0] is None:
            return None
        return cls(str(row[0]), str(row[1]), int(row[2]), int(row[3]), bool(row[4]), float(row[5]))

    def dead(self, me: Process) -> bool:
        """Known dead: on this host (same identity), and its process is gone or is another process now, or it is
        this process and no run of it holds that lease any more (its release failed: the storage was down)."""
        if self.host != me.host:
            return False
        if (self.pid, self.start) == (me.pid, me.start):
            return self.owner not in LIVE_OWNERS
        return not process_alive(self.pid, self.start)

    def where(self, me: Process) -> str:
        place = "this host" if self.host == me.host else f"host {self.host.split('|', 1)[0]!r}"
        return f"a run on {place} (pid {self.pid})"

    def describe(self, me: Process) -> str:
        """Why the thread is refused: who holds it and until when."""
        return (
            f"{self.where(me)} holds its lease for {max(self.left_s, 0):.1f} s more; its database connection "
            "dropped, but it may still be working (a network blip), and it keeps the thread unless its lease runs "
            "out (it stops renewing) or its process is known dead"
        )


def warn_taken_over(thread_id: str, holder: Holder, me: Process, why: str) -> None:
    """The WARNING of a run that takes a thread over from *holder*, which never released it (*why*)."""
    log.warning(
        "thread %r: taken over from %s, %s: calls it had started and not recorded may have run already (this run's "
        "resume names them)",
        thread_id,
        holder.where(me),
        why,
    )
