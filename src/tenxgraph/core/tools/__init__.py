"""Tools and what they see: :class:`Tool` and ``@tool`` (``tool.py``), effect classes (``effects.py``), the run's
configuration (``config.py``) and context (``context.py``). Below the ledger, which runs them, and the graph."""
