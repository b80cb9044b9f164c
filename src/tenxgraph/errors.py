"""The public home of the runtime's errors (``from tenxgraph.errors import ThreadBusyError``). They are defined in
:mod:`tenxgraph.utils.errors`, the bottom layer, so that every layer may raise them without importing the front
door's package."""

from tenxgraph.utils.errors import *  # noqa: F403
from tenxgraph.utils.errors import __all__ as __all__
