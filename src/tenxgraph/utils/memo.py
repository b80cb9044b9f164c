"""What a conversion made of an object, remembered by the object's identity: a framework hands the ledger the same
object once per tool call (LangGraph gives each call of a step the step's state, whose ``AIMessage`` is one object,
and the same tool object every time), and converting it for each call costs N conversions of N calls."""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Callable
from typing import Generic, TypeVar

__all__ = ["IdentityMemo"]

K = TypeVar("K")
V = TypeVar("V")


class IdentityMemo(Generic[K, V]):
    """``memo.get(obj)`` is ``convert(obj)``, made once per object for the last *size* objects (each kept alive
    while remembered, so its ``id`` names no other); safe from several threads (two threads converting one object
    at once both convert, and either result is kept). *fingerprint*: what of a mutable object a conversion
    depends on, read on every hit (an object changed in place since its conversion is converted again)."""

    def __init__(
        self, convert: Callable[[K], V], size: int = 64, fingerprint: Callable[[K], object] | None = None
    ) -> None:
        if size < 1:
            raise ValueError(f"IdentityMemo size={size!r}: remember at least one object")
        self._convert = convert
        self._size = size
        self._fingerprint = fingerprint or _nothing
        self._made: OrderedDict[int, tuple[K, object, V]] = OrderedDict()
        self._lock = threading.Lock()

    def get(self, obj: K) -> V:
        mark = self._fingerprint(obj)
        with self._lock:
            found = self._made.get(id(obj))
            if found is not None and found[0] is obj and found[1] == mark:
                self._made.move_to_end(id(obj))
                return found[2]
        made = self._convert(obj)  # (outside the lock: a conversion may raise, or take a while)
        with self._lock:
            self._made[id(obj)] = (obj, mark, made)
            self._made.move_to_end(id(obj))
            while len(self._made) > self._size:
                self._made.popitem(last=False)
        return made

    def __len__(self) -> int:
        return len(self._made)


def _nothing(obj: object) -> None:
    return None
