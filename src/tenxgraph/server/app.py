"""The Starlette application behind ``tenxgraph serve``."""

from __future__ import annotations

import hmac
import json
import logging
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from typing import Any

from tenxgraph.utils.constants import install_hint

try:
    from starlette.applications import Starlette
    from starlette.requests import Request
    from starlette.responses import JSONResponse, PlainTextResponse, Response, StreamingResponse
    from starlette.routing import Route
except ImportError as exc:  # pragma: no cover - exercised without the extra installed
    raise ImportError(f"the API server needs the server extra: {install_hint('server')} ({exc})") from exc

from tenxgraph.core.graph.compiled import CompiledGraph
from tenxgraph.core.graph.config import KNOWN_KEYS
from tenxgraph.core.state.messages import Message, TextBlock, new_id
from tenxgraph.errors import ConfigError, GraphBuildError, SerializationError, ThreadBusyError
from tenxgraph.server.metrics import Metrics
from tenxgraph.server.recovery import Recovery
from tenxgraph.utils.constants import LOGGER_NAME
from tenxgraph.utils.events import emit_event

log = logging.getLogger(f"{LOGGER_NAME}.server")
RUN_FIELDS = ("messages", "config")
MESSAGE_FIELDS = ("role", "text", "message_id")
Handler = Callable[[Request], Awaitable[Response]]


class BadRequest(Exception):
    """A request body the server cannot use: answered with 422 and this message."""


def _sse(event: str, data: dict[str, Any]) -> str:
    """One server-sent event: its name and a JSON object on one ``data:`` line."""
    return f"event: {event}\ndata: {json.dumps(data, default=str)}\n\n"


def error(status: int, message: str, **extra: Any) -> JSONResponse:
    return JSONResponse({"error": message, **extra}, status_code=status)


def _message(data: Any, index: int) -> Message:
    if not isinstance(data, dict):
        raise BadRequest(f"messages[{index}] must be an object with role and text")
    unknown = sorted(set(data) - set(MESSAGE_FIELDS))
    if unknown:
        raise BadRequest(f"messages[{index}] has unknown fields {unknown}; allowed: {list(MESSAGE_FIELDS)}")
    role, text = data.get("role", "user"), data.get("text")
    if role not in ("user", "system"):
        raise BadRequest(f"messages[{index}].role must be 'user' or 'system', got {role!r}")
    if not isinstance(text, str):
        raise BadRequest(f"messages[{index}].text must be a string")
    message_id = data.get("message_id") or new_id()
    if not isinstance(message_id, str):
        raise BadRequest(f"messages[{index}].message_id must be a string")
    return Message(role=role, content=(TextBlock(text),), message_id=message_id)


async def _run_body(request: Request) -> tuple[dict[str, Any] | None, dict[str, Any]]:
    raw = await request.body()
    try:
        body = json.loads(raw) if raw.strip() else {}
    except json.JSONDecodeError as exc:
        raise BadRequest(f"the body is not valid JSON: {exc}") from None
    if not isinstance(body, dict):
        raise BadRequest("the body must be a JSON object with optional fields messages and config")
    unknown = sorted(set(body) - set(RUN_FIELDS))
    if unknown:
        raise BadRequest(f"unknown fields {unknown}; allowed: {list(RUN_FIELDS)}")
    messages = body.get("messages") or []
    if not isinstance(messages, list):
        raise BadRequest("messages must be a list")
    config = body.get("config") or {}
    if not isinstance(config, dict) or "thread_id" in config:
        raise BadRequest(f"config must be an object with keys from {[k for k in KNOWN_KEYS if k != 'thread_id']}")
    parsed = [_message(m, i) for i, m in enumerate(messages)]
    return ({"messages": parsed} if parsed else None), config


def _state_json(thread_id: str, values: dict[str, Any], messages: list[Message], version: int) -> dict[str, Any]:
    return {
        "thread_id": thread_id,
        "version": version,
        "status": (values.get("meta") or {}).get("status"),
        "values": values,
        "messages": [m.to_dict() for m in messages],
    }


def create_app(
    graph: CompiledGraph[Any],
    *,
    token: str | None = None,
    lock_timeout: float = 5.0,
    recovery: Recovery | bool | None = True,
) -> Starlette:
    """An ASGI app serving *graph*; with *token*, every endpoint but ``/healthz`` needs ``Bearer <token>``.

    A run waits up to *lock_timeout* seconds for the thread's run lock (a request's ``config.lock_timeout`` wins):
    a client retrying right after a crashed server must not get 409 while the database frees the dead lock.
    *recovery*: finish interrupted threads on start-up and every 30 s (``True``), as configured (a
    :class:`~tenxgraph.server.recovery.Recovery`), or not at all (``False``/None)."""
    recover = Recovery(graph) if recovery is True else (recovery or None)
    metrics = Metrics()

    def guarded(handler: Handler, auth: bool = True) -> Handler:
        async def check(request: Request) -> Response:
            started = time.perf_counter()
            response = await authorized(request) if auth else await handler(request)
            emit_event(
                "request",
                logging.INFO,
                method=request.method,
                path=request.url.path,
                status=response.status_code,
                ms=round((time.perf_counter() - started) * 1000, 2),
                thread_id=request.path_params.get("thread_id"),
            )
            return response

        async def authorized(request: Request) -> Response:
            if token is not None:
                given = request.headers.get("authorization", "")
                if not hmac.compare_digest(given.encode(), f"Bearer {token}".encode()):
                    return error(401, "missing or wrong bearer token (Authorization: Bearer <token>)")
            return await handler(request)

        return check

    def failed(exc: Exception, thread_id: str) -> dict[str, Any]:
        """How a run that raised is answered (``POST /runs`` and its stream alike), counted in the metrics. Call
        it from the ``except`` block (it logs the traceback of an unexpected failure)."""
        if isinstance(exc, ThreadBusyError):  # another run holds the thread
            metrics.run("busy", 0.0)
            return {"status": 409, "error": str(exc), "thread_id": thread_id}
        if isinstance(exc, ConfigError | GraphBuildError | SerializationError | ValueError):
            return {"status": 422, "error": str(exc), "thread_id": thread_id}
        metrics.run("failed", 0.0)
        log.exception("run of thread %r failed", thread_id)
        return {"status": 500, "error": f"{type(exc).__name__}: {exc}", "thread_id": thread_id, "resumable": True}

    def finished(result: Any, thread_id: str, started: float) -> dict[str, Any]:
        metrics.run("finished", time.perf_counter() - started)
        body = _state_json(thread_id, result.state.values_dict(), result.messages, result.version)
        return {**body, "final_text": result.final_text}

    async def run(request: Request) -> JSONResponse:
        thread_id = request.path_params["thread_id"]
        started = time.perf_counter()
        try:
            input, config = await _run_body(request)
            result = await graph.ainvoke(input, {"lock_timeout": lock_timeout, **config, "thread_id": thread_id})
        except BadRequest as exc:
            return error(422, str(exc))
        except Exception as exc:
            answer = failed(exc, thread_id)
            response = error(answer.pop("status"), answer.pop("error"), **answer)
            if response.status_code == 409:
                response.headers["Retry-After"] = str(max(1, round(lock_timeout)))
            return response
        emit_event("run", logging.INFO, thread_id=thread_id, status=result.status, version=result.version)
        return JSONResponse(finished(result, thread_id, started))

    async def run_stream(request: Request) -> Response:
        """The run as server-sent events: ``step`` per finished node (its new messages; ``replayed`` when a tool
        result came from the ledger), then ``done`` (the state, as ``POST /runs`` answers) or ``error`` (status
        409/422/500 as ``POST /runs`` would; the thread stays resumable). ``GET`` resumes with no input."""
        thread_id = request.path_params["thread_id"]
        try:
            input, config = await _run_body(request) if request.method == "POST" else (None, {})
        except BadRequest as exc:
            return error(422, str(exc))
        cfg = {"lock_timeout": lock_timeout, **config, "thread_id": thread_id}

        async def events() -> AsyncIterator[str]:
            started = time.perf_counter()
            try:
                async for event in graph.astream(input, cfg):
                    if event.result is not None:
                        yield _sse("done", finished(event.result, thread_id, started))
                        continue
                    messages = [m.to_dict() for m in event.messages]
                    step = {"node": event.node, "step": event.step, "messages": messages}
                    yield _sse("step", {**step, "replayed": event.replayed})
            except Exception as exc:
                yield _sse("error", failed(exc, thread_id))

        return StreamingResponse(events(), media_type="text/event-stream")

    async def state(request: Request) -> JSONResponse:
        thread_id = request.path_params["thread_id"]
        snap = await graph.checkpointer.aget_thread(thread_id)
        if snap is None:
            return error(404, f"thread {thread_id!r} does not exist")
        messages = await graph.checkpointer.alist_messages(thread_id)
        return JSONResponse(_state_json(thread_id, snap.values, messages, snap.version))

    async def healthz(request: Request) -> JSONResponse:
        return JSONResponse({"status": "ok"})

    async def prometheus(request: Request) -> Response:
        return PlainTextResponse(metrics.render(), media_type="text/plain; version=0.0.4")

    @asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[None]:
        emit_event(
            "server_start",
            logging.INFO,
            checkpointer=repr(graph.checkpointer),
            auth=token is not None,
            lock_timeout=lock_timeout,
            recovery=recover is not None,
        )
        metrics.start()
        if recover is not None:
            recover.start()
        try:
            yield
        finally:
            if recover is not None:
                await recover.stop()
            metrics.stop()
            emit_event("server_stop", logging.INFO)

    return Starlette(
        routes=[
            Route("/threads/{thread_id}/runs", guarded(run), methods=["POST"]),
            Route("/threads/{thread_id}/runs/stream", guarded(run_stream), methods=["GET", "POST"]),
            Route("/threads/{thread_id}/state", guarded(state), methods=["GET"]),
            Route("/healthz", guarded(healthz, auth=False), methods=["GET"]),
            Route("/metrics", guarded(prometheus), methods=["GET"]),
        ],
        lifespan=lifespan,
    )
