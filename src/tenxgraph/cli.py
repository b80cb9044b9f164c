"""``python -m tenxgraph.cli``: the command line, kept at its old address. It lives in :mod:`tenxgraph.server.cli`."""

from tenxgraph.server.cli import app_from_env, main

__all__ = ["app_from_env", "main"]

if __name__ == "__main__":
    main()
