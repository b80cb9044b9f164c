"""The ``resumers`` mode: k processes answer one pause at once (a person's "yes" delivered to every worker of a
queue, a webhook retried while the first delivery runs). Killed like ``sigkill``; in the resume, every Resume the
harness's person sends (``approvals``) is sent by :data:`RESUMERS` forked processes released together, then once
more by the harness (which reads the thread as it then stands). The execution log and the effects fixture count
what the bodies did from outside the runtime: one pause, one effect, whatever the number of resumers; and every
resumer is answered (a resumer that fails is a problem the verdict names)."""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path

from pytest_replaysafe.judge.evidence import Entry, ExecutionLog
from pytest_replaysafe.run.approvals import AtOnce
from pytest_replaysafe.run.procs import HarnessError, describe_status, fork_child, wait_child

#: How many processes send each Resume at once.
RESUMERS = 3


def send_at_once(send: Callable[[], object], workdir: Path, log: ExecutionLog, thread: str) -> None:
    """Fork :data:`RESUMERS` processes that each call *send* (one resume of *thread*) the moment all of them
    are forked, and reap them; a resumer that failed or hung is logged as a ``pause_problem`` of *thread*."""
    from tenxgraph.core import crashpoints

    go_read, go_write = os.pipe()
    children: list[tuple[int, Path]] = []

    def resumer() -> int:
        os.close(go_write)
        os.read(go_read, 1)  # (end of file: the harness let every resumer go at once)
        crashpoints.reset()  # a plain resumer: no crash, no fault of the cell's resume
        send()
        return 0

    try:
        for n in range(RESUMERS):
            failure = workdir / f"{thread}.resumer{n}.error"
            children.append((fork_child(resumer, failure), failure))
    finally:
        os.close(go_read)
        os.close(go_write)
    for n, (pid, failure) in enumerate(children):
        status = wait_child(pid)
        if status is None:
            raise HarnessError(f"resumer {n + 1} of {RESUMERS} on thread {thread!r} did not finish and was killed")
        if not (os.WIFEXITED(status) and os.WEXITSTATUS(status) == 0):
            said = describe_status(status, failure).strip().splitlines()[-1]
            log.write(Entry(thread, "resume", "pause_problem", out=(
                f"resumer {n + 1} of {RESUMERS} sending the same Resume at once failed ({said}): every resumer of "
                "one pause must be answered with what stands"
            )))  # fmt: skip


def at_once_on(workdir: Path, log: ExecutionLog, thread: str) -> AtOnce:
    """How the resume of *thread* sends each Resume in the ``resumers`` mode (:func:`send_at_once`)."""
    return lambda send: send_at_once(send, workdir, log, thread)
