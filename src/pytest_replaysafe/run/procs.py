"""Forked processes for the crash matrix: fork safely, reap with a deadline (pidfd, no sleep polling)."""

from __future__ import annotations

import os
import select
import signal
import sys
import traceback
from collections.abc import Callable
from pathlib import Path

CHILD_TIMEOUT_S = 120.0
"""A forked child that has not finished by then is killed and its cell reported as an error (never a hang);
``REPLAYSAFE_CHILD_TIMEOUT`` (seconds) overrides it."""
QUIESCE_TIMEOUT_S = 30.0
CHILD_DONE = 3  # the child finished its run: the point was not reached
CHILD_FAILED = 4


class HarnessError(RuntimeError):
    """The harness could not run a cell (not a verdict on the runtime): reported as ``error``."""


def fork_child(body: Callable[[], int], failure: Path) -> int:
    """Fork; the child runs *body* and exits with its code (never returning into pytest), writing its traceback
    to *failure* if it raises. Returns the child's pid.

    Forking while another thread is inside a driver (a sync tool still running after its task was cancelled by
    an in-process crash) copies that thread's locks held into a child that can never release them; so first
    wait until no such thread runs."""
    from tenxgraph.utils.sync import wait_threads_idle

    if not wait_threads_idle(QUIESCE_TIMEOUT_S):
        raise HarnessError(
            f"a sync tool or node thread was still running after {QUIESCE_TIMEOUT_S:g}s; forking now could copy "
            "its locks into the child (is a tool blocking forever?)"
        )
    sys.stdout.flush()
    sys.stderr.flush()
    pid = os.fork()
    if pid == 0:
        code = CHILD_FAILED
        try:
            code = body()
        except BaseException:
            failure.write_text(traceback.format_exc())
        finally:
            os._exit(code)
    return pid


def wait_readable(fds: list[int], timeout: float) -> set[int]:
    """Those of *fds* that became readable (or hung up) within *timeout* seconds: ``poll``, which, unlike
    ``select``, takes a descriptor numbered past 1024 (a long matrix's process may hold that many)."""
    poller = select.poll()
    for fd in fds:
        poller.register(fd, select.POLLIN)
    return {fd for fd, _ in poller.poll(timeout * 1000)}


def child_timeout() -> float:
    return float(os.environ.get("REPLAYSAFE_CHILD_TIMEOUT") or CHILD_TIMEOUT_S)


def wait_child(pid: int, timeout: float | None = None) -> int | None:
    """Reap *pid*: its wait status, or None if it had to be killed for overrunning *timeout* (default:
    :func:`child_timeout`). Waits on a pidfd, so the caller resumes the moment the child is gone."""
    timeout = child_timeout() if timeout is None else timeout
    fd = os.pidfd_open(pid)
    try:
        if not wait_readable([fd], timeout):
            os.kill(pid, signal.SIGKILL)
            os.waitpid(pid, 0)
            return None
    finally:
        os.close(fd)
    return os.waitpid(pid, 0)[1]


def describe_status(status: int, failure: Path) -> str:
    if failure.exists():
        return failure.read_text()
    if os.WIFSIGNALED(status):
        return f"killed by signal {os.WTERMSIG(status)}"
    return f"exit code {os.WEXITSTATUS(status)}"
