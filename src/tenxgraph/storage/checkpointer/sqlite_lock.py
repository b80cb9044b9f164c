"""The SQLite run lock's primitive: an exclusive lock on one byte of a shared lock file, taken without waiting.

Linux open-file-description locks (``F_OFD_SETLK``) are held per open file, so two runs of one process conflict
as two processes do, and the kernel releases them when the descriptor is closed or the holder dies. Where they do
not exist, a ``flock`` on the whole (per-thread) file stands in."""

from __future__ import annotations

import errno
import fcntl
import os
import struct

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
