"""The server's doors: who may reach it (``Host``), from where (``Origin``), with what (JSON only on writes), as
whom (bearer tokens mapped to owners, or the operator's own hook), and how often a wrong token may be tried.

An owner's threads live under its own name (``<owner>/<thread id>`` in storage; a path's thread id cannot
contain ``/``), so one owner can neither read nor resume nor append to another's: like a namespace, by
construction rather than by a check that could be forgotten on one endpoint.
"""

from __future__ import annotations

import hmac
import inspect
import ipaddress
import re
import time
from collections import OrderedDict
from collections.abc import Awaitable, Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any, TypedDict

from tenxgraph.utils.errors import ConfigError

#: Host names a server on a loopback address answers to unless told more (DNS rebinding sends any other).
LOOPBACK_HOSTS = ("127.0.0.1", "localhost", "::1")
#: An owner name: what goes before the ``/`` of its threads' storage ids.
OWNER = re.compile(r"[A-Za-z0-9_.@:+-]{1,128}")

#: ``authenticate(request) -> owner``: the operator's hook; None (or raising PermissionError) refuses the request.
Authenticate = Callable[[Any], "str | Awaitable[str | None] | None"]


class Refused(Exception):
    """A request stopped at a door: answered with ``status``, this message, and ``headers``."""

    def __init__(self, status: int, message: str, headers: Mapping[str, str] | None = None) -> None:
        super().__init__(message)
        self.status = status
        self.headers = dict(headers or {})


def host_of(header: str) -> str:
    """The host name of a ``Host`` header, without its port (``[::1]:8000`` -> ``::1``)."""
    header = header.strip().lower()
    if header.startswith("["):
        return header[1 : header.find("]")] if "]" in header else header
    return header.rsplit(":", 1)[0] if header.count(":") == 1 else header


def host_allowed(host: str, allowed: Iterable[str]) -> bool:
    for pattern in allowed:
        pattern = pattern.lower()
        if pattern == "*" or pattern == host or (pattern.startswith("*.") and host.endswith(pattern[1:])):
            return True
    return False


@dataclass
class Throttle:
    """Wrong tokens from one client address: ``free`` are answered at once, then each further one locks the
    address out for twice as long as the last (1 s, 2 s, 4 s ... up to ``longest``), with 429 and
    ``Retry-After``. A right token clears the address's count. At most ``remembered`` addresses are kept."""

    free: int = 5
    longest: float = 60.0
    remembered: int = 10_000
    clock: Callable[[], float] = time.monotonic
    _failures: OrderedDict[str, tuple[int, float]] = field(default_factory=OrderedDict)

    def check(self, client: str) -> None:
        _count, until = self._failures.get(client, (0, 0.0))
        wait = until - self.clock()
        if wait > 0:
            raise Refused(
                429,
                f"too many wrong tokens from this address: try again in {wait:.0f} s",
                {"Retry-After": str(max(1, round(wait)))},
            )

    def failed(self, client: str) -> None:
        count, _ = self._failures.pop(client, (0, 0.0))
        count += 1
        lock = min(self.longest, 2.0 ** (count - self.free - 1)) if count > self.free else 0.0
        self._failures[client] = (count, self.clock() + lock)
        while len(self._failures) > self.remembered:
            self._failures.popitem(last=False)

    def passed(self, client: str) -> None:
        self._failures.pop(client, None)


class DoorArgs(TypedDict, total=False):
    """``create_app``'s door keywords (see docs/server.md, "Security"); each optional."""

    token: str | None
    tokens: dict[str, str] | None
    authenticate: Authenticate | None
    allowed_hosts: tuple[str, ...] | None
    allowed_origins: tuple[str, ...]
    allow_system_messages: bool
    metrics_token: str | None
    threads_per_owner: int


@dataclass
class Doors:
    """Every request passes :meth:`enter` first; it returns the request's owner (None: an unscoped server)."""

    allowed_hosts: tuple[str, ...] = LOOPBACK_HOSTS
    allowed_origins: tuple[str, ...] = ()
    token: str | None = None
    tokens: Mapping[str, str] | None = None  # token -> owner
    authenticate: Authenticate | None = None
    #: The operator's token for ``/metrics`` (every owner's activity): with owners, no other token opens it.
    metrics_token: str | None = None
    throttle: Throttle = field(default_factory=Throttle)

    def __post_init__(self) -> None:
        chosen = [n for n in ("token", "tokens", "authenticate") if getattr(self, n) is not None]
        if len(chosen) > 1:
            raise ConfigError(f"create_app: give one of token=, tokens= and authenticate=, not {' and '.join(chosen)}")
        if self.token is not None and not self.token.strip():
            raise ConfigError("create_app(token=...) is empty: an empty token would turn authentication off")
        if self.metrics_token is not None and not self.metrics_token.strip():
            raise ConfigError("create_app(metrics_token=...) is empty: give the operator's metrics a token")
        for token, owner in (self.tokens or {}).items():
            if not token.strip():
                raise ConfigError(f"create_app(tokens=...): owner {owner!r} has an empty token")
            if not OWNER.fullmatch(owner):
                raise ConfigError(f"create_app(tokens=...): owner {owner!r} must match {OWNER.pattern}")

    @property
    def auth(self) -> str:
        """How requests are authenticated, for the start-up log line."""
        if self.tokens is not None:
            return f"tokens ({len(self.tokens)} owners)"
        return "hook" if self.authenticate else ("token" if self.token else "none")

    async def enter(self, request: Any, *, auth: bool = True) -> str | None:
        """The request's owner, or :class:`Refused`. ``auth=False`` (``/healthz``: no work, nothing to read) lets
        every request in: a load balancer's probe names the machine's address as its ``Host``."""
        if not auth:
            return None
        self._place(request)
        return await self._owner(request)

    def _place(self, request: Any) -> None:
        """Where the request comes from and what it carries: its ``Host``, its ``Origin``, a JSON body."""
        host = host_of(request.headers.get("host", ""))
        if not host_allowed(host, self.allowed_hosts):
            raise Refused(
                400, f"host {host!r} is not served here (tenxgraph serve --allowed-host; loopback names by default)"
            )
        origin = request.headers.get("origin")
        if origin is not None and origin not in self.allowed_origins:
            raise Refused(403, f"requests from origin {origin!r} are refused (tenxgraph serve --allowed-origin)")
        if request.method == "POST":
            kind = request.headers.get("content-type", "").split(";")[0].strip().lower()
            if kind != "application/json":
                raise Refused(415, f"send the body as Content-Type: application/json, not {kind or 'none'!r}")

    async def enter_metrics(self, request: Any) -> None:
        """``/metrics`` shows every owner's activity: it is the operator's. Its own token when one is set; else
        the shared token (its holder runs the server), or nothing on an open loopback server; with owners and no
        metrics token, 403."""
        self._place(request)
        if self.metrics_token is not None:
            client = client_key(request.client.host if request.client else "?")
            if not hmac.compare_digest(_bearer_of(request).encode(), self.metrics_token.encode()):
                self.throttle.check(client)
                self.throttle.failed(client)
                raise Refused(401, "/metrics takes the operator's metrics token (Authorization: Bearer ...)", bearer())
            self.throttle.passed(client)
            return
        if self.tokens is not None or self.authenticate is not None:
            raise Refused(
                403,
                "/metrics shows every owner's activity: it is the operator's; set a metrics token "
                "(tenxgraph serve --metrics-token-env VAR, create_app(metrics_token=...))",
            )
        await self._owner(request)

    async def _owner(self, request: Any) -> str | None:
        """The token is checked first and only failures are throttled: a client with the right token is never
        locked out by wrong ones sent from its address (a NAT, a shared proxy). Tokens must be long and random:
        the throttle slows noise and load, guessing is what their length defeats."""
        if self.token is None and self.tokens is None and self.authenticate is None:
            return None
        client = client_key(request.client.host if request.client else "?")
        owner = await self._identify(request)
        if owner is None:
            self.throttle.check(client)
            self.throttle.failed(client)
            raise Refused(401, "missing or wrong bearer token (Authorization: Bearer <token>)", bearer())
        self.throttle.passed(client)
        return owner or None

    async def _identify(self, request: Any) -> str | None:
        """The owner ("" for the one shared token), or None when the request is not let in."""
        if self.authenticate is not None:
            try:
                found = self.authenticate(request)
                owner = await found if inspect.isawaitable(found) else found
            except PermissionError:
                return None
            if owner is not None and not OWNER.fullmatch(owner):
                raise ConfigError(f"authenticate() returned owner {owner!r}: it must match {OWNER.pattern}")
            return owner
        given = _bearer_of(request)
        if not given:
            return None
        if self.token is not None:
            return "" if hmac.compare_digest(given.encode(), self.token.encode()) else None
        found_owner = None
        for token, owner in (self.tokens or {}).items():  # every token compared: no early exit to time
            if hmac.compare_digest(given.encode(), token.encode()):
                found_owner = owner
        return found_owner


def client_key(host: str) -> str:
    """Whom the throttle counts: an IPv4 address, or an IPv6 address's /64 (one host's usual allocation: its
    addresses within it are one client)."""
    try:
        address = ipaddress.ip_address(host)
    except ValueError:
        return host
    if isinstance(address, ipaddress.IPv6Address):
        if address.ipv4_mapped is not None:
            return str(address.ipv4_mapped)
        return str(ipaddress.ip_network(f"{address}/64", strict=False))
    return str(address)


def _bearer_of(request: Any) -> str:
    """The request's bearer token ("" without one; RFC 7235: the scheme is case-insensitive)."""
    scheme, _, given = request.headers.get("authorization", "").partition(" ")
    return given.strip() if scheme.lower() == "bearer" else ""


def bearer() -> dict[str, str]:
    return {"WWW-Authenticate": 'Bearer realm="tenxgraph"'}


def stored_id(owner: str | None, thread_id: str) -> str:
    """The storage id of an owner's thread (the thread id itself on an unscoped server)."""
    return thread_id if owner is None else f"{owner}/{thread_id}"


def parse_tokens(spec: str, variable: str) -> dict[str, str]:
    """``owner=token,owner2=token2`` (the ``--tokens-env`` variable's value) as token -> owner."""
    tokens: dict[str, str] = {}
    for item in filter(None, (part.strip() for part in spec.split(","))):
        owner, sep, token = item.partition("=")
        if not sep or not owner or not token:
            raise ConfigError(f"{variable}: each entry must be owner=token, got {owner!r}{'=...' if sep else ''}")
        if token in tokens:
            raise ConfigError(f"{variable}: owners {tokens[token]!r} and {owner!r} share one token")
        tokens[token] = owner
    if not tokens:
        raise ConfigError(f"{variable} holds no owner=token entries")
    return tokens
