"""pytest-replaysafe plugin (filled in by the plugin issue)."""
