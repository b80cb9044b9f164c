"""The modes whose resume is more than one run of the app, and the table of every mode (:data:`MODES`).

- ``concurrent``: crashed like ``sigkill``, then contested: resumer A takes the run lock and pauses at a *lock
  window* (a point where a run holds its thread's lock: by default its first node; the budgeted contests of a
  default run pause it at every window of :data:`LOCK_WINDOWS`, one cell each); B must be refused the lock; where
  nothing is in flight (:data:`TAKEOVER_WINDOWS`), C takes the thread as if A's lock had been lost (a dropped
  connection) and finishes it, and A, going on, must be stopped by the version compare-and-swap; elsewhere A goes
  on and finishes. C gets the resume's read fault at ``ledger.read_error``, as any resume does.
- ``recovery``: crashed like ``sigkill``, then resumed by the server's recovery (:class:`tenxgraph.server.recovery.
  Recovery`, which counts the attempt under the run lock and resumes): first while resumer A holds the lock (the
  sweep must leave the thread alone), then, A killed, for real.
- ``prune``: crashed like ``sigkill``; the retention job (``prune_tool_executions``, every record older than now)
  runs before the resume, which must still find the interrupted thread's records.
"""

from __future__ import annotations

import contextlib
import os
import signal
import time
from collections.abc import Callable, Iterator, Mapping
from datetime import timedelta
from typing import Any

from pytest_replaysafe.run.langgraph_app import LangGraphApp
from pytest_replaysafe.run.loop_app import LoopApp
from pytest_replaysafe.run.modes import RESUME_LOCK_TIMEOUT_S, Hit, InProcess, Mode, Runner, SigKill, Stream, arm_resume
from pytest_replaysafe.run.procs import (
    HarnessError,
    child_timeout,
    describe_status,
    fork_child,
    wait_child,
    wait_readable,
)
from pytest_replaysafe.run.pydantic_ai_app import PydanticAIApp

#: Windows at which no tool call is in flight: a run that takes the thread over may finish it (elsewhere a takeover
#: runs an in-flight call again, the in-flight gap of a lost lock, not what a contest judges).
TAKEOVER_WINDOWS = frozenset(
    {
        "run.before_node",
        "tool.before_ledger_read",
        "node.after_complete",
        "run.after_advance",
        "release",
        "ledger_read_after_turn",
    }
)


def window_arrival(window: str, completed_before: int, clean_counts: Mapping[str, int]) -> tuple[str, int]:
    """The crash point and arrival (in the resume) at which the lock holder pauses for *window*; the resume of a
    crash that came after *completed_before* completed nodes."""
    if window == "release":
        return "node.after_complete", max(1, clean_counts.get("node.after_complete", 1) - completed_before)
    if window == "ledger_read_after_turn":
        return "tool.before_ledger_read", 1
    return window, 1


class _Children:
    """Resumers in child processes, each writing what it ended with to a file of its own."""

    def __init__(self, run: Runner, hit: Hit) -> None:
        self.run, self.hit = run, hit

    def start(self, name: str, body: Callable[[], str]) -> int:
        out = self.run.workdir / f"{self.hit.thread}.{name}"

        def main() -> int:
            from tenxgraph.core import crashpoints

            crashpoints.reset()
            out.with_suffix(".result").write_text(body())
            return 0

        return fork_child(main, out.with_suffix(".error"))

    def outcome(self, name: str, pid: int) -> str:
        status = wait_child(pid)
        out = self.run.workdir / f"{self.hit.thread}.{name}"
        if status is None:
            raise HarnessError(f"resumer {name} did not finish within {child_timeout():g}s and was killed (hung?)")
        if not (os.WIFEXITED(status) and os.WEXITSTATUS(status) == 0):
            return "failed: " + describe_status(status, out.with_suffix(".error"))
        return out.with_suffix(".result").read_text()

    @contextlib.contextmanager
    def holder(self, window: tuple[str, int], kill: bool = False) -> Iterator[tuple[bool, list[str]]]:
        """Resumer A, holding the run lock, paused at *window*: yields (whether it got there, its outcome, filled
        in on exit). On exit A goes on (or, *kill*, is killed there) and its outcome is ``finished``, ``stale``
        (its write was refused), ``killed`` or a failure."""
        from tenxgraph.core import crashpoints
        from tenxgraph.utils.errors import StaleStateError, ThreadBusyError

        run, hit = self.run, self.hit
        paused_r, paused_w = os.pipe()
        go_r, go_w = os.pipe()

        def a() -> str:
            def pause(name: str, n: int) -> None:
                os.write(paused_w, b"p")
                if not wait_readable([go_r], child_timeout()):
                    raise HarnessError("resumer A was never told to go on")

            crashpoints.arm(window[0], window[1], pause)
            try:
                run.run_graph(hit.app, hit.resume_input, hit.thread, hit.resume_config, False, "resume")
            except ThreadBusyError:  # a StaleStateError too, but here it means the crashed run's lock never freed
                raise
            except StaleStateError:
                return "stale"
            return "finished"

        pid = self.start("A", a)
        outcome: list[str] = []
        try:
            os.close(paused_w)
            fd = os.pidfd_open(pid)
            try:
                ready = wait_readable([paused_r, fd], child_timeout())
            finally:
                os.close(fd)
            paused = paused_r in ready and os.read(paused_r, 1) == b"p"
            yield paused, outcome
            if kill and paused:
                os.kill(pid, signal.SIGKILL)
                wait_child(pid)
                outcome.append("killed")
            else:
                os.write(go_w, b"g")
                outcome.append(self.outcome("A", pid))
        except BaseException:
            with contextlib.suppress(ProcessLookupError, ChildProcessError):  # never leave A running
                os.kill(pid, signal.SIGKILL)
                os.waitpid(pid, 0)
            raise
        finally:
            for fd_ in (paused_r, go_r, go_w):
                os.close(fd_)


class Concurrent(SigKill):
    name = "concurrent"

    def resume(self, run: Runner, hit: Hit) -> Any:
        Contest(run, hit).play()
        return run.stored_result(hit.app, hit.thread)


class Contest:
    """A holds the lock, paused at the hit's window; B must be refused; at a takeover window C finishes the thread
    as if A's lock were lost, and A's next write must then be refused by the compare-and-swap."""

    def __init__(self, run: Runner, hit: Hit) -> None:
        self.run, self.hit = run, hit
        self.children = _Children(run, hit)

    def b(self) -> str:
        from tenxgraph.core import crashpoints
        from tenxgraph.core.crashpoints import CrashInjected
        from tenxgraph.utils.errors import ThreadBusyError

        def entered(name: str, n: int) -> None:
            raise CrashInjected(name, n)

        hit = self.hit
        crashpoints.arm("run.before_node", 1, entered)
        try:
            self.run.run_graph(
                hit.app, hit.resume_input, hit.thread, {**hit.config, "lock_timeout": 0}, False, "resume"
            )
        except ThreadBusyError:
            return "refused"
        except CrashInjected:
            return "entered"
        return "entered"

    def c(self) -> str:
        from tenxgraph.core import crashpoints
        from tenxgraph.utils.errors import LedgerReadError

        hit = self.hit
        self.run.checkpointer.bypass_lock = True
        arm_resume(hit.point)  # the run that takes over is a resume: it gets the resume's read fault
        try:
            self.run.run_graph(hit.app, hit.resume_input, hit.thread, hit.config, False, "resume")
        except LedgerReadError as exc:  # by design: nothing ran, the thread stays resumable
            if hit.point != "ledger.read_error":
                raise
            crashpoints.reset()
            self.run.run_graph(hit.app, hit.resume_input, hit.thread, hit.config, False, "resume")
            return f"finished, stopped once: {type(exc).__name__}: {exc}"
        return "finished"

    def play(self) -> None:
        hit, children = self.hit, self.children
        window = hit.window
        takeover = (hit.contested_window or window[0]) in TAKEOVER_WINDOWS
        with children.holder(window) as (paused, a):
            hit.contested = paused
            if paused:
                result_b = children.outcome("B", children.start("B", self.b))
                if result_b == "entered":
                    hit.contest.append(
                        f"a second run entered the thread while another run held its run lock at "
                        f"{hit.contested_window or window[0]} (run lock not enforced there)"
                    )
                elif result_b != "refused":
                    hit.contest.append(f"resumer B (expected to be refused the lock) {result_b}")
            if paused and takeover:
                result_c = children.outcome("C", children.start("C", self.c))
                if result_c.startswith("finished, stopped once: "):
                    hit.stopped = result_c.removeprefix("finished, stopped once: ")
                elif result_c != "finished":
                    hit.contest.append(f"the run that took over the thread {result_c}")
        result_a = a[0]
        if paused and takeover and result_a == "finished":
            hit.contest.append(
                "a run that had lost its run lock kept writing after another run advanced the thread: its "
                "compare-and-swap write was accepted (version check not enforced)"
            )
        elif result_a not in ("stale", "finished"):
            hit.contest.append(f"resumer A {result_a}")


class Recover(SigKill):
    """The server's recovery as the resume path: it must leave a thread that a live run holds alone, then finish
    it once that run is gone."""

    name = "recovery"

    def resume(self, run: Runner, hit: Hit) -> Any:
        from tenxgraph.utils.sync import run_sync

        children = _Children(run, hit)
        with children.holder(hit.window, kill=True) as (paused, _):
            hit.contested = paused
            if paused:
                busy = run_sync(self._recover(run, hit))
                if busy != "busy":
                    hit.contest.append(
                        f"the recovery sweep answered {busy!r} for a thread whose run lock a live run held: "
                        "recovery must leave a live run's thread alone"
                    )
        from tenxgraph.core import crashpoints

        outcome = "busy"
        arm_resume(hit.point)  # the recovery is a resume: it gets the resume's read fault
        try:
            for _ in range(int(RESUME_LOCK_TIMEOUT_S / 0.05)):  # (PostgreSQL frees a killed session's lock later)
                outcome = run_sync(self._recover(run, hit))
                if outcome == "failed" and hit.point == "ledger.read_error" and hit.stopped is None:
                    hit.stopped = "the recovery's ledger read failed (its attempt is counted), and it was tried again"
                    crashpoints.reset()
                    continue
                if outcome != "busy":
                    break
                time.sleep(0.05)
        finally:
            crashpoints.reset()
        status = run.stored_result(hit.app, hit.thread).status
        # ("gone" and done: a run the check above let in finished it; "gone" and interrupted: the thread waits for
        # a person, and recovery leaves it alone)
        if outcome != "recovered" and not (outcome == "gone" and status in ("done", "interrupted")):
            raise RuntimeError(f"the recovery of thread {hit.thread!r} answered {outcome!r}, not 'recovered'")
        if hit.resume_input is not None or status == "interrupted":  # a conversation: the client sends its turns
            # again (stored ones are skipped); a pause: the person answers it
            return run.run_graph(hit.app, hit.resume_input, hit.thread, hit.resume_config, hit.stream, "resume")
        return run.stored_result(hit.app, hit.thread)

    @staticmethod
    async def _recover(run: Runner, hit: Hit) -> str:
        from tenxgraph.server.recovery import Recovery

        assert not isinstance(hit.app, LangGraphApp | PydanticAIApp | LoopApp), "recovery is tenxgraph's server's"
        graph = hit.app.copy(run.checkpointer)  # a fresh Recovery each time: no back-off between the harness's tries
        return await Recovery(graph, max_attempts=10**6).recover(hit.thread)


class Prune(SigKill):
    """The retention job runs between the crash and the resume: an interrupted thread's records must survive it."""

    name = "prune"

    def resume(self, run: Runner, hit: Hit) -> Any:
        from tenxgraph.utils.sync import run_sync

        run_sync(run.checkpointer.aprune_tool_executions(older_than=timedelta(0)))
        return InProcess.resume(self, run, hit)


class DoubleResume(SigKill):
    """A person's answers arrive twice (a double click, a retried request): killed like ``sigkill``; every Resume
    the harness's person sends is sent again once it returned, and the resume re-sends the last Resume sent before
    the kill (see :class:`~.driver.CellDriver`). Nothing may run twice, and the repeat must change nothing."""

    name = "double-resume"


class Resumers(SigKill):
    """k processes resume one pause at once: killed like ``sigkill``; in the resume, each Resume the harness's
    person sends is sent by k forked processes released together (see :mod:`.resumers`)."""

    name = "resumers"


MODES: Mapping[str, Mode] = {
    m.name: m for m in (InProcess(), SigKill(), Stream(), Concurrent(), Recover(), Prune(), DoubleResume(), Resumers())
}
"""Every crash mode by name."""
