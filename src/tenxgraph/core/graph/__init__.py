"""Graphs: StateGraph, CompiledGraph, ToolNode and tools."""

from tenxgraph.core.graph.compiled import CompiledGraph, RunResult, StreamEvent
from tenxgraph.core.graph.state_graph import StateGraph
from tenxgraph.core.graph.tool_node import ToolNode
from tenxgraph.core.tools.config import RunConfig
from tenxgraph.core.tools.context import RunContext, current_run
from tenxgraph.core.tools.tool import Tool, ToolArgumentError, ToolOutput
from tenxgraph.utils.constants import END, START

__all__ = [
    "END",
    "START",
    "CompiledGraph",
    "RunConfig",
    "RunContext",
    "RunResult",
    "StateGraph",
    "StreamEvent",
    "Tool",
    "ToolArgumentError",
    "ToolNode",
    "ToolOutput",
    "current_run",
]
