"""OpenTelemetry spans for a run, its nodes, model calls and tool calls (the ``otel`` extra: the API only).

Off, it costs one check per run: with no tracer provider configured (the OpenTelemetry API's default) or the API
not installed, :func:`tracer_for` gives None and no span is made. On (``trace.set_tracer_provider(...)`` with the
SDK, or ``config={"tracer_provider": provider}`` for one run), the spans follow the OpenTelemetry GenAI semantic
conventions where they have a name for a thing, and add ours:

========================  =====================================================================================
span                      attributes
========================  =====================================================================================
``invoke_agent``          ``gen_ai.operation.name=invoke_agent``, ``gen_ai.conversation.id`` and
                          ``tenxgraph.thread_id`` (the thread), ``tenxgraph.run.status`` and ``.outcome`` at the end
``node {name}``           ``tenxgraph.node``, ``tenxgraph.step``, ``tenxgraph.node.resumed`` (a crashed run's node
                          run again), ``tenxgraph.node.paused`` (it stopped for a person)
``chat {model}``          ``gen_ai.operation.name=chat``, ``gen_ai.provider.name``, ``gen_ai.request.model``,
                          ``gen_ai.response.model``, ``gen_ai.usage.input_tokens`` / ``output_tokens``,
                          ``gen_ai.response.finish_reasons``
``execute_tool {tool}``   ``gen_ai.operation.name=execute_tool``, ``gen_ai.tool.name``, ``gen_ai.tool.call.id``,
                          ``gen_ai.tool.type=function``, ``tenxgraph.tool.replayed`` (the result came from the
                          ledger: the body did not run), ``tenxgraph.tool.effect``, ``tenxgraph.ledger.key``,
                          ``tenxgraph.tool.recorded``, ``error.type`` for an error result
========================  =====================================================================================

Span events: ``tenxgraph.tool.in_doubt`` (a resume found the call's intent without a result),
``tenxgraph.ledger.write_failed`` (the call completed but its record was not written: it may run again).
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Mapping
from typing import Any

from tenxgraph.core.tools.interrupts import GraphInterrupt
from tenxgraph.utils.constants import install_hint
from tenxgraph.utils.errors import ConfigError

TRACER_NAME = "tenxgraph"
Attributes = Mapping[str, str | bool | int | float | list[str]]


def _api() -> Any | None:
    """The OpenTelemetry trace API, or None if it is not installed (looked up once per process)."""
    global _trace_api
    if _trace_api is _UNKNOWN:
        try:
            from opentelemetry import trace
        except ImportError:
            trace = None  # type: ignore[assignment]
        _trace_api = trace
    return _trace_api


_UNKNOWN = object()
_trace_api: Any = _UNKNOWN


def tracer_for(provider: object | None) -> Any | None:
    """The tracer of *provider* (a run's ``tracer_provider``) or of the global one; None when tracing is off."""
    trace = _api()
    if trace is None:
        if provider is None:
            return None  # no API, no tracing: nothing asked for it
        raise ConfigError(f"config['tracer_provider'] needs OpenTelemetry: {install_hint('otel')}")
    if provider is None:
        provider = trace.get_tracer_provider()
        if isinstance(provider, trace.ProxyTracerProvider | trace.NoOpTracerProvider):
            return None  # nobody configured a provider: spans would go nowhere
    get_tracer = getattr(provider, "get_tracer", None)
    if get_tracer is None:
        raise ConfigError(f"config['tracer_provider'] must be an OpenTelemetry TracerProvider, got {provider!r}")
    return get_tracer(TRACER_NAME)


#: What :func:`span` gives when tracing is off: no generator, no span (the off path costs a branch).
NO_SPAN: contextlib.nullcontext[None] = contextlib.nullcontext()


def span(
    tracer: Any | None, name: str, attributes: Attributes, parent: Any = None
) -> contextlib.AbstractContextManager[Any | None]:
    """A span named *name* around the block (the current one inside it; its parent: the current span, or the
    context *parent*), or nothing when *tracer* is None. An exception ends it with an error status; a pause for a
    person (:class:`GraphInterrupt`) is not an error."""
    return NO_SPAN if tracer is None else _span(tracer, name, attributes, parent)


@contextlib.contextmanager
def _span(tracer: Any, name: str, attributes: Attributes, parent: Any) -> Iterator[Any]:
    with tracer.start_as_current_span(
        name, context=parent, attributes=dict(attributes), record_exception=False, set_status_on_exception=False
    ) as current:
        try:
            yield current
        except GraphInterrupt:
            current.set_attribute("tenxgraph.node.paused", True)
            raise
        except BaseException as exc:
            failed(current, exc)
            raise


def failed(current: Any, exc: BaseException) -> None:
    """Mark *current* (a span) as ended by *exc*."""
    from opentelemetry.trace import Status, StatusCode

    current.record_exception(exc)
    current.set_status(Status(StatusCode.ERROR, f"{type(exc).__name__}: {exc}"))
    current.set_attribute("error.type", type(exc).__name__)


NO_RUN_SPAN: contextlib.nullcontext[tuple[None, None]] = contextlib.nullcontext((None, None))


def run_span(tracer: Any | None, thread_id: str) -> contextlib.AbstractContextManager[tuple[Any | None, Any]]:
    """The run's span around the block, and the context its nodes' spans take as parent. It is not made current:
    a run is an async generator, and a current span would not survive its yields."""
    return NO_RUN_SPAN if tracer is None else _run_span(tracer, thread_id)


@contextlib.contextmanager
def _run_span(tracer: Any, thread_id: str) -> Iterator[tuple[Any, Any]]:
    from opentelemetry import trace

    attributes = {"gen_ai.operation.name": "invoke_agent", "gen_ai.conversation.id": thread_id}
    run = tracer.start_span("invoke_agent", attributes={**attributes, "tenxgraph.thread_id": thread_id})
    try:
        yield run, trace.set_span_in_context(run)
    except GeneratorExit:
        raise  # the caller stopped reading the stream: not a failure of the run
    except BaseException as exc:
        failed(run, exc)
        raise
    finally:
        run.end()


def add_event(name: str, attributes: Attributes) -> None:
    """An event on the current span, if a span of ours is recording (nothing when tracing is off)."""
    trace = _api()
    if trace is None:
        return
    current = trace.get_current_span()
    if current.is_recording():
        current.add_event(name, dict(attributes))
