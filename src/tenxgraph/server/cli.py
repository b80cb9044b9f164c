"""The ``tenxgraph`` command: ``tenxgraph serve module:app --host 127.0.0.1 --port 8000``."""

from __future__ import annotations

import argparse
import importlib
import json
import logging
import os
import sys
from typing import Any

from tenxgraph.core.graph.compiled import CompiledGraph
from tenxgraph.server.serve_options import (
    add_door_options,
    check_doors,
    door_kwargs,
    header_timeout_protocol,
    proxy_settings,
)
from tenxgraph.utils.constants import DISTRIBUTION, install_hint
from tenxgraph.utils.events import emit_event, log_json_lines


def load_graph(target: str) -> CompiledGraph[Any]:
    """``module:attr`` naming a CompiledGraph, or a function returning one."""
    module_name, _, attr = target.partition(":")
    if not module_name or not attr:
        raise SystemExit(f"tenxgraph serve: give the graph as module:attribute, got {target!r}")
    sys.path.append(os.getcwd())  # last: the working directory never shadows an installed module
    try:
        obj = getattr(importlib.import_module(module_name), attr)
    except (ImportError, AttributeError) as exc:
        raise SystemExit(f"tenxgraph serve: cannot load {target!r}: {exc}") from exc
    graph = obj() if callable(obj) and not isinstance(obj, CompiledGraph) else obj
    if not isinstance(graph, CompiledGraph):
        raise SystemExit(f"tenxgraph serve: {target!r} is {type(graph).__name__}, not a compiled graph")
    return graph


def main(argv: list[str] | None = None) -> None:
    from importlib.metadata import version

    parser = argparse.ArgumentParser(prog="tenxgraph")
    parser.add_argument("--version", action="version", version=f"tenxgraph {version(DISTRIBUTION)}")
    commands = parser.add_subparsers(dest="command", required=True)
    serve = commands.add_parser("serve", help="serve a compiled graph over HTTP")
    serve.add_argument("target", help="module:attribute of a CompiledGraph (or of a function returning one)")
    serve.add_argument(
        "--host", default="127.0.0.1", help="address to listen on (default 127.0.0.1: this machine only)"
    )
    serve.add_argument("--port", type=int, default=8000, help="port to listen on (default 8000)")
    serve.add_argument(
        "--lock-timeout",
        type=float,
        default=5.0,
        help="seconds a run waits for a thread held by another run before answering 409 (default 5)",
    )
    serve.add_argument(
        "--log-level",
        default="info",
        choices=["debug", "info", "warning", "error"],
        help="level of the JSON log lines on stderr: start-up, every request, resumed runs, replayed calls "
        "(default info)",
    )
    serve.add_argument(
        "--recovery-interval",
        type=float,
        default=30.0,
        help="seconds between sweeps that finish interrupted threads (one runs at start-up; default 30)",
    )
    serve.add_argument(
        "--recovery-attempts",
        type=int,
        default=3,
        help="recoveries of one thread before it is parked (a log line; a request can still resume it; default 3)",
    )
    serve.add_argument("--no-recovery", action="store_true", help="do not finish interrupted threads by itself")
    serve.add_argument(
        "--shutdown-timeout",
        type=int,
        default=30,
        help="on SIGTERM: stop taking requests, and give running ones this many seconds to finish; runs still "
        "going then are cut, and stay resumable (another server's recovery finishes them; default 30)",
    )
    serve.add_argument(
        "--workers",
        type=int,
        default=1,
        help="server processes on this port (uvicorn's workers; each loads the graph itself; default 1)",
    )
    add_door_options(serve)
    args = parser.parse_args(argv)
    try:
        import uvicorn
    except ImportError as exc:
        raise SystemExit(f"tenxgraph serve needs the server extra: {install_hint('server')} ({exc})") from exc
    if args.workers < 1:
        raise SystemExit(f"tenxgraph serve: --workers must be 1 or more, got {args.workers}")
    check_doors(args)  # before anything listens: an open door is a start-up error, not a log line
    settings = {k: v for k, v in vars(args).items() if k not in ("command", "port", "workers")}
    os.environ[SERVE_ENV] = json.dumps(settings)  # each worker process builds its app from the same settings
    log_json_lines(args.log_level.upper())
    app: Any = "tenxgraph.server.cli:app_from_env" if args.workers > 1 else app_from_env()
    emit_event("server_listen", logging.INFO, host=args.host, port=args.port, target=args.target, workers=args.workers)
    uvicorn.run(
        app,
        host=args.host,
        port=args.port,
        log_level="warning",
        timeout_graceful_shutdown=args.shutdown_timeout,
        limit_concurrency=args.limit_concurrency,
        http=header_timeout_protocol(args.header_timeout, args.write_timeout),
        **proxy_settings(args.forwarded_allow_ips),
        workers=args.workers if args.workers > 1 else None,
        factory=args.workers > 1,
    )


#: The environment variable ``serve`` passes its settings to worker processes in.
SERVE_ENV = "TENXGRAPH_SERVE"


def app_from_env() -> Any:
    """The ASGI app ``tenxgraph serve`` runs, built from its settings (in each worker process with ``--workers``)."""
    from tenxgraph.server import create_app
    from tenxgraph.server.recovery import Recovery

    settings = json.loads(os.environ[SERVE_ENV])
    if logging.getLogger("tenxgraph").level == logging.NOTSET:  # a worker process: log as its parent does
        log_json_lines(str(settings["log_level"]).upper())
    graph = load_graph(settings["target"])
    try:
        recovery = None if settings["no_recovery"] else Recovery(
            graph, interval=settings["recovery_interval"], max_attempts=settings["recovery_attempts"])  # fmt: skip
    except ValueError as exc:
        raise SystemExit(f"tenxgraph serve: {exc}") from None
    return create_app(graph, lock_timeout=settings["lock_timeout"], recovery=recovery or False, **door_kwargs(settings))


if __name__ == "__main__":
    main()
