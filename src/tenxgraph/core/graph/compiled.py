"""CompiledGraph: the durable run loop.

Order of persistence, per step:
1. the node about to run is already stored as ``meta.current_node`` (by the previous step or the run's start):
   a killed process re-runs exactly that node on resume;
2. the node runs (under ``node_timeout``);
3. its messages, its state update and the next node are stored in one compare-and-swap write: only now does
   the run advance.
A node that pauses for a person (an approval, ``interrupt()``) stores its interrupts instead, with status
``interrupted``, and stays current; ``Resume`` records the answers in the ledger (:mod:`.pauses`) and runs it again.
(Past the ~350-line guide: the run loop, its persistence order and its pauses read top to bottom in one place.)
Every write carries the version this run last read or wrote; it is never refreshed from storage mid-run, so a
concurrent run on the same thread makes one of them fail with ``StaleStateError`` instead of interleaving.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
from collections.abc import AsyncGenerator, AsyncIterator, Iterator, Mapping
from typing import Any, Generic, NoReturn, TypeVar

from tenxgraph.core.crashpoints import crash_point
from tenxgraph.core.graph.compile_checks import check_transactional, is_async, with_in_doubt_default
from tenxgraph.core.graph.graph_spec import GraphSpec
from tenxgraph.core.graph.message_cache import MessageCache
from tenxgraph.core.graph.pauses import asked_of, decision_keys, load_decisions, record_decisions, waiting
from tenxgraph.core.graph.results import RunResult, StreamEvent
from tenxgraph.core.graph.streaming import RunStream, StreamMode, parse_modes, stream_run, sync_events, sync_stream
from tenxgraph.core.tools.config import RunConfig
from tenxgraph.core.tools.context import RunContext, running_node
from tenxgraph.core.tools.interrupts import GraphInterrupt, Interrupt, Pauses, Resume
from tenxgraph.core.tools.observe import RunObserver
from tenxgraph.core.tools.tracing import run_span, span, tracer_for
from tenxgraph.state.messages import JSON, Message
from tenxgraph.state.state import AgentState
from tenxgraph.storage.checkpointer.base import BaseCheckpointer, RunLockSession, hold_run_lock
from tenxgraph.storage.checkpointer.memory import InMemoryCheckpointer
from tenxgraph.utils.constants import END, LOGGER_NAME
from tenxgraph.utils.errors import ConfigError, GraphBuildError, GraphRecursionError, NodeTimeoutError, RunLockLostError
from tenxgraph.utils.events import emit_event
from tenxgraph.utils.sync import run_sync, to_thread_in

Input = Mapping[str, Any] | Resume | None
"""A run's input: new messages and values, a :class:`Resume` answering a paused thread, or None (resume)."""

log = logging.getLogger(LOGGER_NAME)
S = TypeVar("S", bound=AgentState)

__all__ = ["CompiledGraph", "RunResult", "StreamEvent"]


class CompiledGraph(Generic[S]):
    """A checked graph bound to a checkpointer. Safe to create anew over the same checkpointer to resume."""

    def __init__(
        self, graph: GraphSpec[S], checkpointer: BaseCheckpointer | None = None, *, on_in_doubt: str | None = None
    ) -> None:
        if checkpointer is not None and not isinstance(checkpointer, BaseCheckpointer):
            raise ConfigError(f"checkpointer must be a BaseCheckpointer, got {type(checkpointer).__name__}")
        self.checkpointer: BaseCheckpointer = checkpointer if checkpointer is not None else InMemoryCheckpointer()
        self.state_schema: type[S] = graph.state_schema
        self.nodes = {name: with_in_doubt_default(fn, on_in_doubt) for name, fn in graph.nodes.items()}
        check_transactional(self.nodes, self.checkpointer)
        self.edges = dict(graph.edges)
        self.conditional = dict(graph.conditional)
        assert graph.entry_point is not None
        self.entry_point: str = graph.entry_point
        self._async_nodes = {name: is_async(fn) for name, fn in self.nodes.items()}
        self._fields = set(self.state_schema.field_names()) - {"meta"}
        #: Decoded messages of recent threads: a turn reads only what was stored since the last one.
        self.message_cache = MessageCache()

    def copy(self, checkpointer: BaseCheckpointer | None = None) -> CompiledGraph[S]:
        """A new graph object with the same nodes and edges, over *checkpointer* (default: the same one)."""
        clone = object.__new__(CompiledGraph)
        clone.__dict__.update(self.__dict__)
        clone.checkpointer = checkpointer if checkpointer is not None else self.checkpointer
        clone.message_cache = MessageCache(self.message_cache.max_threads)
        return clone

    # -- public API -------------------------------------------------------------------------------------
    async def ainvoke(self, input: Input, config: Mapping[str, Any] | None = None) -> RunResult[S]:
        """Run the thread to the end (or to a pause: status ``interrupted``, ``result.interrupts``): start it,
        continue it with new input, resume an interrupted run, or answer a paused one with :class:`Resume`."""
        result: RunResult[S] | None = None
        async for event in self._run(input, RunConfig.parse(config)):
            result = event.result
        assert result is not None
        return result

    def invoke(self, input: Input, config: Mapping[str, Any] | None = None) -> RunResult[S]:
        return run_sync(self.ainvoke(input, config))

    async def astream(
        self, input: Input, config: Mapping[str, Any] | None = None, *, stream_mode: StreamMode | None = None
    ) -> AsyncGenerator[Any, None]:
        """Like ``ainvoke`` (the same run loop and ledger), yielding as the run goes. Without *stream_mode*: a
        :class:`StreamEvent` per node, then one with the result. With it (modes: :mod:`tenxgraph.core.tools.observe`):
        each mode's chunks (``(mode, chunk)`` for a list of modes); ``"messages"`` streams a model's tokens as they
        arrive and each tool result as it is recorded. A caller that stops reading stops the run between nodes."""
        if stream_mode is None:
            async for event in self._run(input, RunConfig.parse(config)):
                yield event
            return
        async for item in stream_run(self._mode_stream(input, config, stream_mode)):
            yield item

    def stream(
        self, input: Input, config: Mapping[str, Any] | None = None, *, stream_mode: StreamMode | None = None
    ) -> Iterator[Any]:
        if stream_mode is not None:  # (a generator: nothing starts before the caller's first next())
            yield from sync_stream(self._mode_stream(input, config, stream_mode))
        else:
            yield from sync_events(self.astream(input, config))

    def _mode_stream(self, input: Input, config: Mapping[str, Any] | None, stream_mode: StreamMode) -> RunStream:
        cfg = RunConfig.parse(config)
        modes, single = parse_modes(stream_mode)
        return RunStream(lambda observer: self._run(input, cfg, observer), RunObserver(cfg.thread_id, modes), single)

    async def aget_state(self, thread_id: str) -> S | None:
        """The stored state of a thread, or None."""
        if (snap := await self.checkpointer.aget_thread(thread_id)) is None:
            return None
        return self.state_schema.from_values(snap.values, await self.message_cache.load(self.checkpointer, thread_id))

    def get_state(self, thread_id: str) -> S | None:
        return run_sync(self.aget_state(thread_id))

    # -- the run loop -----------------------------------------------------------------------------------
    def _parse_input(self, input: Mapping[str, Any] | None) -> tuple[list[Message], dict[str, Any]]:
        """A run's input (strings become user messages): the one place input and node updates are split."""
        return self.split_update(input, "input", ConfigError)

    def split_update(
        self, update: Any, source: str, error: type[Exception] = GraphBuildError
    ) -> tuple[list[Message], dict[str, Any]]:
        """``{"messages": [...], field: value}`` (or None) as its messages and its values, checked; strings in the
        input become user messages."""
        if update is None:
            return [], {}
        if not isinstance(update, Mapping):
            if source == "input":
                raise error(f"input must be a dict such as {{'messages': [...]}} or None, got {type(update).__name__}")
            raise error(f"{source} returned {type(update).__name__}; return a dict of updates or None")
        values = dict(update)
        raw = values.pop("messages", [])
        raw = [raw] if isinstance(raw, Message | str) else list(raw)
        messages = [Message.user(m) if isinstance(m, str) and source == "input" else m for m in raw]
        for m in messages:
            if not isinstance(m, Message):
                kinds = "Message objects or strings" if source == "input" else "Message objects"
                raise error(f"{source} gave {m!r} in 'messages'; give {kinds}")
        self._check_fields(values, source)
        return messages, values

    def _check_fields(self, values: Mapping[str, Any], source: str) -> None:
        unknown = sorted(set(values) - self._fields)
        if unknown:
            raise GraphBuildError(
                f"{source} sets {unknown}, which {self.state_schema.__name__} does not declare; "
                f"fields: {sorted(self._fields)}"
            )

    async def _run(
        self, input: Input, cfg: RunConfig, observer: RunObserver | None = None
    ) -> AsyncIterator[StreamEvent]:
        resume = input if isinstance(input, Resume) else None
        new_messages, new_values = self._parse_input(input if not isinstance(input, Resume) else None)
        observer = observer if observer is not None else RunObserver(cfg.thread_id)
        observer.tracer = tracer_for(cfg.tracer_provider)  # None (and no spans) unless a provider is configured
        after = self.message_cache.after(self.checkpointer, cfg.thread_id)  # a turn reads only newer messages
        # A thread this graph has not read may be new: its start is staged now, and may be written with the lock.
        known = (
            after or input is None or resume is not None or self.message_cache.knows(self.checkpointer, cfg.thread_id)
        )
        new = None if known else _Run(self, cfg, self.state_schema(), 0, set(), observer)
        start = new.stage(new_messages, new_values) if new is not None else None
        with run_span(observer.tracer, cfg.thread_id) as (traced, observer.parent):
            cp, tid, keys = self.checkpointer, cfg.thread_id, decision_keys(resume)  # (a Resume's: read with the lock)
            lock = hold_run_lock(cp, tid, cfg.lock_timeout, messages_after=after, start=start, ledger_keys=keys)
            async with lock as session:  # one run per thread at a time
                snap = await cp.aget_thread(tid)
                if snap is None:
                    if input is None or resume is not None:
                        raise ConfigError(f"thread {tid!r} has no stored run to resume; pass input to start one")
                    run = new if new is not None else _Run(self, cfg, self.state_schema(), 0, set(), observer)
                    self.message_cache.remember(cp, tid)  # (the run creates it: its next turn is not staged)
                else:
                    state = self.state_schema.from_values(snap.values, await self.message_cache.load(cp, tid))
                    run = _Run(self, cfg, state, snap.version, {m.message_id for m in state.messages}, observer)
                run.session = session
                async for event in run.walk(resume, new_messages, new_values):
                    yield event
                result = run.result()
                if traced is not None:
                    traced.set_attributes(
                        {"tenxgraph.run.status": result.status, "tenxgraph.run.outcome": result.outcome}
                    )
                yield StreamEvent(END, run.state.meta.step, result=result)

    def _next(self, node: str, state: S) -> str:
        if node in self.edges:
            return self.edges[node]
        cond = self.conditional[node]
        choice = cond.path(state)
        target = cond.path_map.get(choice) if cond.path_map is not None else choice
        if target is None or (target != END and target not in self.nodes):
            raise GraphBuildError(
                f"the conditional edge after {node!r} chose {choice!r}, which is not a node or END; "
                f"nodes: {sorted(self.nodes)}"
            )
        return target


class _Run(Generic[S]):
    """One invocation's walk over the graph; holds the version it last wrote."""

    def __init__(
        self,
        graph: CompiledGraph[S],
        cfg: RunConfig,
        state: S,
        version: int,
        seen: set[str],
        observer: RunObserver,
    ) -> None:
        self.graph, self.cfg, self.state, self.version, self.seen = graph, cfg, state, version, seen
        self.observer = observer
        self.session: RunLockSession  # (given once the run lock is held)
        self.staged: list[Message] | None = None  # a new thread's start, made before the lock (see stage)
        self.steps = 0
        self.resuming = False  # the next node is the one an interrupted run left unfinished
        #: Answers to the thread's interrupts (read from the ledger), and this run's interrupt() calls.
        self.pauses = Pauses()
        self.asked: list[Interrupt] = asked_of(state.meta.interrupts)
        self.paused = False  # this run stopped at a pause (or where its caller stopped reading)

    async def walk(
        self, resume: Resume | None, messages: list[Message], values: dict[str, Any]
    ) -> AsyncIterator[StreamEvent]:
        """Finish what the thread left (a crashed run, a failed node, a pause whose answers are in), then run the
        new input. A thread that waits for a person runs nothing until every interrupt is answered."""
        cp, tid, meta = self.graph.checkpointer, self.cfg.thread_id, self.state.meta
        if self.staged is not None:  # a new thread, its start staged before the lock (and maybe written with it)
            await self._write(self.staged)
            async for event in self.loop(last=True):
                yield event
            return
        ids = [i.id for i in self.asked] + (list(resume.decisions) if resume is not None else [])
        if ids:
            self.pauses.decisions.update(await load_decisions(cp, tid, ids))
        if resume is not None:
            await record_decisions(cp, tid, resume, self.asked, self.pauses.decisions)
        if meta.status == "interrupted":
            pending = waiting(self.asked, self.pauses.decisions)
            if pending and (messages or values):
                raise ConfigError(
                    f"thread {tid!r} waits for a person's answer to interrupt(s) {[i.id for i in pending]}; answer "
                    "them with Resume({id: ...}) before sending new input (reject an approval with False)"
                )
            if pending:
                return  # still waiting: nothing runs, nothing is written
            meta.status = "running"  # every answer is in: a crash from here on is a crash mid-run (recovery's)
            await self._write([])
        elif meta.status in ("running", "error") and meta.current_node not in (None, END):
            emit_event("run_resumed", logging.INFO, thread_id=tid, node=meta.current_node, status=meta.status)
            self.resuming = True
        if meta.status in ("running", "error") and meta.current_node not in (None, END):
            own, (self.cfg, self.steps) = self.cfg, self.cfg.resuming(meta.limits, meta.step)  # the run's limits
            async for event in self.loop(last=not (messages or values)):
                yield event
            self.cfg, self.steps = own, 0
            if self.paused:
                return
        fresh = self.unseen(messages, "input")
        if fresh or values:
            await self.start(fresh, values)
            async for event in self.loop(last=True):
                yield event

    def result(self) -> RunResult[S]:
        pending = waiting(self.asked, self.pauses.decisions) if self.state.meta.status == "interrupted" else []
        cfg = self.cfg
        return RunResult(cfg.thread_id, self.state, self.version, cfg.thread_id_generated, interrupts=pending)

    def unseen(self, messages: list[Message], source: str) -> list[Message]:
        """The messages the thread does not hold yet. One it holds already is skipped (a retried request, a
        re-sent turn); a different message under an id the thread already uses is an error, never dropped."""
        fresh: dict[str, Message] = {}
        for message in messages:
            if message.message_id not in self.seen and message.message_id not in fresh:
                fresh[message.message_id] = message
                continue
            stored = fresh.get(message.message_id) or next(
                (m for m in self.state.messages if m.message_id == message.message_id), None
            )
            if stored is not None and stored.to_dict() != message.to_dict():
                raise (ConfigError if source == "input" else GraphBuildError)(
                    f"{source} has message id {message.message_id!r}, which thread {self.cfg.thread_id!r} already "
                    "uses for a different message; message ids must be unique (reuse one only to re-send the same "
                    "message)"
                )
        return list(fresh.values())

    async def _write(self, messages: list[Message]) -> None:
        """The state with *messages* added (fenced: never a write without the thread's lock)."""
        self.version = await self.session.write(
            self.state.values_dict(), expected_version=self.version, new_messages=messages
        )

    def stage(self, messages: list[Message], values: dict[str, Any]) -> tuple[dict[str, JSON], list[Message]] | None:
        """A new thread's start, made on its blank state before the run lock is taken: the values and messages of
        its first write (a backend may send it with the lock), or None when the input starts nothing."""
        fresh = self.unseen(messages, "input")
        if not (fresh or values):
            return None
        self._begin(fresh, values)
        self.staged = fresh
        return self.state.values_dict(), fresh

    async def start(self, messages: list[Message], values: dict[str, Any]) -> None:
        self._begin(messages, values)
        await self._write(messages)

    def _begin(self, messages: list[Message], values: dict[str, Any]) -> None:
        """Append new input and record the entry point as the current node: the run now exists."""
        for name, value in values.items():
            setattr(self.state, name, value)
        self.state.messages.extend(messages)
        self.seen.update(m.message_id for m in messages)
        self.state.meta.current_node = self.graph.entry_point
        self.state.meta.status = "running"
        self.state.meta.error = None
        self.state.meta.limits = {**self.cfg.limits(), "from_step": self.state.meta.step}

    async def loop(self, last: bool) -> AsyncIterator[StreamEvent]:
        """Run nodes until END. *last*: no input follows this walk, so its END write is the run's last one."""
        graph, cfg, meta = self.graph, self.cfg, self.state.meta
        while meta.current_node not in (None, END):
            node = meta.current_node
            assert node is not None
            if self.observer.stop:  # the caller stopped reading: stop between nodes (resumable, nothing abandoned)
                self.paused = True
                return
            if self.steps >= cfg.recursion_limit:  # stopped by its limit: status error, not running (no recovery)
                await self._fail(
                    node, GraphRecursionError.stopped(cfg.thread_id, self.steps, cfg.recursion_limit, node)
                )
            crash_point("run.before_node")
            try:
                update = await self._execute(node)
            except GraphInterrupt as paused:
                await self._pause(node, paused.interrupts)
                return
            messages, values = self._apply(node, update)
            nxt = graph._next(node, self.state)
            meta.step += 1
            meta.current_node = None if nxt == END else nxt
            meta.status = "done" if nxt == END else "running"
            meta.error = None
            meta.interrupts = []  # the node is done: its pauses are answered and over
            self.asked = []
            if last and nxt == END:  # the run's last write: the run lock may go in the same round trip
                self.session.next_write_is_last()
            crash_point("node.after_complete")  # (after the hint: a lock released early shows in a contest here)
            await self._write(messages)
            crash_point("run.after_advance")
            self.steps += 1
            self.observer.node_done(node, messages, values, self.state)
            yield StreamEvent(node, meta.step, messages, values)

    async def _pause(self, node: str, interrupts: list[Interrupt]) -> None:
        """Store the node's interrupts (those asked before and answered stay: their answers are read again when
        it re-runs) with status ``interrupted``; the node stays current, and the run stops here."""
        meta = self.state.meta
        for interrupt in interrupts:
            if all(i.id != interrupt.id for i in self.asked):
                self.asked.append(interrupt)
        meta.interrupts = [i.to_dict() for i in self.asked]
        meta.status = "interrupted"
        meta.error = None
        self.session.next_write_is_last()  # the run stops here: the lock may go with this write
        await self._write([])
        self.paused = True
        pending = [i.id for i in waiting(self.asked, self.pauses.decisions)]
        emit_event("run_paused", logging.INFO, thread_id=self.cfg.thread_id, node=node, interrupts=pending)
        crash_point("approval.after_pause")

    async def _execute(self, node: str) -> Any:
        graph, cfg = self.graph, self.cfg
        fn = graph.nodes[node]
        view = dataclasses.replace(self.state, messages=list(self.state.messages))
        self.pauses.step = self.observer.step = self.state.meta.step
        self.pauses.node = self.observer.node = node
        self.pauses.raised.clear()
        ctx = RunContext(cfg, graph.checkpointer, node, self.resuming, self.pauses, self.observer)
        traced: dict[str, str | bool | int] = {
            "tenxgraph.node": node,
            "tenxgraph.step": self.state.meta.step,
            "tenxgraph.node.resumed": self.resuming,
        }
        self.resuming = False
        try:
            with running_node(ctx), span(self.observer.tracer, f"node {node}", traced, self.observer.parent):
                async with asyncio.timeout(cfg.node_timeout) as limit:
                    update = await (fn(view) if graph._async_nodes[node] else to_thread_in(cfg.thread_share, fn, view))
        except GraphInterrupt:
            raise  # a pause, not a failure: the loop stores it
        except TimeoutError as exc:
            if not limit.expired():
                await self._fail(node, exc)
            assert cfg.node_timeout is not None
            await self._fail(node, NodeTimeoutError(node, cfg.node_timeout))
        except Exception as exc:
            await self._fail(node, exc)
        if self.pauses.raised:  # the node (or a tool) caught its interrupt(): the run pauses all the same
            log.warning("node %r caught the GraphInterrupt of interrupt(); let it pass (the run pauses anyway)", node)
            raise GraphInterrupt(list(self.pauses.raised))
        return update

    async def _fail(self, node: str, exc: Exception) -> NoReturn:
        """Store the error (the node stays current, so a resume retries it), then re-raise. A run that lost its
        lock stores nothing: the thread is another run's now, and it stays resumable as it is."""
        if isinstance(exc, RunLockLostError):
            raise exc
        self.state.meta.status = "error"
        self.state.meta.error = f"{type(exc).__name__} in node {node!r}: {exc}"
        try:
            await self._write([])
        except Exception as store_exc:
            log.error("thread %r: could not store the error of node %r: %s", self.cfg.thread_id, node, store_exc)
        if isinstance(exc, NodeTimeoutError):
            raise exc from None
        raise exc

    def _apply(self, node: str, update: Any) -> tuple[list[Message], dict[str, Any]]:
        raw, values = self.graph.split_update(update, f"node {node!r}")
        for name, value in values.items():
            setattr(self.state, name, value)
        fresh = self.unseen(raw, f"node {node!r}")
        self.seen.update(m.message_id for m in fresh)
        self.state.messages.extend(fresh)
        return fresh, values
