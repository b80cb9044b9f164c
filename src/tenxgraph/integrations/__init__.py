"""Integrations with other agent frameworks. Each lives in a subpackage of its own, imports its third-party
package lazily, and names the extra that installs it when it is missing: ``tenxgraph.integrations.langgraph``
(``pip install 'tenxgraph[langgraph]'``). They call the ledger component; none keeps a copy of it."""
