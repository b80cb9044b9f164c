"""Recovery: a server finishes the threads whose run was interrupted (its process died), by itself, on start-up and
then periodically, so a refund half-done by a crashed server does not wait for a client that may never retry.

A sweep lists the threads whose stored status is ``running`` (:meth:`BaseCheckpointer.alist_interrupted_threads`)
and resumes each with the same run lock, ledger and in-doubt policies as any run, a few at a time. A thread
that another run holds is left alone (its lock tells a live run from a dead one). Each attempt is counted in the
thread's state (``meta.recoveries``) under its run lock *before* the resume, so a thread that kills its worker
every time is parked after ``max_attempts`` (a log line, ``recovery_parked``) instead of crash-looping the fleet;
a client's own request can still resume it.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
import time
from collections.abc import Callable
from typing import Any

from tenxgraph.core.graph.compiled import CompiledGraph
from tenxgraph.storage.checkpointer.base import hold_run_lock
from tenxgraph.utils.constants import LOGGER_NAME
from tenxgraph.utils.errors import StaleStateError, ThreadBusyError
from tenxgraph.utils.events import emit_event

log = logging.getLogger(f"{LOGGER_NAME}.server")


class Recovery:
    def __init__(
        self,
        graph: CompiledGraph[Any],
        *,
        interval: float = 30.0,
        concurrency: int = 4,
        max_attempts: int = 3,
        batch: int = 100,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        if interval <= 0 or concurrency < 1 or max_attempts < 1 or batch < 1:
            raise ValueError(
                "recovery needs interval > 0 seconds, concurrency >= 1, max_attempts >= 1 and batch >= 1; got "
                f"interval={interval!r}, concurrency={concurrency!r}, max_attempts={max_attempts!r}, batch={batch!r}"
            )
        self.graph = graph
        self.interval = interval
        self.concurrency = concurrency
        self.max_attempts = max_attempts
        self.batch = batch
        self._parked: set[str] = set()  # logged once per process
        self._tried: dict[str, float] = {}  # thread -> when this process last tried it (for the back-off), until
        # the thread is finished: a long-lived server does not keep every thread it ever recovered
        self._clock = clock
        self._task: asyncio.Task[None] | None = None

    async def sweep(self) -> dict[str, int]:
        """One pass: resume every interrupted thread this server can take. Returns counts by what happened."""
        try:
            threads = await self.graph.checkpointer.alist_interrupted_threads(self.batch)
        except NotImplementedError as exc:
            emit_event("recovery_unsupported", logging.WARNING, reason=str(exc))
            return {}
        gate = asyncio.Semaphore(self.concurrency)
        outcomes: dict[str, int] = {}

        async def one(thread_id: str) -> None:
            async with gate:
                outcome = await self.recover(thread_id)
            outcomes[outcome] = outcomes.get(outcome, 0) + 1

        await asyncio.gather(*(one(t) for t in threads))
        return outcomes

    async def recover(self, thread_id: str) -> str:
        """``recovered``, ``busy`` (another run holds it), ``backing_off`` (tried before by this process: it waits
        1, 2, 4... sweep intervals), ``parked``, ``failed`` or ``gone`` (not interrupted)."""
        cp = self.graph.checkpointer
        try:
            async with hold_run_lock(cp, thread_id, None):  # count the attempt, durably, before making it
                snap = await cp.aget_thread(thread_id)
                meta = dict((snap.values.get("meta") or {}) if snap is not None else {})
                if snap is None or meta.get("status") != "running":
                    self._tried.pop(thread_id, None)  # (kept only while a thread needs recovering)
                    return "gone"
                attempts = int(meta.get("recoveries") or 0)
                waited = self._clock() - self._tried.get(thread_id, -math.inf)
                if attempts and waited < self.interval * 2 ** (attempts - 1):  # back off: 1, 2, 4... intervals
                    return "backing_off"
                if attempts >= self.max_attempts:
                    if thread_id not in self._parked:
                        self._parked.add(thread_id)
                        emit_event(
                            "recovery_parked", logging.ERROR, thread_id=thread_id, attempts=attempts,
                            hint="its recoveries failed or killed their worker; resume it with a request once fixed",
                        )  # fmt: skip
                    return "parked"
                state = {**snap.values, "meta": {**meta, "recoveries": attempts + 1}}
                await cp.aput_thread(thread_id, state, expected_version=snap.version)
                self._tried[thread_id] = self._clock()
        except (ThreadBusyError, StaleStateError):
            return "busy"
        emit_event("recovery_started", logging.INFO, thread_id=thread_id, attempt=attempts + 1)
        started = time.perf_counter()
        try:
            result = await self.graph.ainvoke(None, {"thread_id": thread_id, "lock_timeout": 0})
        except ThreadBusyError:
            return "busy"
        except Exception as exc:
            emit_event(
                "recovery_failed", logging.WARNING, thread_id=thread_id, attempt=attempts + 1,
                error=f"{type(exc).__name__}: {exc}",
            )  # fmt: skip
            return "failed"
        self._tried.pop(thread_id, None)
        emit_event(
            "run_recovered", logging.INFO, thread_id=thread_id, status=result.status, version=result.version,
            seconds=round(time.perf_counter() - started, 6),
        )  # fmt: skip
        return "recovered"

    # -- the background loop of a server --------------------------------------------------------------------
    def start(self) -> None:
        self._task = asyncio.get_running_loop().create_task(self._loop())

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
            self._task = None

    async def _loop(self) -> None:
        while True:
            try:
                outcomes = await self.sweep()
                if outcomes:
                    emit_event("recovery_sweep", logging.INFO, **outcomes)
            except Exception as exc:  # a sweep that failed (the database away): logged, and tried again later
                emit_event("recovery_sweep_failed", logging.WARNING, error=f"{type(exc).__name__}: {exc}")
            await asyncio.sleep(self.interval)
