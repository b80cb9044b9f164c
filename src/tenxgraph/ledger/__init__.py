"""The ledger, public: what an agent loop needs to run its tool calls replay-safe. Our ``ToolNode``, the
LangGraph wrapper and the MCP adapter call it through this entry and nothing else.

One assistant message at a time::

    from tenxgraph.ledger import Tool, invoke_tool_calls
    from tenxgraph.state import Message, ToolCallBlock

    calls = [ToolCallBlock(id="call_1", name="refund_order", args={"order": "A-1"})]
    message = Message.assistant(tool_calls=calls, message_id=stored_id)  # the id a resume sees again
    executions = await invoke_tool_calls(message, {t.name: t for t in tools}, store, thread_id)

Each call's key is the message id + ``tool_call_id`` (:func:`ledger_key`); the store's records are read in one
round trip; a recorded call is answered from its record (``ToolExecution.replayed``), the others run concurrently
and each is recorded as it returns (calls that return together in one group commit). A loop that runs a
message's calls one by one, concurrently (LangGraph's ``ToolNode``), calls :func:`invoke_tool_call` per call,
with the :class:`CallGroup` its siblings share (``CallGroups().join(store, thread_id, message, execution)``:
one ledger read for the calls of one execution of the step, one write for those that return together).

What a tool says, on :class:`Tool`: its :class:`Effect` (``read``, ``idempotent``, ``external``,
``transactional``), its in-doubt policy (``on_in_doubt``: a call that started and left no result, decided on
resume: ``retry``, ``fail`` or ``reconcile`` with a :data:`Reconcile` function), and whether a person approves
it first (``approval``; a call that waits raises :class:`GraphInterrupt`, answered through :class:`Pauses`). In
the tool's body, :func:`current_tool_call` is the call (its ``idempotency_key``: the same on every replay, for
the provider). A transactional tool's writes commit with its record: it takes the transaction as its
``TX_PARAM`` parameter, or, run by a framework that passes it none, reads it with :func:`current_transaction`
inside :func:`in_transaction`, which the integration sets.

Where records live: any :class:`LedgerStore` (``InMemoryCheckpointer``, ``SqliteCheckpointer``,
``PgCheckpointer``, or a store of your own with those six methods). :data:`probe` is the one object through
which a test harness reaches a call outside the ledger's own steps (it does nothing in production).

The four steps themselves read top to bottom in ``tenxgraph/core/graph/utils/invoke_node_handler.py``."""

from tenxgraph.core.graph.utils.call_groups import TURN_PATIENCE_S, CallGroup, CallGroups
from tenxgraph.core.graph.utils.first_answers import record_first_answers
from tenxgraph.core.graph.utils.invoke_node_handler import (
    call_keys,
    invoke_tool_call,
    invoke_tool_calls,
    ledger_key,
)
from tenxgraph.core.graph.utils.ledger_record import ToolExecution, result_message_id
from tenxgraph.core.graph.utils.probe import Probe, probe
from tenxgraph.core.graph.utils.record_batch import RecordBatch
from tenxgraph.core.graph.utils.shared_read import Records, SharedRead
from tenxgraph.core.graph.utils.waiting_lock import waiting_lock
from tenxgraph.core.tools.context import (
    ToolCallInfo,
    Transaction,
    current_idempotency_key,
    current_tool_call,
    current_transaction,
    in_transaction,
)
from tenxgraph.core.tools.effects import Effect, effect_from_hints
from tenxgraph.core.tools.interrupts import GraphInterrupt, Interrupt, Pauses, Resume
from tenxgraph.core.tools.tool import TX_PARAM, Reconcile, Tool, ToolArgumentError, ToolOutput, check_policy
from tenxgraph.core.tools.transaction_views import (
    BlockingCursor,
    BlockingTransaction,
    LoopCursor,
    LoopTransaction,
    statements_done,
    transaction_view,
)
from tenxgraph.storage.ledger_store import LEDGER_METHODS, LedgerStore

__all__ = [
    "LEDGER_METHODS",
    "TURN_PATIENCE_S",
    "TX_PARAM",
    "BlockingCursor",
    "BlockingTransaction",
    "CallGroup",
    "CallGroups",
    "Effect",
    "GraphInterrupt",
    "Interrupt",
    "LedgerStore",
    "LoopCursor",
    "LoopTransaction",
    "Pauses",
    "Probe",
    "Reconcile",
    "RecordBatch",
    "Records",
    "Resume",
    "SharedRead",
    "Tool",
    "ToolArgumentError",
    "ToolCallInfo",
    "ToolExecution",
    "ToolOutput",
    "Transaction",
    "call_keys",
    "check_policy",
    "current_idempotency_key",
    "current_tool_call",
    "current_transaction",
    "effect_from_hints",
    "in_transaction",
    "invoke_tool_call",
    "invoke_tool_calls",
    "ledger_key",
    "probe",
    "record_first_answers",
    "result_message_id",
    "statements_done",
    "transaction_view",
    "waiting_lock",
]
