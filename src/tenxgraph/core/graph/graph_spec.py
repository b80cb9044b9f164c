"""What a graph is made of, as the run loop needs it: nodes, edges, conditional edges and an entry point.

:class:`~tenxgraph.core.graph.state_graph.StateGraph` builds one; :class:`~tenxgraph.core.graph.compiled.CompiledGraph`
runs one. Both import this module, and neither imports the other's internals the other way round."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, Protocol, TypeVar

from tenxgraph.state.state import AgentState

S_co = TypeVar("S_co", bound=AgentState, covariant=True)
NodeFn = Callable[[Any], Any]
"""A node: ``(state) -> dict | None`` (sync or async). The dict updates state; ``messages`` are appended."""


@dataclass(frozen=True, slots=True)
class ConditionalEdge:
    path: Callable[[Any], str]
    path_map: Mapping[str, str] | None

    def targets(self) -> list[str]:
        return list(self.path_map.values()) if self.path_map else []


class GraphSpec(Protocol[S_co]):
    @property
    def state_schema(self) -> type[S_co]: ...

    @property
    def nodes(self) -> Mapping[str, NodeFn]: ...

    @property
    def edges(self) -> Mapping[str, str]: ...

    @property
    def conditional(self) -> Mapping[str, ConditionalEdge]: ...

    @property
    def entry_point(self) -> str | None: ...
