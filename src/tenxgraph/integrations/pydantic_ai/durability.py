""":class:`LedgerDurability`: a Pydantic AI agent durable on the ledger, as an engine of Pydantic AI's own
durability API (``pydantic_ai.durable_exec.BaseDurabilityCapability``, the base of its Temporal, DBOS and
Prefect engines), with no server to run: the records live in the ledger's store (``InMemoryCheckpointer``,
``SqliteCheckpointer``, ``PgCheckpointer``).

The durable container is the run (``agent.run``, ``run_sync``, ``run_stream``, ``iter``): every run of the agent
is journaled in its conversation's thread of the ledger (its model turns under its ``run_id``); run it again with
the same ``run_id`` (and the same prompt) to resume it after a crash, from any process. The durable units
(:mod:`.backend`): each model request, journaled; each tool call, through the ledger."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from pydantic_ai.capabilities.abstract import ValidatedToolArgs, WrapRunHandler
from pydantic_ai.durable_exec import (
    JSON_CODEC,
    BaseDurabilityCapability,
    DurabilityEngineSpec,
    DurableOperationBackend,
    RoleBasedOperationConfig,
    conversation_id_from_run_id,
)
from pydantic_ai.messages import ModelResponse, ToolCallPart
from pydantic_ai.models import Model, ModelRequestContext
from pydantic_ai.run import AgentRunResult
from pydantic_ai.tools import AgentDepsT, RunContext, ToolDefinition

from tenxgraph.integrations.pydantic_ai.backend import (
    LedgerBackend,
    ToolPolicy,
    conversation_of,
    run_id_of,
    thread_of,
)
from tenxgraph.integrations.pydantic_ai.home_loop import HomeLoopLedger
from tenxgraph.ledger import (
    CallGroups,
    Effect,
    LedgerStore,
    Reconcile,
    check_policy,
    current_idempotency_key,
    effect_from_hints,
    transaction_view,
    waiting_lock,
)
from tenxgraph.ledger import current_transaction as _current_transaction
from tenxgraph.utils.constants import TOOL_TIMEOUT
from tenxgraph.utils.errors import ConfigError

__all__ = ["LedgerDurability", "current_idempotency_key", "current_transaction"]


def current_transaction() -> Any:
    """In the body of a tool declared ``effect="transactional"``: the transaction its writes go through, which
    commits with the call's ledger record (a crash before the commit leaves neither; the resumed call writes
    once). On ``SqliteCheckpointer``: the ``sqlite3.Connection``. On ``PgCheckpointer``: in an ``async def``
    tool, a :class:`~tenxgraph.ledger.LoopTransaction` (``await tx.execute(query, params)``, as on psycopg's
    ``AsyncConnection``, whose loop is the ledger's); in a plain function, a
    :class:`~tenxgraph.ledger.BlockingTransaction` (``tx.execute(query, params).fetchone()``). A
    ``RuntimeError`` elsewhere."""
    found = _current_transaction()
    if found is None:
        raise RuntimeError(
            "current_transaction(): no transaction here. It is open only in the body of a tool declared "
            "effect='transactional' (LedgerDurability(effects={name: 'transactional'}) or the tool's metadata), "
            "run by an agent with LedgerDurability on a SqliteCheckpointer or PgCheckpointer ledger"
        )
    return transaction_view(found)


@dataclass(init=False, kw_only=True)
class LedgerDurability(BaseDurabilityCapability[AgentDepsT]):
    """``Agent(model, name="support", capabilities=[LedgerDurability(ledger)])``: every run journaled in *ledger*
    (``SqliteCheckpointer(path)``, ``PgCheckpointer(...)``, ``InMemoryCheckpointer()``), in its conversation's
    thread, and resumed by running it again with its ``run_id``.
    *effects*, *on_in_doubt*, *reconcile*: per tool name, as ``@tool(...)`` takes them (a tool's ``metadata``
    may say them too: ``@agent.tool_plain(metadata={"effect": "read"})``). *name*: the agent's, if not given
    (a durable agent needs one: it names the run's records). *models*: as Pydantic AI's other engines take it."""

    engine_spec = DurabilityEngineSpec(
        engine_name="tenxgraph",
        durable_unit_noun="ledger record",
        durable_container_noun="durable run",
        codec=JSON_CODEC,  # (the ledger's stores keep JSON)
        wrapped_toolset_kinds=frozenset({"function", "mcp", "dynamic"}),
        toolset_lifecycles={"function": "enter-always", "mcp": "enter-in-durable-unit", "dynamic": "enter-never"},
        unsupported_runtime_toolset_kinds=frozenset({"function", "mcp", "dynamic"}),
        journal_discovery=False,  # (listing tools has no effect outside the process: it runs again on resume)
        sequential_tools_in_durable_context=False,
    )

    def __init__(
        self,
        ledger: LedgerStore,
        *,
        name: str | None = None,
        models: Mapping[str, Model] | None = None,
        tool_timeout: float | None = TOOL_TIMEOUT,
        effects: Mapping[str, str] | None = None,
        on_in_doubt: Mapping[str, str] | None = None,
        reconcile: Mapping[str, Reconcile] | None = None,
    ) -> None:
        if not isinstance(ledger, LedgerStore):
            raise ConfigError(
                f"LedgerDurability(ledger={ledger!r}): not a tenxgraph ledger store: pass SqliteCheckpointer(path), "
                "PgCheckpointer(...), InMemoryCheckpointer() or a store with tenxgraph.ledger.LedgerStore's methods"
            )
        super().__init__(models=models, name=name)
        self.ledger = ledger
        self.tool_timeout = tool_timeout
        self.effects = dict(effects or {})
        self.on_in_doubt = dict(on_in_doubt or {})
        self.reconcile = dict(reconcile or {})
        for tool_name, said in self.effects.items():
            if str(getattr(said, "value", said)) == Effect.TRANSACTIONAL.value:
                self._check_transactions(tool_name)
        #: How long a process that resumes a run waits while another runs it (then ``ThreadBusyError``).
        self.lock_wait = (tool_timeout or TOOL_TIMEOUT) + 30.0
        self._home = HomeLoopLedger(ledger)
        self._groups = CallGroups()
        self._backend: LedgerBackend | None = None

    @property
    def in_durable_context(self) -> bool:
        """Every run of an agent with this capability is durable: its container is the run itself (no workflow
        of an engine around it), keyed by its ``run_id``."""
        return True

    def get_default_conversation_id(self, run_id: str) -> str | None:
        """A run that starts a conversation: its id derived from the ``run_id`` (as Pydantic AI's other engines
        do), so that a resume of the run finds the conversation's records."""
        return conversation_id_from_run_id(run_id)

    async def wrap_run(self, ctx: RunContext[AgentDepsT], *, handler: WrapRunHandler) -> AgentRunResult[Any]:
        """The run under its conversation's lock (the store's run lock: k processes that resume one run, or
        answer one deferred call, at once take it in turn; each later one replays what the first recorded)."""
        thread = thread_of(self.name, conversation_of(ctx))
        store = self._home if hasattr(self.ledger, "arun_lock") else self.ledger  # (none: waiting_lock warns)
        async with waiting_lock(store, thread, thread, self.lock_wait, "one Pydantic AI conversation"):
            try:
                return await super().wrap_run(ctx, handler=handler)
            finally:
                backend = self._ledger_backend()
                backend.latest.pop(run_id_of(ctx), None)
                for step in [key for key in backend.coming if key[0] == run_id_of(ctx)]:
                    del backend.coming[step]

    async def after_model_request(
        self, ctx: RunContext[AgentDepsT], *, request_context: ModelRequestContext, response: ModelResponse
    ) -> ModelResponse:
        """Each model response (journaled, or replayed from the journal), kept as the run's latest: the calls of
        a streamed response that ends the run run before it joins the run's history."""
        response = await super().after_model_request(ctx, request_context=request_context, response=response)
        self._ledger_backend().latest[run_id_of(ctx)] = response
        return response

    async def after_tool_validate(
        self, ctx: RunContext[AgentDepsT], *, call: ToolCallPart, tool_def: ToolDefinition, args: ValidatedToolArgs
    ) -> ValidatedToolArgs:
        """Each call the step runs (Pydantic AI validates them all before it runs any; a call it defers for an
        approval not given, or skips, does not run): under a test harness's completion order, the siblings that
        take turns. A tool that runs alone (``sequential``) runs after its siblings: no order for the step."""
        args = await super().after_tool_validate(ctx, call=call, tool_def=tool_def, args=args)
        if tool_def.defer and not ctx.tool_call_approved:
            return args
        coming = self._ledger_backend().coming
        key = (run_id_of(ctx), ctx.run_step)
        manager = ctx.tool_manager
        alone = manager is not None and (
            manager.get_parallel_execution_mode() == "sequential" or manager.is_sequential(call)
        )
        step = coming.setdefault(key, [])
        if alone or step is None:
            coming[key] = None
        else:
            step.append(call.tool_call_id)
        return args

    def get_durable_operation_backend(self) -> DurableOperationBackend[Any]:
        return self._ledger_backend()

    def _ledger_backend(self) -> LedgerBackend:
        if self._backend is None or self._backend.agent_name != self.name:
            none: RoleBasedOperationConfig[None] = RoleBasedOperationConfig(
                model=None, event=None, capability=None, tool=None
            )
            self._backend = LedgerBackend(
                agent_name=self.name,
                ledger=self._home,
                tool_timeout=self.tool_timeout,
                policy_of=self.policy_of,
                groups=self._groups,
                config=none,
            )
        return self._backend

    def policy_of(self, tool_name: str, metadata: Mapping[str, Any]) -> ToolPolicy:
        """A tool's in-doubt policy, reconcile function and effect class, given to the constructor or in its
        ``metadata`` (or the MCP annotations an MCP toolset puts there), checked as ``@tool(...)`` checks them."""
        policy = self.on_in_doubt.get(tool_name, metadata.get("on_in_doubt"))
        reconcile = self.reconcile.get(tool_name, metadata.get("reconcile"))
        declared = self.effects.get(tool_name, metadata.get("effect"))
        try:
            hints = metadata.get("annotations") or metadata  # (an MCP toolset's tool: its annotations there)
            effect = check_policy(policy, reconcile, declared if declared is not None else effect_from_hints(hints))
        except (TypeError, ValueError) as exc:
            raise ConfigError(f"Pydantic AI tool {tool_name!r}: {exc}") from None
        if effect is Effect.TRANSACTIONAL:
            self._check_transactions(tool_name)
        return ToolPolicy(policy, reconcile, effect)

    def _check_transactions(self, tool_name: str) -> None:
        if getattr(self.ledger, "transactions", None) not in ("sync", "async"):
            raise ConfigError(
                f"Pydantic AI tool {tool_name!r}: effect='transactional' writes in the ledger's own transaction, "
                f"which the {type(self.ledger).__name__} ledger does not run: use SqliteCheckpointer or "
                "PgCheckpointer, or declare the tool 'external' (with current_idempotency_key()) or 'idempotent'"
            )
