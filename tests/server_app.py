"""The app the server tests start with ``tenxgraph serve tests.server_app:app`` (configured by environment:
``TENX_APP=approved_refund`` serves examples/approved_refund, whose big refunds wait for approval)."""

from __future__ import annotations

import os

from examples.approved_refund.agent import build_agent
from examples.support_refund.agent import build_support_agent
from tests.support_child import FilePayments, open_checkpointer

_checkpointer = open_checkpointer(os.environ["TENX_BACKEND"], os.environ["TENX_TARGET"])
_payments = FilePayments(os.environ["TENX_EFFECTS"])
app = (
    build_agent(_checkpointer, _payments)
    if os.environ.get("TENX_APP") == "approved_refund"
    else build_support_agent(_checkpointer, _payments)
)
