"""Deterministic crash points: the runtime side of the fault-injection harness.

Call sites say ``crash_point("tool.after_return")``. Every built-in point is declared once, in the table
:data:`POINTS` below (name, kind, what is true when it fires, the module that fires it), in the order the points
fire in a run; :func:`declare` adds a point of your own. Listing points imports nothing. Disarmed, a call site
costs one global check.

Arm a point in-process with :func:`arm` (or the :func:`armed` context manager), or for a child process from the
environment: ``TENXGRAPH_CRASH_AT=name[:hit[:action]]`` (read at import and by :func:`arm_from_env`). The point
fires on its *hit*-th arrival after arming. Actions:

- ``raise``: raise :class:`CrashInjected`, a ``BaseException`` that ordinary ``except Exception`` does not catch;
- ``kill``: write and fsync a marker file (``TENXGRAPH_CRASH_MARKER``) naming the point and hit, then SIGKILL
  this process;
- ``fault``: raise :class:`InjectedFault`, an ordinary exception (the default for fault points such as
  ``ledger.read_error``, which simulate a failing dependency rather than a dying process);
- any callable, called with the point name and hit.

(Past the ~350-line guide: the one table of every point, and what arms, counts and fires them, in one place.)
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import signal
import sys
import tempfile
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Literal, TypeAlias

Action: TypeAlias = Literal["raise", "kill", "fault"] | Callable[[str, int], None]
Kind: TypeAlias = Literal["crash", "fault"]
ACTIONS = ("raise", "kill", "fault")
ENV_CRASH_AT = "TENXGRAPH_CRASH_AT"
ENV_MARKER = "TENXGRAPH_CRASH_MARKER"
#: Set (to anything) by a test that arms a crash point on purpose: the arming is then logged at INFO, not ERROR,
#: and ``tenxgraph serve`` starts with it.
ENV_CRASH_TEST = "TENXGRAPH_CRASH_TEST"


class CrashInjected(BaseException):
    """Raised by an armed crash point with the ``raise`` action: the run stops as if the process died."""

    def __init__(self, point: str, hit: int) -> None:
        self.point = point
        self.hit = hit
        super().__init__(f"crash injected at {point!r} (hit {hit})")


class InjectedFault(RuntimeError):
    """Raised by an armed point with the ``fault`` action: a dependency failed (an ordinary exception)."""

    def __init__(self, point: str, hit: int) -> None:
        self.point = point
        self.hit = hit
        super().__init__(f"fault injected at {point!r} (hit {hit})")


@dataclass(frozen=True, slots=True)
class CrashPoint:
    name: str
    kind: Kind
    description: str
    module: str  # the module whose code fires it
    also: tuple[str, ...] = ()  # other modules that fire it: the same moment on another path

    @property
    def location(self) -> str:
        """The firing module's source file, relative to its package's parent folder."""
        return self.module.replace(".", "/") + ".py"

    @property
    def locations(self) -> tuple[str, ...]:
        return (self.location, *(m.replace(".", "/") + ".py" for m in self.also))


_HANDLER = "tenxgraph.core.graph.utils.invoke_node_handler"
_TRANSACTIONAL = ("tenxgraph.core.graph.utils.transactional",)
_LANGGRAPH = "pytest_replaysafe.run.langgraph_watch"  # the watcher of a bare ToolNode's calls
_PYDANTIC_AI_WATCH = "pytest_replaysafe.run.pydantic_ai_watch"  # the watcher of a bare Pydantic AI agent's calls
_WATCHES = (_LANGGRAPH, _PYDANTIC_AI_WATCH, "pytest_replaysafe.run.openai_agents_watch")  # (and an SDK agent's)
_COMPILED = "tenxgraph.core.graph.compiled"
_LANGGRAPH_HARNESS = "pytest_replaysafe.run.langgraph_app"  # the harness's saver (its own point)
_LANGGRAPH_SAVER = "tenxgraph.integrations.langgraph.saver"  # CrashPointSaver, around a LangGraph saver
_PYDANTIC_AI = "tenxgraph.integrations.pydantic_ai.backend"  # LedgerDurability's journal of model responses
_PYDANTIC_AI_HARNESS = ("pytest_replaysafe.run.pydantic_ai_app",)  # a bare agent's history, saved by the harness
#: A Pydantic AI run came back paused (DeferredToolRequests), or an OpenAI Agents SDK run with interruptions, to
#: the harness, which plays its caller.
_HARNESS_PAUSES = ("pytest_replaysafe.run.pydantic_ai_pauses", "pytest_replaysafe.run.openai_agents_pauses")
_OPENAI_AGENTS = "tenxgraph.integrations.openai_agents.journal"  # replay_safe's journal of model responses
#: Every built-in point, in the order the points fire in a run.
POINTS: tuple[CrashPoint, ...] = (
    CrashPoint("run.before_node", "crash", "the current node is recorded; the node has not started", _COMPILED),
    CrashPoint(
        "model.mid_stream",
        "crash",
        "a model's reply is streaming: its first chunk reached the caller; nothing of it is stored",
        "tenxgraph.models.calls",
    ),
    CrashPoint("tool.before_ledger_read", "crash", "tool node started; the ledger has not been read yet", _HANDLER),
    CrashPoint("ledger.read_error", "fault", "the batched ledger read fails (fault point)", _HANDLER),
    CrashPoint("tool.before_invoke", "crash", "ledger miss; the tool is about to run", _HANDLER, _WATCHES),
    CrashPoint(
        "tool.in_flight",
        "crash",
        "the effects simulator applied a side effect (or an MCP server answered); the tool has not returned",
        "pytest_replaysafe.run.effects",
        ("tenxgraph.integrations.mcp.tools",),
    ),
    CrashPoint(
        "tool.after_return",
        "crash",
        "the tool returned; its record is not written yet",
        _HANDLER,
        (*_TRANSACTIONAL, *_WATCHES),
    ),
    CrashPoint(
        "ledger.write_error", "fault", "writing the ledger record fails (fault point)", _HANDLER, _TRANSACTIONAL
    ),
    CrashPoint(
        "tool.after_record", "crash", "the record is written; the node has not completed", _HANDLER, _TRANSACTIONAL
    ),
    CrashPoint("node.after_complete", "crash", "the node finished; the run has not advanced", _COMPILED),
    CrashPoint(
        "run.after_advance",
        "crash",
        "the node's output and the next node are persisted",
        _COMPILED,
    ),
    # Pauses for a person (approvals, interrupt()): the approved call itself goes through the tool points above.
    CrashPoint(
        "approval.after_pause",
        "crash",
        "the run paused for a person: its interrupts are stored (status interrupted); the caller has no answer yet",
        _COMPILED,
        _HARNESS_PAUSES,
    ),
    CrashPoint(
        "approval.after_decision",
        "crash",
        "a Resume's decisions are recorded in the ledger; the run has not gone on",
        "tenxgraph.core.graph.pauses",
        ("tenxgraph.integrations.pydantic_ai.answering", "tenxgraph.integrations.openai_agents.decisions"),
    ),
    # A LangGraph app: its saver's writes (fired by the public saver wrapper the harness compiles apps with).
    CrashPoint(
        "langgraph.after_put_writes",
        "crash",
        "LangGraph saved a task's writes; the step's checkpoint is not saved yet",
        _LANGGRAPH_SAVER,
    ),
    CrashPoint(
        "langgraph.before_put", "crash", "a LangGraph step is done; its checkpoint is not saved yet", _LANGGRAPH_SAVER
    ),
    CrashPoint("langgraph.after_put", "crash", "LangGraph saved a step's checkpoint", _LANGGRAPH_SAVER),
    # LangGraph saves a task's writes in a background thread, even with durability="sync": a kill in that thread
    # can land while a later step's tool runs. The matrix plays that race (its saver fires this point; the kill is
    # held until a later tool call has returned, unrecorded).
    CrashPoint(
        "langgraph.late_put_writes",
        "crash",
        "LangGraph's background thread saved a task's writes while a later step's tool call ran: the kill lands "
        "once that call has returned, before its record (crash matrix only)",
        _LANGGRAPH_HARNESS,
    ),
    # A Pydantic AI agent: its model's responses (journaled by LedgerDurability; a bare agent's user saves the
    # run's message history, as the harness does, after each step).
    CrashPoint(
        "pydantic_ai.after_model_response",
        "crash",
        "a Pydantic AI agent's model answered; the response is not journaled (a bare agent: its history not saved)",
        _PYDANTIC_AI,
        _PYDANTIC_AI_HARNESS,
    ),
    CrashPoint(
        "pydantic_ai.after_model_record",
        "crash",
        "the model's response is journaled (a bare agent: the run's history is saved); its tools have not run",
        _PYDANTIC_AI,
        _PYDANTIC_AI_HARNESS,
    ),
    # An OpenAI Agents SDK agent made replay-safe (replay_safe): its model's responses, journaled.
    CrashPoint(
        "openai_agents.after_model_response",
        "crash",
        "the model answered; its response is not journaled",
        _OPENAI_AGENTS,
    ),
    CrashPoint(
        "openai_agents.after_model_record", "crash", "the response is journaled; its tools have not run", _OPENAI_AGENTS
    ),
)


@dataclass(slots=True)
class _Arming:
    hit: int
    action: Action
    seen: int = 0
    fired: bool = False


_registry: dict[str, CrashPoint] = {p.name: p for p in POINTS}
_lock = threading.Lock()
# Hot-path state: None when nothing is armed and nothing counts, so a call site costs one check.
_active: dict[str, _Arming] | None = None
_armed: dict[str, _Arming] = {}
_counts: dict[str, int] | None = None
_fired: list[tuple[str, int]] = []


def declare(name: str, description: str, kind: Kind = "crash") -> CrashPoint:
    """Add a point of your own, fired by the calling module (declaring a point again the same way is harmless)."""
    module = sys._getframe(1).f_globals.get("__name__", "?")
    point = CrashPoint(name, kind, description, module)
    with _lock:
        existing = _registry.get(name)
        if existing is not None and (existing.module, existing.kind) != (point.module, point.kind):
            raise ValueError(f"crash point {name!r} is declared twice: in {existing.module} and in {point.module}")
        _registry.setdefault(name, point)
    return _registry[name]


def list_crash_points(kind: Kind | None = None) -> list[CrashPoint]:
    """Every point, built-in ones in firing order, then your own."""
    return [p for p in _registry.values() if kind is None or p.kind == kind]


def get_crash_point(name: str) -> CrashPoint:
    try:
        return _registry[name]
    except KeyError:
        known = ", ".join(sorted(_registry))
        raise KeyError(f"unknown crash point {name!r}; known points: {known}") from None


def _refresh() -> None:
    global _active
    _active = dict(_armed) if (_armed or _counts is not None) else None


def arm(name: str, hit: int = 1, action: Action | None = None) -> None:
    """Make point *name* fire on its *hit*-th arrival from now on. Unknown names raise ``KeyError``."""
    point = get_crash_point(name)
    if not isinstance(hit, int) or hit < 1:
        raise ValueError(f"hit must be a whole number >= 1, got {hit!r}")
    if action is None:
        action = "fault" if point.kind == "fault" else "raise"
    if not callable(action) and action not in ACTIONS:
        raise ValueError(f"unknown crash action {action!r}; use one of {', '.join(ACTIONS)} or a callable")
    with _lock:
        _armed[name] = _Arming(hit, action)
        _refresh()


def disarm(name: str | None = None) -> None:
    """Disarm one point, or all of them."""
    with _lock:
        if name is None:
            _armed.clear()
        else:
            _armed.pop(name, None)
        _refresh()


@contextlib.contextmanager
def armed(name: str, hit: int = 1, action: Action | None = None) -> Iterator[None]:
    arm(name, hit, action)
    try:
        yield
    finally:
        disarm(name)


@contextlib.contextmanager
def counting() -> Iterator[dict[str, int]]:
    """Count arrivals at every point while the block runs (how the harness learns the hits of a clean run)."""
    global _counts
    counts: dict[str, int] = {}
    with _lock:
        _counts = counts
        _refresh()
    try:
        yield counts
    finally:
        with _lock:
            _counts = None
            _refresh()


def fired() -> list[tuple[str, int]]:
    """``(point, hit)`` of every point that fired in this process since the last :func:`reset`."""
    return list(_fired)


def reset() -> None:
    """Disarm everything and forget what fired."""
    with _lock:
        _armed.clear()
        _fired.clear()
        _refresh()


def crash_point(name: str) -> None:
    """A call site. Does nothing unless *name* is armed or arrivals are being counted."""
    if _active is None:
        return
    _arrive(name)


def _arrive(name: str) -> None:
    if name not in _registry:
        raise KeyError(f"crash_point({name!r}) fired but was never declared; call declare() in its module")
    with _lock:
        if _counts is not None:
            _counts[name] = _counts.get(name, 0) + 1
        arming = _armed.get(name)
        if arming is None or arming.fired:
            return
        arming.seen += 1
        if arming.seen != arming.hit:
            return
        arming.fired = True
        _fired.append((name, arming.hit))
        action = arming.action
    _fire(name, arming.hit, action)


def marker_path() -> Path:
    env = os.environ.get(ENV_MARKER)
    if env:
        return Path(env)
    return Path(tempfile.gettempdir()) / f"tenxgraph-crash-{os.getpid()}.json"


def read_marker(path: Path) -> tuple[str, int] | None:
    """The ``(point, hit)`` a killed process wrote before dying, or None if it wrote none."""
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    return str(data["point"]), int(data["hit"])


def _write_marker(name: str, hit: int) -> None:
    path = marker_path()
    payload = json.dumps({"point": name, "hit": hit, "pid": os.getpid()}).encode()
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    try:
        os.write(fd, payload)
        os.fsync(fd)
    finally:
        os.close(fd)


def _fire(name: str, hit: int, action: Action) -> None:
    if callable(action):
        action(name, hit)
    elif action == "raise":
        raise CrashInjected(name, hit)
    elif action == "fault":
        raise InjectedFault(name, hit)
    else:  # kill
        _write_marker(name, hit)
        sys.stdout.flush()
        sys.stderr.flush()
        os.kill(os.getpid(), signal.SIGKILL)


def parse_crash_spec(spec: str) -> tuple[str, int, str | None]:
    """Parse ``name[:hit[:action]]``; raise ValueError naming the bad part."""
    parts = spec.strip().split(":")
    if not parts[0] or len(parts) > 3:
        raise ValueError(f"{ENV_CRASH_AT}={spec!r} is invalid; expected name[:hit[:action]]")
    try:
        hit = int(parts[1]) if len(parts) > 1 and parts[1] else 1
    except ValueError:
        raise ValueError(f"{ENV_CRASH_AT}={spec!r}: hit {parts[1]!r} is not a whole number") from None
    action = parts[2] if len(parts) > 2 and parts[2] else None
    if action is not None and action not in ACTIONS:
        raise ValueError(f"{ENV_CRASH_AT}={spec!r}: unknown action {action!r}; use one of {', '.join(ACTIONS)}")
    return parts[0], hit, action


def arm_from_env() -> bool:
    """Arm the point named by ``TENXGRAPH_CRASH_AT`` (default action for it there: ``kill``). True if armed.

    A bad value is a :class:`~tenxgraph.utils.errors.ConfigError` naming the variable and the known points: fault
    injection is never half-armed by a typo. Production never sets the variable; then nothing is armed and every
    crash point costs one global check."""
    from tenxgraph.utils.errors import ConfigError

    spec = os.environ.get(ENV_CRASH_AT)
    if not spec:
        return False
    unset = f"unset {ENV_CRASH_AT} to run without fault injection"
    try:
        name, hit, action = parse_crash_spec(spec)
    except ValueError as exc:
        raise ConfigError(f"{exc}; {unset}") from None
    if name not in _registry:
        known = ", ".join(sorted(_registry))
        raise ConfigError(f"{ENV_CRASH_AT}={spec!r}: unknown crash point {name!r}; known points: {known}; {unset}")
    if action is None:
        action = "fault" if _registry[name].kind == "fault" else "kill"
    arm(name, hit, action)  # type: ignore[arg-type]
    testing = bool(os.environ.get(ENV_CRASH_TEST))
    logging.getLogger("tenxgraph").log(
        logging.INFO if testing else logging.ERROR,
        "crash point %s is armed from %s=%r: this process will %s at its hit %d. It is fault injection for tests; "
        "%s (a test that means it sets %s=1)",
        name, ENV_CRASH_AT, spec, {"kill": "kill itself", "raise": "raise", "fault": "fail a storage call"}[action],
        hit, unset, ENV_CRASH_TEST,
    )  # fmt: skip
    return True


def armed_points() -> list[str]:
    """The names of the crash points armed in this process (empty in production)."""
    with _lock:
        return sorted(_armed)
