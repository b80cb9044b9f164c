"""The one back-off policy of the runtime's retry loops: a first delay, a growth factor and a cap. Each loop keeps
its own numbers (they wait for different things), and none writes its own arithmetic."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class Backoff:
    #: The first delay, in seconds.
    start: float
    #: Each delay is the previous one times this.
    factor: float
    #: No delay is longer than this.
    cap: float

    def delays(self) -> Iterator[float]:
        """The delays between attempts: ``start``, ``start * factor``, ... up to ``cap``, without end."""
        delay = self.start
        while True:
            yield min(delay, self.cap)
            delay = min(delay * self.factor, self.cap)
