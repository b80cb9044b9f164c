"""The crash points of each framework's app, by name (the points themselves are declared in
:data:`tenxgraph.core.crashpoints.POINTS`): what a marked test's cells are expanded over
(``@pytest.mark.crash_matrix(framework=...)``)."""

#: The points of pauses for a person: a test reaches them only where its agent pauses, so they join a test's
#: cells where it uses the ``approvals`` fixture (the person the harness plays).
APPROVAL_POINTS = ("approval.after_pause", "approval.after_decision")
#: The points of a LangGraph app (``@pytest.mark.crash_matrix(framework="langgraph")``): LangGraph's step
#: boundaries, and those around each tool call that a LangGraph tool node reaches (the watcher of a bare
#: ``ToolNode`` fires ``tool.before_invoke`` and ``tool.after_return``; ``ReplaySafeToolNode`` all of them).
LANGGRAPH_POINTS = (
    "tool.before_invoke",
    "tool.in_flight",
    "tool.after_return",
    "tool.after_record",
    "langgraph.after_put_writes",
    "langgraph.before_put",
    "langgraph.after_put",
    "langgraph.late_put_writes",
)
#: The points of a Pydantic AI agent (``@pytest.mark.crash_matrix(framework="pydantic_ai")``): its model's
#: responses, those around each tool call (``LedgerDurability`` reaches all of them; the harness's watch of a
#: bare agent's calls fires ``tool.before_invoke`` and ``tool.after_return``), and, where a test has the
#: ``approvals`` fixture, its pauses (``resume_once`` records an answer before the run that takes it).
PYDANTIC_AI_POINTS = (
    "pydantic_ai.after_model_response",
    "pydantic_ai.after_model_record",
    "tool.before_invoke",
    "tool.in_flight",
    "tool.after_return",
    "tool.after_record",
    *APPROVAL_POINTS,
)

#: The points of a plain agent loop (``@pytest.mark.crash_matrix(framework="loop")``): those around each tool call
#: the public ledger entry reaches (a loop's model turns are its own code, with no point of ours in them).
LOOP_POINTS = ("tool.before_invoke", "tool.in_flight", "tool.after_return", "tool.after_record")
#: The points of an OpenAI Agents SDK agent (``framework="openai_agents"``): its model's responses, journaled by
#: ``replay_safe`` (a bare agent has no journal), and those around each tool call (the harness's watch of a bare
#: agent's calls fires ``tool.before_invoke`` and ``tool.after_return``) and, where a test has the ``approvals``
#: fixture, its pauses (``run_replay_safe`` records a ``RunState``'s answers before the run that takes them).
OPENAI_AGENTS_POINTS = (
    "openai_agents.after_model_response",
    "openai_agents.after_model_record",
    *LOOP_POINTS,
    *APPROVAL_POINTS,
)
#: Framework name -> its points (our runtime's are every other point).
FRAMEWORK_POINTS = {
    "langgraph": LANGGRAPH_POINTS,
    "pydantic_ai": PYDANTIC_AI_POINTS,
    "loop": LOOP_POINTS,
    "openai_agents": OPENAI_AGENTS_POINTS,
}
#: The names of other frameworks' own points begin with one of these.
FOREIGN_PREFIXES = ("langgraph.", "pydantic_ai.", "openai_agents.")
