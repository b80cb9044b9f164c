"""The support agent's refund waits for a person; people answer it from processes of their own.

``python -m examples.pydantic_ai_support.approve EFFECTS_DB LEDGER HISTORY ask`` runs the agent until it pauses
on the refund and writes the run's messages to *HISTORY* (JSON, as Pydantic AI's ``ModelMessagesTypeAdapter``
dumps them); ``... HISTORY yes`` (or ``no``, or ``bare-yes`` / ``bare-no`` for the agent without a ledger) answers
it: through ``resume_once`` on the durable agent (the answer recorded first), by a plain ``run_sync`` with
``deferred_tool_results`` on the bare one, as Pydantic AI's docs do. It prints the run's output, or the refusal."""

from __future__ import annotations

import sys
from pathlib import Path

from pydantic_ai import DeferredToolRequests, DeferredToolResults
from pydantic_ai.messages import ModelMessagesTypeAdapter

from examples.pydantic_ai_support.agent import build_agent, open_ledger
from tenxgraph.integrations.pydantic_ai import resume_once
from tenxgraph.utils.errors import InterruptDecidedError

PROMPT = "Please refund order A-1042."


def main(argv: list[str]) -> None:
    from pytest_replaysafe.run.effects import Effects

    effects_db, where, history_file, what = argv[:4]
    bare = what.startswith("bare")
    ledger = None if bare else open_ledger(where)
    agent = build_agent(Effects(effects_db), ledger, approval=True)
    history = Path(history_file)
    try:
        if what in ("ask", "bare-ask"):
            result = agent.run_sync(PROMPT)
            assert isinstance(result.output, DeferredToolRequests), result.output
            history.write_bytes(ModelMessagesTypeAdapter.dump_json(result.all_messages()))
            print("paused on", [call.tool_name for call in result.output.approvals])
            return
        messages = ModelMessagesTypeAdapter.validate_json(history.read_bytes())
        call_id = next(p.tool_call_id for m in messages for p in m.parts if getattr(p, "tool_name", "") == "refund")
        answer = DeferredToolResults(approvals={call_id: what.endswith("yes")})
        if bare:
            print(agent.run_sync(message_history=messages, deferred_tool_results=answer).output)
            return
        try:
            print(resume_once(agent, answer, message_history=messages).output)
        except InterruptDecidedError as exc:
            print(f"refused: {exc}")
    finally:
        if ledger is not None:
            ledger.close()


if __name__ == "__main__":
    main(sys.argv[1:])
