"""StateGraph: nodes, edges and conditional edges; ``compile()`` checks it and returns a CompiledGraph."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any, Generic, TypeVar

from tenxgraph.core.graph.compiled import CompiledGraph
from tenxgraph.core.graph.graph_spec import ConditionalEdge, NodeFn
from tenxgraph.state.state import AgentState
from tenxgraph.storage.checkpointer.base import BaseCheckpointer
from tenxgraph.utils.constants import END
from tenxgraph.utils.errors import GraphBuildError

S = TypeVar("S", bound=AgentState)


class StateGraph(Generic[S]):
    def __init__(self, state_schema: type[S] = AgentState) -> None:  # type: ignore[assignment]
        if not (isinstance(state_schema, type) and issubclass(state_schema, AgentState)):
            raise GraphBuildError(f"state_schema must be AgentState or a subclass of it, got {state_schema!r}")
        self.state_schema = state_schema
        self.nodes: dict[str, NodeFn] = {}
        self.edges: dict[str, str] = {}
        self.conditional: dict[str, ConditionalEdge] = {}
        self.entry_point: str | None = None

    def add_node(self, name: str, fn: NodeFn) -> StateGraph[S]:
        if not isinstance(name, str) or not name or name.startswith("__"):
            raise GraphBuildError(f"node name {name!r} must be a non-empty string not starting with '__'")
        if name in self.nodes:
            raise GraphBuildError(f"node {name!r} is added twice")
        if not callable(fn):
            raise GraphBuildError(f"node {name!r} must be callable, got {fn!r}")
        self.nodes[name] = fn
        return self

    def _check_source(self, source: str) -> None:
        if source in self.edges or source in self.conditional:
            raise GraphBuildError(f"node {source!r} already has an outgoing edge; a node has exactly one")

    def add_edge(self, source: str, target: str) -> StateGraph[S]:
        self._check_source(source)
        self.edges[source] = target
        return self

    def add_conditional_edges(
        self, source: str, path: Callable[[Any], str], path_map: Mapping[str, str] | None = None
    ) -> StateGraph[S]:
        """After *source*, go to ``path(state)`` (or ``path_map[path(state)]``); ``END`` finishes the run."""
        self._check_source(source)
        self.conditional[source] = ConditionalEdge(path, dict(path_map) if path_map else None)
        return self

    def set_entry_point(self, name: str) -> StateGraph[S]:
        self.entry_point = name
        return self

    def validate(self) -> None:
        if self.entry_point is None:
            raise GraphBuildError("the graph has no entry point; call set_entry_point(name)")
        known = set(self.nodes) | {END}
        if self.entry_point not in self.nodes:
            raise GraphBuildError(f"entry point {self.entry_point!r} is not a node; nodes: {sorted(self.nodes)}")
        for source, target in self.edges.items():
            for name in (source, target):
                if name not in known:
                    raise GraphBuildError(f"edge {source!r} -> {target!r} names unknown node {name!r}")
        for source, cond in self.conditional.items():
            if source not in self.nodes:
                raise GraphBuildError(f"conditional edge from unknown node {source!r}")
            for target in cond.targets():
                if target not in known:
                    raise GraphBuildError(f"conditional edge from {source!r} maps to unknown node {target!r}")
        for name in self.nodes:
            if name not in self.edges and name not in self.conditional:
                raise GraphBuildError(
                    f"node {name!r} has no outgoing edge; add add_edge({name!r}, END) to finish there"
                )

    def compile(
        self, checkpointer: BaseCheckpointer | None = None, *, on_in_doubt: str | None = None
    ) -> CompiledGraph[S]:
        """Check the graph and bind it to *checkpointer* (an InMemoryCheckpointer when None). *on_in_doubt*
        (``"retry"`` or ``"fail"``): the in-doubt policy of every tool that does not say its own (see
        :func:`tenxgraph.tool`); a tool opts out with ``on_in_doubt="off"``."""
        self.validate()
        return CompiledGraph(self, checkpointer, on_in_doubt=on_in_doubt)
