"""The app the server tests start with ``tenxgraph serve tests.server_app:app`` (configured by environment)."""

from __future__ import annotations

import os

from examples.support_refund.agent import build_support_agent
from tests.support_child import FilePayments, open_checkpointer

app = build_support_agent(
    open_checkpointer(os.environ["TENX_BACKEND"], os.environ["TENX_TARGET"]), FilePayments(os.environ["TENX_EFFECTS"])
)
