"""``tenxgraph serve``'s door options: authentication, allowed hosts and origins, limits, the header timeout, and
the start-up checks that refuse an open door (no token on a non-loopback address, a token variable asked for but
empty, a crash point armed outside a test). Imports nothing of the server extra until it serves."""

from __future__ import annotations

import argparse
import ipaddress
import os
from functools import partial
from typing import Any

from tenxgraph.core.crashpoints import ENV_CRASH_AT, ENV_CRASH_TEST, armed_points
from tenxgraph.server.doors import LOOPBACK_HOSTS, parse_tokens
from tenxgraph.server.limits import Limits
from tenxgraph.utils.errors import ConfigError

DEFAULT_TOKEN_ENV = "TENXGRAPH_API_TOKEN"
#: The ceilings of a request's config: ``--max-<name>`` sets ``Limits.<name>``.
CEILINGS = ("recursion_limit", "tool_timeout", "node_timeout", "lock_timeout")


def add_door_options(serve: argparse.ArgumentParser) -> None:
    doors = serve.add_argument_group("doors (see docs/server.md, Security)")
    doors.add_argument(
        "--token-env",
        default=None,
        help=f"environment variable holding the one shared bearer token (default {DEFAULT_TOKEN_ENV}; named "
        "explicitly, it must be set and not empty)",
    )
    doors.add_argument(
        "--tokens-env",
        default=None,
        help="environment variable holding owner=token,owner2=token2: each owner sees only its own threads",
    )
    doors.add_argument(
        "--insecure-no-auth",
        action="store_true",
        help="serve a non-loopback address without any token (refused otherwise)",
    )
    doors.add_argument(
        "--allowed-host",
        action="append",
        default=None,
        help="a Host name to answer (repeat it; '*' any, '*.example.com'; default: loopback names and --host)",
    )
    doors.add_argument(
        "--allowed-origin",
        action="append",
        default=[],
        help="a browser origin to let in, e.g. https://app.example.com (repeat it; default none: cross-site "
        "requests are 403)",
    )
    doors.add_argument(
        "--allow-system-messages", action="store_true", help="take client messages with role 'system' (403 otherwise)"
    )
    d = Limits()
    doors.add_argument("--max-body-bytes", type=int, default=d.max_body_bytes, help="larger bodies get 413")
    doors.add_argument("--body-timeout", type=float, default=d.body_timeout, help="seconds to send a body, or 408")
    doors.add_argument(
        "--max-state-page-bytes", type=int, default=d.max_state_page_bytes,
        help="GET /state sends a thread's messages in pages of at most this many bytes (default 1 MiB)",
    )  # fmt: skip
    doors.add_argument(
        "--header-timeout", type=float, default=10.0, help="seconds to send a request's headers, or the "
        "connection is closed (default 10)",
    )  # fmt: skip
    doors.add_argument(
        "--write-timeout", type=float, default=30.0, help="seconds a client may leave a response unread (the "
        "server's send buffer full) before its connection is cut (default 30)",
    )  # fmt: skip
    doors.add_argument(
        "--limit-concurrency", type=int, default=1024, help="connections at once; beyond them, 503 (default 1024)"
    )
    doors.add_argument(
        "--threads-per-owner", type=int, default=8, help="threads of the server's 32 for sync tools that one "
        "owner's runs may hold at once (counted until each thread ends; default 8)",
    )  # fmt: skip
    doors.add_argument(
        "--metrics-token-env",
        default=None,
        help="environment variable holding the operator's token for /metrics (every owner's activity); with "
        "--tokens-env, /metrics is 403 without it",
    )
    doors.add_argument(
        "--forwarded-allow-ips",
        default=None,
        help="proxies (comma-separated addresses or networks, uvicorn's setting) whose X-Forwarded-For and "
        "X-Forwarded-Proto name the client; default none: a client's address is its connection's, whatever it "
        "sends (a loopback peer's forwarded header is not trusted either)",
    )
    for name in CEILINGS:
        doors.add_argument(
            "--max-" + name.replace("_", "-"),
            type=float if "timeout" in name else int,
            default=getattr(d, name),
            help=f"ceiling of a request's config.{name} (a client may ask for less; default {getattr(d, name)})",
        )


def is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


def _token(settings: dict[str, Any]) -> str | None:
    """The shared token, or None; a variable asked for (or the default one, set) must hold one."""
    name = settings["token_env"] or DEFAULT_TOKEN_ENV
    value = os.environ.get(name)
    if value is None:
        if settings["token_env"]:
            raise ConfigError(f"--token-env {name}: the variable is not set; export {name}=<token>")
        return None
    if not value.strip():
        raise ConfigError(
            f"{name} is set but empty: that would serve without authentication; give it a token, or unset it"
        )
    return value.strip()


def door_kwargs(settings: dict[str, Any]) -> dict[str, Any]:
    """``create_app`` keyword arguments from the serve settings (in each worker process)."""
    kwargs: dict[str, Any] = {}
    if settings["tokens_env"]:
        name = settings["tokens_env"]
        if os.environ.get(name) is None:
            raise ConfigError(f"--tokens-env {name}: the variable is not set; export {name}=owner=token,...")
        kwargs["tokens"] = parse_tokens(os.environ[name], name)
    else:
        kwargs["token"] = _token(settings)
    if settings.get("threads_per_owner") is not None:
        kwargs["threads_per_owner"] = settings["threads_per_owner"]
    if settings.get("metrics_token_env"):
        name = settings["metrics_token_env"]
        value = os.environ.get(name)
        if value is None or not value.strip():
            raise ConfigError(f"--metrics-token-env {name}: the variable is not set or empty; export {name}=<token>")
        kwargs["metrics_token"] = value.strip()
    host = settings["host"]
    hosts = settings["allowed_host"] or [
        *LOOPBACK_HOSTS,
        *([] if is_loopback(host) or host in ("0.0.0.0", "::") else [host]),
    ]
    limits = Limits(
        max_body_bytes=settings["max_body_bytes"],
        body_timeout=settings["body_timeout"],
        max_state_page_bytes=settings["max_state_page_bytes"],
        **{name: settings[f"max_{name}"] for name in CEILINGS},
    )
    return {
        **kwargs,
        "allowed_hosts": tuple(hosts),
        "allowed_origins": tuple(settings["allowed_origin"]),
        "allow_system_messages": settings["allow_system_messages"],
        "limits": limits,
    }


def check_doors(args: argparse.Namespace) -> None:
    """Refuse to start with an open door (SystemExit naming it and the fix)."""
    try:
        kwargs = door_kwargs(vars(args))
    except (ConfigError, ValueError) as exc:
        raise SystemExit(f"tenxgraph serve: {exc}") from None
    open_door = kwargs.get("token") is None and "tokens" not in kwargs
    if open_door and not is_loopback(args.host) and not args.insecure_no_auth:
        raise SystemExit(
            f"tenxgraph serve: --host {args.host} is reachable from other machines and no token is set: export "
            f"{DEFAULT_TOKEN_ENV}=<token> (or use --tokens-env), or pass --insecure-no-auth if a proxy in front "
            "authenticates"
        )
    armed = armed_points()
    if armed and not os.environ.get(ENV_CRASH_TEST):
        raise SystemExit(
            f"tenxgraph serve: crash point(s) {', '.join(armed)} armed by {ENV_CRASH_AT}: the server "
            f"would kill itself at the first request that reaches one. Unset {ENV_CRASH_AT} (a test "
            f"that means it sets {ENV_CRASH_TEST}=1)"
        )


def header_timeout_protocol(seconds: float, write_timeout: float = 30.0) -> Any:
    """uvicorn's HTTP protocol with a deadline for each request's headers and for a client that stops reading
    (uvicorn has neither: a client sending a header a minute, or reading a byte a minute, would hold its
    connection for ever)."""
    from tenxgraph.server.slow_clients import HeaderDeadline

    return partial(HeaderDeadline, header_timeout=seconds, write_timeout=write_timeout)


def proxy_settings(forwarded_allow_ips: str | None) -> dict[str, Any]:
    """uvicorn's proxy-header settings: off unless the operator names the proxies to trust (uvicorn trusts a
    loopback peer's ``X-Forwarded-For`` by default, which lets any local client pick the address it is throttled
    by)."""
    if not forwarded_allow_ips or not forwarded_allow_ips.strip():
        return {"proxy_headers": False}
    return {"proxy_headers": True, "forwarded_allow_ips": forwarded_allow_ips.strip()}
