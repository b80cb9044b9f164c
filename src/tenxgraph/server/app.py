"""The Starlette application behind ``tenxgraph serve``."""

from __future__ import annotations

import asyncio
import json
import logging
import math
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from concurrent.futures import ThreadPoolExecutor
from contextlib import asynccontextmanager
from typing import Any, Unpack

from tenxgraph.utils.constants import install_hint

try:
    from starlette.applications import Starlette
    from starlette.requests import Request
    from starlette.responses import JSONResponse, PlainTextResponse, Response, StreamingResponse
    from starlette.routing import Route
except ImportError as exc:  # pragma: no cover - exercised without the extra installed
    raise ImportError(f"the API server needs the server extra: {install_hint('server')} ({exc})") from exc

from tenxgraph.core.graph.compiled import CompiledGraph
from tenxgraph.core.graph.pauses import asked_of, load_decisions, waiting
from tenxgraph.core.tools.interrupts import Interrupt
from tenxgraph.server.doors import DoorArgs, Doors, Refused, stored_id
from tenxgraph.server.failures import GENERIC, error_id_of, public_values
from tenxgraph.server.limits import BadRequest, Limits, message_page, page_of, parse_run, read_body
from tenxgraph.server.metrics import Metrics
from tenxgraph.server.recovery import Recovery
from tenxgraph.state.messages import Message, id_problem, new_id
from tenxgraph.utils.constants import LOGGER_NAME, THREAD_ID_MAX_BYTES
from tenxgraph.utils.errors import (
    ConfigError,
    GraphBuildError,
    InterruptDecidedError,
    SerializationError,
    ThreadBusyError,
)
from tenxgraph.utils.events import emit_event
from tenxgraph.utils.thread_share import ThreadShare

log = logging.getLogger(f"{LOGGER_NAME}.server")
#: The server's executor threads (sync tools and nodes), and how many of them one owner's calls may hold at once.
TOOL_THREADS = 32
THREADS_PER_OWNER = 8
Handler = Callable[[Request, str | None], Awaitable[Response]]


def _piece(piece: Any, metadata: dict[str, Any]) -> tuple[str, dict[str, Any]]:
    """A ``"messages"`` stream item as a server-sent event: a model's token, or a whole message."""
    where = {"node": metadata["node"], "step": metadata["step"]}
    if isinstance(piece, Message):
        kind = "tool_result" if piece.role == "tool" else "message"
        return kind, {**where, "message": piece.to_dict(), "replayed": bool(metadata.get("replayed"))}
    call = piece.tool_call
    token: dict[str, Any] = {"message_id": piece.message_id, "text": piece.text, "reasoning": piece.reasoning}
    if call is not None:
        token["tool_call"] = {"index": call.index, "id": call.id, "name": call.name, "args": call.args}
    return "token", {**where, **token}


def _sse(event: str, data: dict[str, Any]) -> str:
    """One server-sent event: its name and a JSON object on one ``data:`` line."""
    return f"event: {event}\ndata: {json.dumps(data, default=str)}\n\n"


def error(status: int, message: str, headers: dict[str, str] | None = None, **extra: Any) -> JSONResponse:
    return JSONResponse({"error": message, **extra}, status_code=status, headers=headers)


def _state_json(
    thread_id: str, values: dict[str, Any], messages: list[Message], version: int, interrupts: list[Interrupt]
) -> dict[str, Any]:
    """A thread as the API shows it; ``interrupts``: what a paused thread (status ``interrupted``) waits for."""
    return {
        "thread_id": thread_id,
        "version": version,
        "status": (values.get("meta") or {}).get("status"),
        "interrupts": [i.to_dict() for i in interrupts],
        "values": values,
        "messages": [m.to_dict() for m in messages],
    }


def create_app(
    graph: CompiledGraph[Any],
    *,
    limits: Limits | None = None,
    lock_timeout: float = 5.0,
    recovery: Recovery | bool | None = True,
    **door_args: Unpack[DoorArgs],
) -> Starlette:
    """An ASGI app serving *graph* (see docs/server.md, "Security").

    Authentication, one of: *token* (one shared bearer token), *tokens* (token -> owner: each owner sees only its
    own threads) or *authenticate* (``request -> owner``, sync or async; None refuses). Without any, every
    endpoint is open: right for a loopback address, refused by ``tenxgraph serve`` on any other.
    *allowed_hosts*: ``Host`` names answered (default: loopback names; ``"*"`` any, ``"*.example.com"``);
    *allowed_origins*: browser origins let in (default none: a cross-site request is 403). Client ``system``
    messages are 403 unless *allow_system_messages*. *limits*: the body cap and the ceilings a request may lower
    but not raise (:class:`~tenxgraph.server.limits.Limits`).

    A run waits up to *lock_timeout* seconds for the thread's run lock (a request's ``config.lock_timeout`` may
    ask for less): a client retrying right after a crashed server must not get 409 while the database frees the
    dead lock. *recovery*: finish interrupted threads on start-up and every 30 s (``True``), as configured (a
    :class:`~tenxgraph.server.recovery.Recovery`), or not at all (``False``/None)."""
    unknown = sorted(set(door_args) - set(DoorArgs.__annotations__))
    if unknown:
        raise TypeError(f"create_app() got an unexpected keyword argument {unknown[0]!r}")
    recover = Recovery(graph) if recovery is True else (recovery or None)
    per_owner = door_args.get("threads_per_owner", THREADS_PER_OWNER)
    if isinstance(per_owner, bool) or not isinstance(per_owner, int) or not 1 <= per_owner <= TOOL_THREADS:
        raise ConfigError(f"create_app(threads_per_owner={per_owner!r}): a whole number from 1 to {TOOL_THREADS}")
    shares: dict[str, ThreadShare] = {}  # owner -> its share of the executor's threads
    metrics = Metrics()
    limits = limits or Limits()
    allow_system_messages = bool(door_args.get("allow_system_messages", False))
    allowed_hosts = door_args.get("allowed_hosts")
    doors = Doors(
        allowed_hosts=tuple(allowed_hosts) if allowed_hosts is not None else Doors.allowed_hosts,
        allowed_origins=tuple(door_args.get("allowed_origins", ())),
        token=door_args.get("token"),
        tokens=door_args.get("tokens"),
        authenticate=door_args.get("authenticate"),
        metrics_token=door_args.get("metrics_token"),
    )

    def guarded(
        handler: Handler, auth: bool = True, operator: bool = False
    ) -> Callable[[Request], Awaitable[Response]]:
        async def check(request: Request) -> Response:
            started = time.perf_counter()
            thread_id = request.path_params.get("thread_id")
            try:
                owner = None if operator else await doors.enter(request, auth=auth)
                if operator:  # the operator's endpoint (/metrics): its own door
                    await doors.enter_metrics(request)
                if thread_id is not None and (problem := id_problem(thread_id, THREAD_ID_MAX_BYTES)) is not None:
                    raise BadRequest(f"the thread id {problem}")
                if thread_id is not None and id_problem(stored_id(owner, thread_id), THREAD_ID_MAX_BYTES):
                    room = THREAD_ID_MAX_BYTES - len(stored_id(owner, "").encode())
                    raise BadRequest(f"the thread id must be at most {room} bytes on this server (its owner prefix)")
                response = await handler(request, owner)
            except Refused as exc:  # (a BadRequest too)
                response = error(exc.status, str(exc), exc.headers)
            emit_event(
                "request",
                logging.INFO,
                method=request.method,
                path=request.url.path,
                status=response.status_code,
                ms=round((time.perf_counter() - started) * 1000, 2),
                thread_id=thread_id,
            )
            return response

        return check

    async def failed(exc: Exception, thread_id: str, stored: str) -> dict[str, Any]:
        """How a run that raised is answered (``POST /runs`` and its stream alike), counted in the metrics. Call
        it from the ``except`` block: an unexpected failure is logged with its traceback under an error id, and
        the client gets the id, not the exception (it may hold a provider's reply, a host or a role name)."""
        if isinstance(exc, ThreadBusyError):  # another run holds the thread (who, and on which host, stays here)
            metrics.run("busy", 0.0)
            text = str(ThreadBusyError(exc.thread_id, exc.waited))
            return {"status": 409, "error": text, "thread_id": thread_id, "retry_after": exc.retry_after}
        if isinstance(exc, InterruptDecidedError):  # one decision per interrupt: a different one conflicts
            return {"status": 409, "error": str(exc), "thread_id": thread_id, "decided": exc.recorded}
        if isinstance(exc, ConfigError | GraphBuildError | SerializationError):  # (a node's ValueError is a 500)
            return {"status": 422, "error": str(exc), "thread_id": thread_id}
        metrics.run("failed", 0.0)
        error_id = await stored_error_id(stored)
        log.exception("run of thread %r failed (error_id %s)", thread_id, error_id)
        message = GENERIC.format(error_id)
        return {"status": 500, "error": message, "error_id": error_id, "thread_id": thread_id, "resumable": True}

    async def stored_error_id(stored: str) -> str:
        """The id of the failure the thread stored (``GET /state`` shows the same), or a new one."""
        try:
            snap = await graph.checkpointer.aget_thread(stored)
        except Exception:  # (the storage may be why the run failed: the failure is still answered)
            log.warning("could not read thread %r to name its failure", stored, exc_info=True)
            return new_id("err")
        cause = ((snap.values.get("meta") or {}).get("error") if snap is not None else None) or None
        return error_id_of(stored, str(cause)) if cause else new_id("err")

    def finished(result: Any, thread_id: str, stored: str, started: float) -> dict[str, Any]:
        metrics.run("finished", time.perf_counter() - started)
        values = public_values(stored, result.state.values_dict())
        body = _state_json(thread_id, values, result.messages, result.version, result.interrupts)
        in_doubt = [call.to_dict() for call in result.in_doubt]  # (a finished run whose effect is not known)
        return {**body, "final_text": result.final_text, "outcome": result.outcome, "in_doubt": in_doubt}

    async def run_request(request: Request, owner: str | None) -> tuple[Any, dict[str, Any]]:
        input, asked = parse_run(await read_body(request, limits), allow_system_messages)
        config = limits.run_config(asked, lock_timeout)
        if owner is not None:  # its sync tools hold at most its share of the threads
            config["thread_share"] = shares.setdefault(owner, ThreadShare(owner, per_owner))
        return input, {**config, "thread_id": stored_id(owner, request.path_params["thread_id"])}

    async def run(request: Request, owner: str | None) -> JSONResponse:
        thread_id = request.path_params["thread_id"]
        started = time.perf_counter()
        input, cfg = await run_request(request, owner)
        try:
            result = await graph.ainvoke(input, cfg)
        except Exception as exc:
            answer = await failed(exc, thread_id, cfg["thread_id"])
            busy = "retry_after" in answer  # (a 409 for a decision already taken is no reason to retry)
            lease_left = answer.pop("retry_after", None) or 0.0  # (a lease whose holder's connection dropped)
            response = error(answer.pop("status"), answer.pop("error"), **answer)
            if busy:
                response.headers["Retry-After"] = str(max(1, round(cfg["lock_timeout"] or 1), math.ceil(lease_left)))
            return response
        emit_event("run", logging.INFO, thread_id=cfg["thread_id"], status=result.status, version=result.version)
        return JSONResponse(finished(result, thread_id, cfg["thread_id"], started))

    async def run_stream(request: Request, owner: str | None) -> Response:
        """The run as server-sent events: ``token`` for each piece of a model's reply as it arrives (``message_id``,
        ``text``, ``reasoning``, ``tool_call``), ``tool_result`` as each call's result is recorded or replayed
        (``replayed``), ``step`` per finished node (its new messages; ``replayed`` when a tool result came from the
        ledger), then ``done`` (the state, as ``POST /runs`` answers) or ``error`` (status 409/422/500 as ``POST
        /runs`` would; the thread stays resumable)."""
        thread_id = request.path_params["thread_id"]
        input, cfg = await run_request(request, owner)

        async def events() -> AsyncIterator[str]:
            started = time.perf_counter()
            try:
                async for mode, item in graph.astream(input, cfg, stream_mode=["messages", "steps", "result"]):
                    if mode == "result":
                        yield _sse("done", finished(item, thread_id, cfg["thread_id"], started))
                    elif mode == "steps":
                        messages = [m.to_dict() for m in item.messages]
                        step = {"node": item.node, "step": item.step, "messages": messages}
                        yield _sse("step", {**step, "replayed": item.replayed})
                    else:
                        yield _sse(*_piece(*item))
            except Exception as exc:
                answer = await failed(exc, thread_id, cfg["thread_id"])
                answer.pop("retry_after", None)  # (a header's business; a stream has none to give)
                yield _sse("error", answer)

        return StreamingResponse(events(), media_type="text/event-stream")

    async def state(request: Request, owner: str | None) -> JSONResponse:
        thread_id = request.path_params["thread_id"]
        stored = stored_id(owner, thread_id)
        snap = await graph.checkpointer.aget_thread(stored)
        if snap is None:
            return error(404, f"thread {thread_id!r} does not exist")
        messages = await graph.checkpointer.alist_messages(stored)
        meta = snap.values.get("meta") or {}
        pending: list[Interrupt] = []
        if meta.get("status") == "interrupted":  # what it waits for: its interrupts not decided yet
            asked = asked_of(meta.get("interrupts") or [])
            pending = waiting(asked, await load_decisions(graph.checkpointer, stored, [i.id for i in asked]))
        first, limit = page_of(request.query_params)
        body = _state_json(thread_id, public_values(stored, snap.values), messages, snap.version, pending)
        taken, following = message_page(body["messages"], first, limit, limits.max_state_page_bytes)
        body["messages"] = body["messages"][first : first + taken]
        body.update(messages_from=first, messages_total=len(messages), messages_next=following)
        return JSONResponse(body)

    async def healthz(request: Request, owner: str | None) -> JSONResponse:
        return JSONResponse({"status": "ok"})

    async def prometheus(request: Request, owner: str | None) -> Response:
        try:  # (the same figure from every worker: it is read from the storage)
            waiting_threads: int | None = await graph.checkpointer.acount_threads("interrupted")
        except NotImplementedError:
            waiting_threads = None
        return PlainTextResponse(metrics.render(waiting_threads), media_type="text/plain; version=0.0.4")

    @asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[None]:
        emit_event(
            "server_start",
            logging.INFO,
            checkpointer=repr(graph.checkpointer),
            auth=doors.auth,
            allowed_hosts=list(doors.allowed_hosts),
            lock_timeout=lock_timeout,
            recovery=recover is not None,
        )
        metrics.start()
        executor = ThreadPoolExecutor(TOOL_THREADS, "tenxgraph-tool")
        asyncio.get_running_loop().set_default_executor(executor)
        if recover is not None:
            recover.start()
        try:
            yield
        finally:
            if recover is not None:
                await recover.stop()
            metrics.stop()
            executor.shutdown(wait=False)  # (a sync tool that never returns keeps its thread: nothing waits for it)
            emit_event("server_stop", logging.INFO)

    return Starlette(
        routes=[
            Route("/threads/{thread_id}/runs", guarded(run), methods=["POST"]),
            Route("/threads/{thread_id}/runs/stream", guarded(run_stream), methods=["POST"]),
            Route("/threads/{thread_id}/state", guarded(state), methods=["GET"]),
            Route("/healthz", guarded(healthz, auth=False), methods=["GET"]),
            Route("/metrics", guarded(prometheus, operator=True), methods=["GET"]),
        ],
        lifespan=lifespan,
    )
