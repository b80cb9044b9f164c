"""Certify a checkpointer: subclass :class:`CheckpointerConformance` (the whole contract, :mod:`.suite`) or
:class:`RunLockConformance` (its run lock alone, :mod:`.lock`) in your own tests."""

from pytest_replaysafe.conformance.lock import RunLockConformance
from pytest_replaysafe.conformance.suite import CheckpointerConformance

__all__ = ["CheckpointerConformance", "RunLockConformance"]
