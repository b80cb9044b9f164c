"""``python -m examples.outbox``: run the agent once, then the relay. ``python -m examples.outbox relay DATABASE
EFFECTS [TABLE]``: the relay alone, in a process of its own, sending to the crash matrix's provider file."""

from __future__ import annotations

import sys

from examples.outbox.agent import LocalProvider, build_outbox_agent, relay
from tenxgraph import Message

if len(sys.argv) in (4, 5) and sys.argv[1] == "relay":
    from pytest_replaysafe import Effects

    print(relay(sys.argv[2], Effects(sys.argv[3]), *sys.argv[4:]))
else:
    result = build_outbox_agent().invoke({"messages": [Message.text_message("email me")]}, {"thread_id": "t1"})
    print(result.final_text)
    print(f"relay sent {relay('outbox.db', LocalProvider())} email(s)")
