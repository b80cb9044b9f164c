"""The sync wrappers' loop (tenxgraph.utils.sync.SyncLoop): run in the caller's thread when free, handed over when
another thread runs it, and never left with work on it that nobody runs."""

from __future__ import annotations

import asyncio
import contextvars
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import pytest

from tenxgraph.utils.sync import SyncLoop, run_sync, to_thread

WHO = contextvars.ContextVar("WHO", default="nobody")


def wait_free(sync: SyncLoop, timeout: float = 5.0) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        with sync.guard:
            if sync.driver is None and sync.handed == 0:
                return True
        time.sleep(0.005)
    return False


def test_a_free_loop_runs_in_the_callers_thread_with_the_callers_context() -> None:
    sync = SyncLoop()

    async def where() -> tuple[str, str]:
        await asyncio.sleep(0)
        return threading.current_thread().name, WHO.get()

    token = WHO.set("caller")
    try:
        assert sync.run(where()) == (threading.current_thread().name, "caller")
    finally:
        WHO.reset(token)
    assert sync.driver is None and sync.helper is None  # nothing was left: no helper was needed


def test_calls_from_many_threads_at_once_all_return_their_own_result() -> None:
    sync = SyncLoop()

    async def work(n: int) -> int:
        await asyncio.sleep(0.001)
        doubled = await to_thread(lambda: n * 2)  # a worker thread's hop back to whichever thread runs the loop
        await asyncio.sleep(0)
        return doubled + 1

    with ThreadPoolExecutor(16) as pool:
        results = list(pool.map(lambda n: sync.run(work(n)), range(800)))
    assert results == [n * 2 + 1 for n in range(800)]
    assert wait_free(sync)  # the helper lets the loop go once nothing is left on it


def test_a_call_from_a_worker_thread_while_the_caller_runs_the_loop() -> None:
    sync = SyncLoop()

    async def inner() -> str:
        await asyncio.sleep(0.01)
        return "inner"

    async def outer() -> str:
        return await to_thread(lambda: sync.run(inner()))  # (a sync tool calling a sync tenxgraph method)

    assert sync.run(outer()) == "inner"
    assert wait_free(sync)


def test_work_left_on_the_loop_runs_on_without_another_call() -> None:
    sync = SyncLoop()
    done = threading.Event()

    async def later() -> None:
        await asyncio.sleep(0.05)
        done.set()

    async def start() -> str:
        asyncio.get_running_loop().create_task(later())  # e.g. a stream's producer the caller stopped reading
        return "started"

    assert sync.run(start()) == "started"
    assert done.wait(5), "a task left on the loop never ran: nobody ran the loop after the caller returned"
    assert wait_free(sync)


def test_an_error_or_an_interrupt_leaves_the_loop_usable() -> None:
    sync = SyncLoop()

    async def fails() -> None:
        raise ValueError("boom")

    async def interrupted() -> None:
        raise KeyboardInterrupt

    async def fine() -> str:
        return "ok"

    with pytest.raises(ValueError, match="boom"):
        sync.run(fails())
    with pytest.raises(KeyboardInterrupt):
        sync.run(interrupted())
    assert wait_free(sync)
    assert sync.run(fine()) == "ok"


def test_run_sync_refuses_a_running_loop() -> None:
    async def nested() -> None:
        async def inner() -> None:
            return None

        run_sync(inner())

    with pytest.raises(RuntimeError, match="inside a running event loop"):
        asyncio.run(nested())


def test_a_forked_child_leaves_the_parents_loop_awake(monkeypatch: pytest.MonkeyPatch) -> None:
    """A child shares the parent's epoll instance: had it closed its copy of the parent's loop (a loop's ``__del__``
    does, for a loop not running) while the parent waited on it, the parent would sleep through a worker thread's
    result (the crash matrix's SIGKILL cells fork while the loop is free)."""
    import gc
    import os

    from tenxgraph.utils import sync

    monkeypatch.setattr(sync, "_sync", SyncLoop())  # a free loop of this test's own, made in this process

    async def noop() -> None:
        return None

    run_sync(noop())
    loop = sync._sync.loop
    pid = os.fork()
    if pid == 0:  # the child lets go of the parent's loop (the fork hook) while the parent waits on it
        try:
            time.sleep(0.05)
            del loop  # (the last reference but the fork hook's)
            gc.collect()  # (a loop is in reference cycles)
            time.sleep(0.3)
        finally:
            os._exit(0)
    start = time.monotonic()
    assert run_sync(asyncio.wait_for(to_thread(lambda: time.sleep(0.2) or "woken"), 3)) == "woken"
    took = time.monotonic() - start
    os.waitpid(pid, 0)
    assert took < 1, f"the parent's loop slept through a worker thread's result ({took:.1f} s)"


def test_a_call_the_driver_makes_between_its_own_steps_runs_there() -> None:
    """A sync generator's ``finally`` run by the garbage collector can call a sync method in the very thread that
    is running the loop, between two of its steps (even while it holds the guard): that call must run the loop
    there, not wait for a driver that is itself."""
    sync = SyncLoop()
    nested: list[str] = []
    work_left = sync._work_left

    async def inner() -> str:
        await asyncio.sleep(0)
        return "inner"

    async def outer() -> str:
        return "outer"

    def collected_here(running: asyncio.Task[object] | None = None) -> bool:
        if not nested:  # (as a finalizer would, once)
            nested.append(sync.run(inner()))
        return work_left(running)

    sync._work_left = collected_here  # type: ignore[method-assign]
    results: list[str] = []
    caller = threading.Thread(target=lambda: results.append(sync.run(outer())), daemon=True)
    caller.start()
    caller.join(5)
    assert not caller.is_alive(), "the driver waited for itself"
    assert results == ["outer"] and nested == ["inner"]
    assert wait_free(sync)


def test_the_helper_outlives_a_system_exit_from_a_task_it_runs() -> None:
    sync = SyncLoop()

    async def start() -> str:
        async def leaves() -> None:
            await asyncio.sleep(0.02)
            raise SystemExit(3)  # (out of the loop with it, in the helper's thread)

        asyncio.get_running_loop().create_task(leaves())
        return "started"

    async def fine() -> str:
        return "ok"

    assert sync.run(start()) == "started"
    time.sleep(0.2)
    results: list[str] = []
    later = threading.Thread(target=lambda: results.append(sync.run(fine())), daemon=True)
    later.start()
    later.join(5)
    assert results == ["ok"], "nobody runs the loop any more: the helper died with the task's SystemExit"
    assert wait_free(sync)
