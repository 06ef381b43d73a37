"""Subcommands of the ``graphwire`` CLI, one module each (imported lazily)."""
