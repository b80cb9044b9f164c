"""LangGraph's own crash points in a user's tests: a saver wrapper that fires them.

The ``langgraph.*`` crash points sit at LangGraph's step boundaries, in its saver: LangGraph's own savers know
nothing of them. Wrap the saver a test compiles its graph with, and a point armed the way every crash point is
(``TENXGRAPH_CRASH_AT=langgraph.before_put:1:kill`` in a child process, ``crashpoints.armed(...)`` in-process)
fires there::

    saver = CrashPointSaver(InMemorySaver())            # or SqliteSaver(conn), PostgresSaver(conn), ...
    app = graph.compile(checkpointer=saver)

- ``langgraph.after_put_writes``: a task's writes are saved; the step's checkpoint is not.
- ``langgraph.before_put``: a step is done; its checkpoint is not saved yet.
- ``langgraph.after_put``: the step's checkpoint is saved.

LangGraph saves a task's writes in a background thread and goes on with the next steps (``durability="sync"``
waits for a step's checkpoint, not for its tasks' writes): a kill at ``langgraph.after_put_writes`` can land while
a later step's tool runs. The crash matrix plays that order on purpose at ``langgraph.late_put_writes``, a point
of its own saver (``pytest_replaysafe.run.langgraph_race``); this wrapper does not fire it.

Everything else goes to the wrapped saver unchanged; its async methods to the wrapped saver's async ones (wrap
``AsyncSqliteSaver`` / ``AsyncPostgresSaver`` for an async graph). Disarmed, a point costs one global check: the
wrapper is safe to leave in, but it is meant for tests. The crash matrix's harness compiles LangGraph apps with a
subclass of it (``pytest_replaysafe.run.langgraph_app``)."""

from __future__ import annotations

from collections.abc import AsyncIterator, Collection, Iterator, Mapping, Sequence
from typing import Any

from langgraph.checkpoint.base import BaseCheckpointSaver

from tenxgraph.ledger import probe

__all__ = ["CrashPointSaver"]


class CrashPointSaver(BaseCheckpointSaver):  # type: ignore[type-arg]
    """A LangGraph saver that fires the ``langgraph.*`` crash points around *inner*'s writes (see the module's
    docstring). *inner*: any ``BaseCheckpointSaver``."""

    def __init__(self, inner: BaseCheckpointSaver[Any]) -> None:
        if not isinstance(inner, BaseCheckpointSaver):
            raise TypeError(
                f"CrashPointSaver(inner): {type(inner).__name__} is not a LangGraph saver; give it the saver the "
                "graph would be compiled with (InMemorySaver(), SqliteSaver(conn), PostgresSaver(conn), ...)"
            )
        super().__init__(serde=inner.serde)
        self._saver = inner

    @property
    def inner(self) -> BaseCheckpointSaver[Any]:
        """The wrapped saver."""
        return self._saver

    def writing(self) -> None:
        """Called before each write (``put``, ``put_writes``); a subclass may refuse it. Does nothing here."""

    @property
    def config_specs(self) -> list[Any]:
        return list(self.inner.config_specs)

    def with_allowlist(self, extra_allowlist: Collection[tuple[str, ...]]) -> BaseCheckpointSaver[Any]:
        inner = self.inner.with_allowlist(extra_allowlist)
        return self if inner is self.inner else type(self)(inner)

    # -- writes: the crash points --------------------------------------------------------------------------------
    def put(self, config: Any, checkpoint: Any, metadata: Any, new_versions: Any) -> Any:
        self.writing()
        probe.point("langgraph.before_put")
        saved = self.inner.put(config, checkpoint, metadata, new_versions)
        probe.point("langgraph.after_put")
        return saved

    def put_writes(self, config: Any, writes: Sequence[tuple[str, Any]], task_id: str, task_path: str = "") -> None:
        self.writing()
        self.inner.put_writes(config, writes, task_id, task_path)
        probe.point("langgraph.after_put_writes")

    async def aput(self, config: Any, checkpoint: Any, metadata: Any, new_versions: Any) -> Any:
        self.writing()
        probe.point("langgraph.before_put")
        saved = await self.inner.aput(config, checkpoint, metadata, new_versions)
        probe.point("langgraph.after_put")
        return saved

    async def aput_writes(
        self, config: Any, writes: Sequence[tuple[str, Any]], task_id: str, task_path: str = ""
    ) -> None:
        self.writing()
        await self.inner.aput_writes(config, writes, task_id, task_path)
        probe.point("langgraph.after_put_writes")

    # -- everything else: the wrapped saver's ----------------------------------------------------------------------
    def get_tuple(self, config: Any) -> Any:
        return self.inner.get_tuple(config)

    def list(self, config: Any, **kw: Any) -> Iterator[Any]:
        return self.inner.list(config, **kw)

    def get_next_version(self, current: Any, channel: None) -> Any:
        return self.inner.get_next_version(current, channel)

    def get_delta_channel_history(self, *, config: Any, channels: Sequence[str]) -> Mapping[str, Any]:
        return self.inner.get_delta_channel_history(config=config, channels=channels)

    def delete_thread(self, thread_id: str) -> None:
        self.inner.delete_thread(thread_id)

    def copy_thread(self, source_thread_id: str, target_thread_id: str) -> None:
        self.inner.copy_thread(source_thread_id, target_thread_id)

    def delete_for_runs(self, run_ids: Sequence[str]) -> None:
        self.inner.delete_for_runs(run_ids)

    def prune(self, thread_ids: Sequence[str], *, strategy: str = "keep_latest") -> None:
        self.inner.prune(thread_ids, strategy=strategy)

    async def aget_tuple(self, config: Any) -> Any:
        return await self.inner.aget_tuple(config)

    async def alist(self, config: Any, **kw: Any) -> AsyncIterator[Any]:
        async for item in self.inner.alist(config, **kw):
            yield item

    async def aget_delta_channel_history(self, *, config: Any, channels: Sequence[str]) -> Mapping[str, Any]:
        return await self.inner.aget_delta_channel_history(config=config, channels=channels)

    async def adelete_thread(self, thread_id: str) -> None:
        await self.inner.adelete_thread(thread_id)

    async def acopy_thread(self, source_thread_id: str, target_thread_id: str) -> None:
        await self.inner.acopy_thread(source_thread_id, target_thread_id)

    async def adelete_for_runs(self, run_ids: Sequence[str]) -> None:
        await self.inner.adelete_for_runs(run_ids)

    async def aprune(self, thread_ids: Sequence[str], *, strategy: str = "keep_latest") -> None:
        await self.inner.aprune(thread_ids, strategy=strategy)
