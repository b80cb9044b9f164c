"""Certify a checkpointer: subclass :class:`CheckpointerConformance` (the whole contract, :mod:`.suite`) or
:class:`RunLockConformance` (its run lock alone, :mod:`.lock`) in your own tests; a LangGraph saver:
:class:`SaverConformance` (:mod:`.saver`)."""

from pytest_replaysafe.conformance.lock import RunLockConformance
from pytest_replaysafe.conformance.saver import SaverConformance
from pytest_replaysafe.conformance.suite import CheckpointerConformance

__all__ = ["CheckpointerConformance", "RunLockConformance", "SaverConformance"]
