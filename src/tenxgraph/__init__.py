"""10xgraph: an agent-graph runtime whose tool calls are replay-safe."""

from tenxgraph.core import crashpoints as _crashpoints
from tenxgraph.core.graph import (
    END,
    CompiledGraph,
    RunResult,
    StateGraph,
    StreamEvent,
    Tool,
    ToolNode,
    ToolOutput,
)
from tenxgraph.core.graph.results import InDoubt
from tenxgraph.core.tools.context import ToolContext, current_tool_call, interrupt
from tenxgraph.core.tools.interrupts import GraphInterrupt, Interrupt, Resume
from tenxgraph.core.tools.tool import tool
from tenxgraph.models import Reply, ScriptedModel
from tenxgraph.prebuilt import ReactAgent
from tenxgraph.state import AgentState, Message, TextBlock, ToolCallBlock, ToolResultBlock
from tenxgraph.storage.checkpointer import BaseCheckpointer, InMemoryCheckpointer
from tenxgraph.utils.errors import (
    ConfigError,
    GraphRecursionError,
    IntentWriteError,
    InterruptDecidedError,
    LedgerReadError,
    NodeTimeoutError,
    RunLockLostError,
    StaleStateError,
    StorageConnectionError,
    TenxGraphError,
    ThreadBusyError,
    ToolTimeoutError,
)

__version__ = "0.1.0"

__all__ = [
    "END",
    "AgentState",
    "BaseCheckpointer",
    "CompiledGraph",
    "ConfigError",
    "GraphInterrupt",
    "GraphRecursionError",
    "InDoubt",
    "InMemoryCheckpointer",
    "IntentWriteError",
    "Interrupt",
    "InterruptDecidedError",
    "LedgerReadError",
    "Message",
    "NodeTimeoutError",
    "ReactAgent",
    "Reply",
    "Resume",
    "RunLockLostError",
    "RunResult",
    "ScriptedModel",
    "StaleStateError",
    "StateGraph",
    "StorageConnectionError",
    "StreamEvent",
    "TenxGraphError",
    "TextBlock",
    "ThreadBusyError",
    "Tool",
    "ToolCallBlock",
    "ToolContext",
    "ToolNode",
    "ToolOutput",
    "ToolResultBlock",
    "ToolTimeoutError",
    "current_tool_call",
    "interrupt",
    "tool",
]

# A child process started by the crash harness arms its point from TENXGRAPH_CRASH_AT.
_crashpoints.arm_from_env()
