"""End-to-end checks of kvpool: the local demo harness (``python -m e2e.local_demo``) and the
kind-based scaffold for a real cluster (``e2e/kind/``)."""
