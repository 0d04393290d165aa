"""The kvpool operator: kopf handlers that observe, plan (kvpool.domain), apply (adapters).

See :mod:`kvpool.controller.main` for the ``kvpool operator`` command and
:mod:`kvpool.controller.reconcile` for the per-pool reconcile.
"""
