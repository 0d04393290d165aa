"""Subcommands of the ``kvpool`` CLI that work on manifests (no cluster needed)."""
