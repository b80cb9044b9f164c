"""A package whose names import an optional dependency on first use: :func:`lazy_names`, the ``__getattr__`` of an
integration's package (importing the package needs nothing installed; using one of its names checks the extra
first, with an ImportError that names it)."""

from __future__ import annotations

import importlib
from collections.abc import Callable, Mapping
from typing import Any

__all__ = ["lazy_names"]


def lazy_names(package: str, where: Mapping[str, str], require: Callable[[], None]) -> Callable[[str], Any]:
    """The module ``__getattr__`` of *package*: each name of *where* imported from the module *where* gives, after
    *require()* (which raises when the extra is missing)."""

    def getattr_(name: str) -> Any:
        if name not in where:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        require()
        return getattr(importlib.import_module(where[name]), name)

    return getattr_
