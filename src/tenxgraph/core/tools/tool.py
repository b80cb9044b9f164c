"""Plain functions as tools: a JSON schema from the signature, type hints and docstring; argument checks."""

from __future__ import annotations

import dataclasses
import inspect
import json
import re
import typing
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, overload

from tenxgraph.core.tools.context import ToolCallInfo
from tenxgraph.core.tools.effects import Effect
from tenxgraph.core.tools.interrupts import ApprovalRule
from tenxgraph.core.tools.schema import docstring_parts, json_schema_for, matches
from tenxgraph.state.messages import JSON


class ToolArgumentError(ValueError):
    """Arguments a model sent for a tool do not fit its signature. The message is meant for the model."""


@dataclass(frozen=True, slots=True)
class ToolOutput:
    """Return this from a tool to update graph state besides answering the model::

    return ToolOutput("refunded 20.00", update={"refunded_total": 20.0})
    """

    content: JSON
    update: dict[str, JSON] | None = None
    is_error: bool = False


def _is_context(hint: Any) -> bool:
    return hint is ToolCallInfo


@overload
def tool(
    fn: Callable[..., Any],
    *,
    name: str | None = None,
    description: str | None = None,
    on_in_doubt: str | None = None,
    reconcile: Reconcile | None = None,
    effect: Effect | str | None = None,
    approval: ApprovalRule = False,
) -> Tool: ...


@overload
def tool(
    fn: None = None,
    *,
    name: str | None = None,
    description: str | None = None,
    on_in_doubt: str | None = None,
    reconcile: Reconcile | None = None,
    effect: Effect | str | None = None,
    approval: ApprovalRule = False,
) -> Callable[[Callable[..., Any]], Tool]: ...


def tool(
    fn: Callable[..., Any] | None = None,
    *,
    name: str | None = None,
    description: str | None = None,
    on_in_doubt: str | None = None,
    reconcile: Reconcile | None = None,
    effect: Effect | str | None = None,
    approval: ApprovalRule = False,
) -> Tool | Callable[[Callable[..., Any]], Tool]:
    """Make a function a :class:`Tool` (plain functions keep working without it)::

        @tool(on_in_doubt="reconcile", reconcile=lambda key, args: payments.find(key))
        def refund_order(order_id: str, amount: float, idempotency_key: str) -> str: ...

    ``on_in_doubt`` decides what a resumed run does when the ledger shows the call *started* but never recorded a
    result (the process died while it ran, or between its return and its record):

    - ``"retry"``: run it again (with the same idempotency key), logging that it was in doubt;
    - ``"fail"``: do not run it; the model gets an error result with status ``in_doubt`` and an event is logged;
    - ``"reconcile"``: ``reconcile(idempotency_key, args)`` asks the provider; a result is recorded and used
      without running the tool, ``None`` means it did not happen, so the tool runs;
    - ``"off"``: no in-doubt detection, even when the graph is compiled with a default (``compile(on_in_doubt=)``).

    Such tools write an intent record before running (one extra ledger write per call).

    ``effect`` says what kind of effect the tool has (see :data:`EFFECTS`), and so what a re-run means:

    - ``"read"``: none; it may simply run again. No ledger record (no write, no commit), no intent, and a re-run
      after a crash is no gap;
    - ``"idempotent"``: it runs again with the same ``idempotency_key`` (a parameter it must declare), which the
      provider honours; no intent (a re-run is safe), whatever the graph's in-doubt default;
    - ``"external"``: an effect outside that cannot simply run again: in-doubt detection is always on, with
      ``on_in_doubt``, else the graph's default, else ``"fail"``;
    - ``"transactional"``: its effect is a write to the checkpointer's own database, made through the parameter
      ``tx`` (the connection, inside the ledger's transaction): the writes and the ledger record commit together,
      and a crash or an exception rolls both back, so the effect happens exactly once. On SQLite the tool is a
      plain function getting a ``sqlite3.Connection`` (it runs in a worker thread, inside ``BEGIN IMMEDIATE``); on
      PostgreSQL an ``async def`` getting a ``psycopg.AsyncConnection``. A checkpointer that cannot do it, or a
      tool of the other kind, is an error when the graph is compiled.

    ``approval`` makes a person say yes first: ``True`` for every call, or a predicate on the call's arguments
    (``approval=lambda args: args["amount"] > 100``). A call that needs it does not run: the run pauses (status
    ``interrupted``, ``result.interrupts``) until ``Resume({id: True | False | "reason"})`` answers. An approved
    call runs once; a rejected one never (the model is told, and that answer is recorded). See docs/approvals.md.
    """

    def make(f: Callable[..., Any]) -> Tool:
        made = Tool.from_function(f, name, description, on_in_doubt, reconcile, effect)
        return dataclasses.replace(made, approval=check_approval(made.name, approval))

    return make(fn) if fn is not None else make


IN_DOUBT_POLICIES = ("retry", "fail", "reconcile")
#: A tool's ``on_in_doubt`` that keeps it out of a graph-wide default (``compile(on_in_doubt=...)``).
IN_DOUBT_OFF = "off"
#: What a tool's ``effect=`` may say (see :func:`tool` and :class:`Effect`).
EFFECTS = tuple(e.value for e in Effect)
#: The parameter a transactional tool declares to receive the ledger's open transaction (its connection).
TX_PARAM = "tx"
IDEMPOTENCY_PARAM = "idempotency_key"
Reconcile = Callable[[str, dict[str, JSON]], Any]
"""``reconcile(idempotency_key, args)``: the call's result if it did happen (asked of the provider), else None."""


def check_approval(name: str, approval: object) -> ApprovalRule:
    """``approval=`` checked: a bool or a predicate on the arguments."""
    if isinstance(approval, bool) or callable(approval):
        return approval
    raise TypeError(
        f"tool {name!r}: approval={approval!r} is invalid; use True, False, or a predicate on the call's "
        "arguments (approval=lambda args: args['amount'] > 100)"
    )


def check_policy(on_in_doubt: str | None, reconcile: Reconcile | None, effect: Effect | str | None) -> Effect | None:
    """A tool's in-doubt policy and effect class checked together (a clear error for a bad pair); its effect."""
    if on_in_doubt is not None and on_in_doubt not in (*IN_DOUBT_POLICIES, IN_DOUBT_OFF):
        raise ValueError(
            f"on_in_doubt={on_in_doubt!r} is invalid; use one of {', '.join(IN_DOUBT_POLICIES)}, or "
            f"{IN_DOUBT_OFF!r} (no in-doubt detection, whatever the graph's default)"
        )
    if (on_in_doubt == "reconcile") != (reconcile is not None):
        raise ValueError("on_in_doubt='reconcile' needs reconcile=callable(idempotency_key, args), and only it")
    effect_class = Effect.parse(effect)
    effect = effect_class.value if effect_class is not None else None
    if effect_class is not None and effect_class.may_run_again and on_in_doubt not in (None, IN_DOUBT_OFF):
        raise ValueError(
            f"effect={effect!r} with on_in_doubt={on_in_doubt!r}: a {effect} tool may simply run again, so it "
            "has nothing to be in doubt about; drop on_in_doubt, or say effect='external'"
        )
    if effect_class is Effect.EXTERNAL and on_in_doubt == IN_DOUBT_OFF:
        raise ValueError("effect='external' with on_in_doubt='off': an external effect is always watched")
    if reconcile is not None and not callable(reconcile):
        raise TypeError(f"reconcile must be callable, got {reconcile!r}")
    return effect_class


@dataclass(slots=True)
class Tool:
    """A callable the model can ask for, with its JSON schema.

    ``injected`` maps parameters the runtime fills in (never shown to the model) to what they receive:
    ``"idempotency_key"`` (a parameter named ``idempotency_key``) or ``"context"`` (a ``ToolContext`` parameter).
    ``on_in_doubt`` opts into in-doubt detection (see :func:`tool`).
    """

    name: str
    description: str
    fn: Callable[..., Any]
    parameters: dict[str, JSON] = field(default_factory=dict)
    is_async: bool = False
    injected: dict[str, str] = field(default_factory=dict)
    on_in_doubt: str | None = None
    reconcile: Reconcile | None = None
    effect: Effect | None = None
    #: Whether a call needs a person's approval before it runs: always, never, or by its arguments.
    approval: ApprovalRule = False
    #: Checks arguments against a schema the runtime did not make (an MCP server's): the problems, in words a
    #: model can act on (None: the built-in checks of the schemas :meth:`from_function` makes).
    validate: Callable[[dict[str, JSON]], list[str]] | None = None

    @classmethod
    def from_function(
        cls,
        fn: Callable[..., Any],
        name: str | None = None,
        description: str | None = None,
        on_in_doubt: str | None = None,
        reconcile: Reconcile | None = None,
        effect: Effect | str | None = None,
    ) -> Tool:
        effect_class = check_policy(on_in_doubt, reconcile, effect)
        if not callable(fn):
            raise TypeError(f"a tool must be a function, got {fn!r}")
        tool_name = name or getattr(fn, "__name__", None)
        if not tool_name or not re.fullmatch(r"[A-Za-z0-9_-]{1,64}", tool_name):
            raise ValueError(f"tool name {tool_name!r} must be 1-64 letters, digits, '_' or '-'")
        summary, param_docs = docstring_parts(inspect.getdoc(fn) or "")
        try:
            hints = typing.get_type_hints(fn)
        except Exception as exc:
            raise TypeError(f"tool {tool_name!r}: cannot resolve its type hints: {exc}") from exc
        properties: dict[str, JSON] = {}
        required: list[str] = []
        injected: dict[str, str] = {}
        for param in inspect.signature(fn).parameters.values():
            if param.kind in (param.VAR_POSITIONAL, param.VAR_KEYWORD):
                raise TypeError(f"tool {tool_name!r}: *args/**kwargs cannot be described to a model; name them")
            hint = hints.get(param.name, Any)
            if _is_context(hint):
                injected[param.name] = "context"
                continue
            if param.name == TX_PARAM and effect_class is Effect.TRANSACTIONAL:
                injected[param.name] = "transaction"
                continue
            if param.name == IDEMPOTENCY_PARAM:
                if hint not in (str, Any):
                    raise TypeError(f"tool {tool_name!r}: parameter idempotency_key is injected and must be a str")
                injected[param.name] = "idempotency_key"
                continue
            try:
                schema = json_schema_for(hint)
            except TypeError as exc:
                raise TypeError(f"tool {tool_name!r}, parameter {param.name!r}: {exc}") from None
            if param.name in param_docs:
                schema["description"] = param_docs[param.name]
            if param.default is param.empty:
                required.append(param.name)
            else:
                schema["default"] = param.default
            properties[param.name] = schema
        parameters: dict[str, JSON] = {
            "type": "object",
            "properties": properties,
            "additionalProperties": False,
        }
        if required:
            parameters["required"] = required
        if effect_class is Effect.TRANSACTIONAL and TX_PARAM not in injected:
            raise TypeError(
                f"tool {tool_name!r}: effect='transactional' makes its writes through the ledger's transaction: "
                f"declare a parameter {TX_PARAM} (the database connection inside it)"
            )
        if effect_class is Effect.IDEMPOTENT and IDEMPOTENCY_PARAM not in injected:
            raise TypeError(
                f"tool {tool_name!r}: effect='idempotent' runs again with the same key; declare a parameter "
                f"{IDEMPOTENCY_PARAM}: str and pass it to the provider"
            )
        return cls(
            name=tool_name,
            description=description if description is not None else summary,
            fn=fn,
            parameters=parameters,
            is_async=inspect.iscoroutinefunction(fn),
            injected=injected,
            on_in_doubt=on_in_doubt,
            reconcile=reconcile,
            effect=effect_class,
        )

    def injected_args(self, info: ToolCallInfo) -> dict[str, Any]:
        """The values of the parameters the runtime fills in (the transaction's connection aside)."""
        return {p: info if kind == "context" else info.idempotency_key for p, kind in self.injected.items()
                if kind != "transaction"}  # fmt: skip

    @property
    def policy(self) -> str | None:
        """The in-doubt policy in force (None: no in-doubt detection, no intent record)."""
        if (self.effect is not None and self.effect.may_run_again) or self.on_in_doubt == IN_DOUBT_OFF:
            return None
        return self.on_in_doubt or ("fail" if self.effect is Effect.EXTERNAL else None)

    def needs_approval(self, args: dict[str, JSON]) -> bool:
        """Whether a call with *args* must be approved before it runs (a predicate that raises stops the node:
        the thread stays resumable, and nothing ran)."""
        if isinstance(self.approval, bool):
            return self.approval
        return bool(self.approval(dict(args)))

    @property
    def recorded(self) -> bool:
        """Whether its calls are recorded in the ledger (a ``read`` tool's are not: it may simply run again)."""
        return self.effect is not Effect.READ

    def with_default_policy(self, policy: str | None) -> Tool:
        """This tool under a graph-wide default: its own ``on_in_doubt`` (``"off"`` included) or effect class
        (``read`` and ``idempotent`` need none) if it says one."""
        if self.on_in_doubt is not None or policy is None or (self.effect is not None and self.effect.may_run_again):
            return self
        return dataclasses.replace(self, on_in_doubt=policy)

    def schema(self) -> dict[str, JSON]:
        """What a model is shown: name, description and JSON-schema parameters."""
        return {"name": self.name, "description": self.description, "parameters": self.parameters}

    def parse_args(self, raw: dict[str, JSON] | str) -> dict[str, JSON]:
        """Decode and check arguments; :class:`ToolArgumentError` says what is wrong in words a model can act on."""
        if isinstance(raw, str):
            try:
                raw = json.loads(raw) if raw.strip() else {}
            except json.JSONDecodeError as exc:
                raise ToolArgumentError(
                    f"arguments for {self.name} are not valid JSON ({exc}); send a JSON object"
                ) from None
        if not isinstance(raw, dict):
            raise ToolArgumentError(f"arguments for {self.name} must be a JSON object, got {type(raw).__name__}")
        props: dict[str, dict[str, JSON]] = self.parameters.get("properties", {})
        problems: list[str] = []
        missing = [p for p in self.parameters.get("required", []) if p not in raw]
        if missing:
            problems.append(f"missing required argument(s) {', '.join(missing)}")
        extra = [a for a in raw if a not in props]
        if extra:
            problems.append(f"unknown argument(s) {', '.join(extra)} (accepted: {', '.join(props) or 'none'})")
        if self.validate is not None:  # a schema from elsewhere (an MCP server): a JSON Schema library's verdict
            problems += self.validate(raw)
        else:
            for arg, value in raw.items():
                schema = props.get(arg)
                if schema is not None and not matches(value, schema):
                    expected = (schema.get("type") or schema.get("enum") if isinstance(schema, dict) else None) or (
                        "see schema"
                    )
                    problems.append(f"argument {arg} should be {expected}, got {json.dumps(value)}")
        if problems:
            raise ToolArgumentError(f"invalid call to {self.name}: " + "; ".join(problems))
        return raw
