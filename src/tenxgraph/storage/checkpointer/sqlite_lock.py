"""The SQLite run lock's primitive: an exclusive lock on one byte of a shared lock file, taken without waiting.

Linux open-file-description locks (``F_OFD_SETLK``) are held per open file, so two runs of one process conflict
as two processes do, and the kernel releases them when the descriptor is closed or the holder dies. Where they do
not exist, a ``flock`` on the whole (per-thread) file stands in. :class:`HeldLock` notices a lock file that another
process removed or replaced, and takes the lock again on the new file."""

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
