"""A second worker during a storage fault: in a ``drop`` or ``outage`` cell, while the faulted run still holds its
thread, another worker (a client's retry, another server's recovery sweep) tries to resume the thread.

It arrives twice, while the run is held at the fault's point (its event loop paused, so a call in flight stays in
flight): during the fault, before the run has noticed it; and, at the points where a call is in flight
(:data:`IN_FLIGHT_POINTS`), again after one and a half leases (:data:`MATRIX_LEASE_S`), when a lease that nobody
renewed would have run out. Both times it must be refused: a worker that takes a live run's thread is a problem of
the cell (the lease not enforced, or not renewed), and whatever it runs again is judged like any second
execution.

The second worker has its own checkpointer on the same storage (through the cell's proxy in an ``outage`` cell)
and its own event loop, in a thread of its own; its ledger writes go to the cell's log like the run's own.
"""

from __future__ import annotations

import asyncio
import threading
import time
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from pytest_replaysafe.run.modes import Hit, Runner

#: The run lease of the matrix's PostgreSQL checkpointers: short, so that a cell outlasts a lease nobody renews;
#: long enough that renewals (every third of it) reach PostgreSQL after a 0.2 s outage on a loaded 2-core machine
#: (0.6 s did not, once in a CI run with the Pydantic AI cells beside: the lease ran out during the fault).
MATRIX_LEASE_S = 1.2
#: Points at which a call of the run is in flight (its effect may be applied, nothing is recorded).
IN_FLIGHT_POINTS = frozenset({"tool.in_flight", "tool.after_return"})


def second_worker(run: Runner, hit: Hit) -> str:
    """Resume *hit*'s thread as another worker would: ``refused``, ``finished`` or ``failed: <why>``."""
    from pytest_replaysafe.run.langgraph_app import LangGraphApp
    from pytest_replaysafe.run.loop_app import LoopApp
    from pytest_replaysafe.run.pydantic_ai_app import PydanticAIApp
    from pytest_replaysafe.run.spy import RecordingCheckpointer
    from tenxgraph.storage.checkpointer.pg import PgCheckpointer
    from tenxgraph.utils.errors import ThreadBusyError

    inner: Any = run.checkpointer.inner
    outcome: list[str] = []

    async def resume() -> None:
        other = PgCheckpointer(postgres_dsn=inner.postgres_dsn, schema=inner.schema, run_lease=inner.run_lease)
        try:
            assert not isinstance(hit.app, LangGraphApp | PydanticAIApp | LoopApp), "tenxgraph's run lock only"
            graph = hit.app.copy(RecordingCheckpointer(other, run.checkpointer.log))
            await graph.ainvoke(None, {**hit.config, "thread_id": hit.thread, "lock_timeout": 0})
            outcome.append("finished")
        except ThreadBusyError:
            outcome.append("refused")
        except Exception as exc:
            outcome.append(f"failed: {type(exc).__name__}: {exc}")
        finally:
            await other.aclose()

    worker = threading.Thread(target=lambda: asyncio.run(resume()), name="replaysafe-second-worker")
    worker.start()
    worker.join()
    return outcome[0] if outcome else "failed: the second worker's thread died"


def intrude(run: Runner, hit: Hit, point: str) -> str:
    """The second worker's visits while the run is held at *point*; returns what they met (for the timeline) and
    adds a problem to the cell when one took the thread."""
    inner: Any = run.checkpointer.inner
    if not inner.holds_thread(hit.thread):  # (before its lock, or after its release: the thread is free anyway)
        return ""
    first = second_worker(run, hit)
    seen = [f"a second worker arriving during the fault: {first}"]
    if _entered(first):
        hit.contest.append(
            f"a second worker took the thread during the fault while its run was alive and held it ({first}): the "
            "run lease was not enforced"
        )
    elif point in IN_FLIGHT_POINTS:
        wait = 1.5 * float(inner.run_lease)
        time.sleep(wait)
        later = second_worker(run, hit)
        seen.append(f"again {wait:.1f} s later: {later}")
        if _entered(later):
            hit.contest.append(
                f"a second worker took the thread {wait:.1f} s after the fault, while its run was alive with a call "
                f"in flight ({later}): the run lease was not renewed, or not enforced"
            )
    return "; ".join(seen)


def _entered(outcome: str) -> bool:
    """Whether the second worker got the thread: refused, or unable to reach the storage at all, it did not."""
    return outcome != "refused" and "StorageConnectionError" not in outcome
