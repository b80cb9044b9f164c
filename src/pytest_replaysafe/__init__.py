"""pytest-replaysafe: the crash matrix for replay-safe agents. The plugin's entry (``plugin``, ``options``,
``fixtures``, ``hookspecs``, ``reporter``) is what pytest loads; each role is a subpackage: ``matrix`` (the cells),
``run`` (crashing and resuming them), ``judge`` (verdicts), ``report`` (what a person sees), ``conformance``
(certify a checkpointer, or a LangGraph saver).

The names a test author uses are here, imported when first used (a plain ``pytest`` run loads none of them)."""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from pytest_replaysafe.conformance import CheckpointerConformance, RunLockConformance, SaverConformance
    from pytest_replaysafe.judge.gaps import KNOWN_GAPS, GapRule
    from pytest_replaysafe.matrix.cells import Backend
    from pytest_replaysafe.run.approvals import Approvals
    from pytest_replaysafe.run.effects import Effects
    from pytest_replaysafe.run.harness import CrashRun, ReplaySafetyViolation

_PUBLIC = {
    "Approvals": "pytest_replaysafe.run.approvals",
    "Backend": "pytest_replaysafe.matrix.cells",
    "CheckpointerConformance": "pytest_replaysafe.conformance",
    "CrashRun": "pytest_replaysafe.run.harness",
    "Effects": "pytest_replaysafe.run.effects",
    "GapRule": "pytest_replaysafe.judge.gaps",
    "KNOWN_GAPS": "pytest_replaysafe.judge.gaps",
    "ReplaySafetyViolation": "pytest_replaysafe.run.harness",
    "RunLockConformance": "pytest_replaysafe.conformance",
    "SaverConformance": "pytest_replaysafe.conformance",
}
__all__ = [
    "KNOWN_GAPS",
    "Approvals",
    "Backend",
    "CheckpointerConformance",
    "CrashRun",
    "Effects",
    "GapRule",
    "ReplaySafetyViolation",
    "RunLockConformance",
    "SaverConformance",
]


def __getattr__(name: str) -> Any:
    module = _PUBLIC.get(name)
    if module is None:
        raise AttributeError(f"module 'pytest_replaysafe' has no attribute {name!r}")
    return getattr(importlib.import_module(module), name)
