"""The SQLite run lock's primitive: an exclusive lock on one byte of a shared lock file, taken without waiting.

Linux open-file-description locks (``F_OFD_SETLK``) are held per open file, so two runs of one process conflict
as two processes do, and the kernel releases them when the descriptor is closed or the holder dies. Where they do
not exist, a ``flock`` on the whole (per-thread) file stands in. :class:`HeldLock` notices a lock file that another
process removed or replaced, and takes the lock again on the new file."""

from __future__ import annotations

import errno
import fcntl
import logging
import os
import sqlite3
import struct
from typing import Any

from tenxgraph.storage.checkpointer.holders import Holder, Process, warn_taken_over
from tenxgraph.utils.constants import LOGGER_NAME
from tenxgraph.utils.errors import ThreadBusyError

log = logging.getLogger(LOGGER_NAME)

OFD_SETLK: int | None = getattr(fcntl, "F_OFD_SETLK", None)


def lock_byte(fd: int, offset: int) -> None:
    """Take the write lock on one byte of *fd* without waiting (``BlockingIOError`` when it is held)."""
    if OFD_SETLK is None:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        return
    # struct flock: l_type, l_whence, l_start, l_len, l_pid (0 for open-file-description locks)
    request = struct.pack("@hhqqi4x", fcntl.F_WRLCK, os.SEEK_SET, offset, 1, 0)
    try:
        fcntl.fcntl(fd, OFD_SETLK, request)
    except OSError as exc:
        if exc.errno in (errno.EAGAIN, errno.EACCES):
            raise BlockingIOError(exc.errno, "the run lock is held") from None
        raise


class HeldLock:
    """A run's lock on *path* (an open descriptor and the byte it locks), and the file it was taken on: a lock file
    that another process removed or replaced no longer guards anything, so :meth:`retake` locks the file now at
    *path* (the thread's lease row in the database keeps a second run out meanwhile)."""

    def __init__(self, path: str, offset: int, mode: int) -> None:
        self.path, self.offset, self.mode = path, offset, mode
        self.fd = os.open(path, os.O_RDWR | os.O_CREAT, mode)
        try:
            lock_byte(self.fd, offset)
        except BaseException:
            os.close(self.fd)
            raise
        self.inode = _inode(os.fstat(self.fd))

    def moved(self) -> bool:
        """Whether *path* is no longer the file this lock is on (removed, or replaced by a new file)."""
        try:
            return _inode(os.stat(self.path)) != self.inode
        except FileNotFoundError:
            return True

    def retake(self) -> bool:
        """Lock the byte again on the file now at *path*; False while another run holds it there."""
        try:
            fresh = HeldLock(self.path, self.offset, self.mode)
        except BlockingIOError:
            return False
        os.close(self.fd)
        self.fd, self.inode = fresh.fd, fresh.inode
        return True

    def close(self) -> None:
        os.close(self.fd)


def _inode(st: os.stat_result) -> tuple[int, int]:
    return st.st_dev, st.st_ino


def refuse_a_live_holder(row: Any, thread_id: str, lock_path: str) -> None:
    """The thread's lease row (``owner, host, pid, pid_start``) names who last took it without releasing it:
    :class:`ThreadBusyError` while that is a live process of this host (the lock file was removed or replaced
    under it); a holder that is gone, or of another host (trusted to the byte lock), is taken over with a
    warning."""
    owner, host, pid, start = row
    holder, me = Holder(str(owner), str(host), int(pid), int(start), True, 0.0), Process.current()
    if holder.host == me.host and not holder.dead(me):
        raise ThreadBusyError(
            thread_id, holder=f"{holder.where(me)} runs it, though the run lock file {lock_path} was removed under it"
        )
    warn_taken_over(thread_id, holder, me, "which did not end its run")


def write_lease_row(conn: sqlite3.Connection, thread_id: str, owner: str, state: str) -> str:
    """In a state write's transaction: the lease row written (state ``todo``) or deleted (``release``); returns
    the row's new state."""
    if state == "todo":
        me = Process.current()
        conn.execute(
            "INSERT OR REPLACE INTO run_leases (thread_id, owner, host, pid, pid_start) VALUES (?, ?, ?, ?, ?)",
            (thread_id, owner, me.host, me.pid, me.start),
        )
        return "written"
    if state == "release":
        conn.execute("DELETE FROM run_leases WHERE thread_id = ? AND owner = ?", (thread_id, owner))
        return "released"
    return state


#: File systems whose locks are the file server's (or a user-space daemon's) to keep: SQLite and its run lock
#: cannot promise much there, with writers on several hosts.
NETWORK_FILE_SYSTEMS = frozenset({"nfs", "nfs4", "cifs", "smb3", "smbfs", "9p", "fuse.sshfs", "ceph", "glusterfs"})


def file_system_of(path: str, mountinfo: str | None = None) -> str | None:
    """The type of the file system *path* is on (the longest mount point above it in ``/proc/self/mountinfo``, or
    the given text), or None where that cannot be read."""
    if mountinfo is None:
        try:
            with open("/proc/self/mountinfo", encoding="utf-8") as fh:
                mountinfo = fh.read()
        except OSError:
            return None
    real = os.path.realpath(path)
    best, kind = "", None
    for line in mountinfo.splitlines():
        fields = line.split(" - ", 1)
        left = fields[0].split()
        if len(fields) < 2 or len(left) < 5:
            continue
        point = left[4].replace("\\040", " ")
        inside = real == point or real.startswith(point.rstrip("/") + "/")
        if inside and len(point) >= len(best):
            best, kind = point, fields[1].split()[0]
    return kind


def warn_if_networked(path: str) -> None:
    """A WARNING when the database is on a network file system (once per connection)."""
    kind = file_system_of(path)
    if kind in NETWORK_FILE_SYSTEMS:
        log.warning(
            "SQLite database %s is on a network file system (%s): SQLite's locking and its run lock rely on the file "
            "server's lock service there; with workers on several hosts use PostgreSQL (PgCheckpointer)",
            path,
            kind,
        )
