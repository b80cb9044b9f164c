"""Per-run configuration: ``config={"thread_id": "t1", "tool_timeout": 60, "node_timeout": 120, "lock_timeout": 5}``.

``lock_timeout``: how long a run waits for the thread's run lock when another run holds it (default 0: fail at
once with ``ThreadBusyError``). A resume right after a crash may need it: PostgreSQL frees a killed process's
session lock only when its backend notices the dead connection, a few milliseconds later."""

from __future__ import annotations

import dataclasses
import logging
import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from tenxgraph.state.messages import id_problem, new_id
from tenxgraph.utils.constants import LOGGER_NAME, NODE_TIMEOUT, RECURSION_LIMIT, THREAD_ID_MAX_BYTES, TOOL_TIMEOUT
from tenxgraph.utils.errors import ConfigError
from tenxgraph.utils.thread_share import ThreadShare

log = logging.getLogger(LOGGER_NAME)

KNOWN_KEYS = (
    "thread_id", "node_timeout", "tool_timeout", "recursion_limit", "lock_timeout", "tracer_provider", "thread_share"
)  # fmt: skip
#: The run's limits: stored with the thread when a run's config says them, kept by a resume that does not.
LIMIT_KEYS = ("recursion_limit", "node_timeout", "tool_timeout")


def parse_timeout(name: str, value: object) -> float | None:
    """Seconds as a positive float; ``None`` or ``0`` disables the limit."""
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise ConfigError(f"{name} must be a number of seconds, or None/0 to disable it; got {value!r}")
    if math.isnan(value) or value < 0:
        raise ConfigError(f"{name} must be >= 0 seconds (0 or None disables it); got {value!r}")
    return None if value == 0 or math.isinf(value) else float(value)


@dataclass(frozen=True, slots=True)
class RunConfig:
    thread_id: str
    thread_id_generated: bool
    node_timeout: float | None
    tool_timeout: float | None
    recursion_limit: int
    lock_timeout: float | None = None
    #: An OpenTelemetry TracerProvider for this run's spans (default: the global one; none configured: no spans).
    tracer_provider: object | None = None
    #: The limits the config says itself (of :data:`LIMIT_KEYS`): a run stores them, and a resume that does not
    #: say its own keeps them (:meth:`resuming`).
    given: frozenset[str] = frozenset()
    #: The share of the executor's threads its sync tools and nodes may hold (a server's, per owner; see
    #: :class:`~tenxgraph.utils.thread_share.ThreadShare`); None: no limit of its own.
    thread_share: ThreadShare | None = None

    def limits(self) -> dict[str, Any]:
        """The limits this config says itself, as a run stores them with its thread."""
        return {key: getattr(self, key) for key in LIMIT_KEYS if key in self.given}

    def resuming(self, stored: Mapping[str, Any], step: int) -> tuple[RunConfig, int]:
        """This config for a resume, at *step*, of a run that was started with the limits *stored* (and at
        ``stored["from_step"]``), and the nodes the run has taken: each limit this config does not say is the
        run's (a recovery keeps a client's ``recursion_limit`` of 4, and its timeouts), and a recursion limit
        it does not say counts the run's nodes from where the run began."""
        kept = {k: stored[k] for k in LIMIT_KEYS if k in stored and k not in self.given}
        taken = 0 if "recursion_limit" in self.given else max(0, step - int(stored.get("from_step", step)))
        return (dataclasses.replace(self, **kept) if kept else self), taken

    @classmethod
    def parse(cls, config: Mapping[str, Any] | None) -> RunConfig:
        config = dict(config or {})
        unknown = sorted(set(config) - set(KNOWN_KEYS))
        if unknown:
            raise ConfigError(f"unknown run config keys {unknown}; known keys are {list(KNOWN_KEYS)}")
        thread_id = config.get("thread_id")
        generated = thread_id is None
        if generated:
            thread_id = new_id("thread")
            log.warning(
                "no thread_id in the run config: generated %s. Replay protection needs a caller-supplied "
                "thread_id: pass config={'thread_id': ...} to resume this run after a crash",
                thread_id,
            )
        elif (problem := id_problem(thread_id, THREAD_ID_MAX_BYTES)) is not None:
            raise ConfigError(f"config['thread_id'] {problem}")
        assert isinstance(thread_id, str)
        limit = config.get("recursion_limit", RECURSION_LIMIT)
        if isinstance(limit, bool) or not isinstance(limit, int) or limit < 1:
            raise ConfigError(f"recursion_limit must be a whole number >= 1, got {limit!r}")
        return cls(
            thread_id=thread_id,
            thread_id_generated=generated,
            node_timeout=parse_timeout("node_timeout", config.get("node_timeout", NODE_TIMEOUT)),
            tool_timeout=parse_timeout("tool_timeout", config.get("tool_timeout", TOOL_TIMEOUT)),
            recursion_limit=limit,
            lock_timeout=parse_timeout("lock_timeout", config.get("lock_timeout", 0)),
            tracer_provider=config.get("tracer_provider"),
            given=frozenset(k for k in LIMIT_KEYS if k in config),
            thread_share=_share(config.get("thread_share")),
        )


def _share(value: object) -> ThreadShare | None:
    if value is None or isinstance(value, ThreadShare):
        return value
    raise ConfigError(f"thread_share must be a ThreadShare (the server's, per owner), got {value!r}")
