"""The kvpool operator: kopf handlers that observe, plan (kvpool.domain), apply (adapters).

See :mod:`kvpool.controller.main` for the ``kvpool operator`` command and
:mod:`kvpool.controller.state` for what the work shares, :mod:`kvpool.controller.wiring`
for the queues and what each runs (the composition root),
:mod:`kvpool.controller.pool` for the per-pool reconcile, :mod:`kvpool.controller.publisher`
for the namespace config and :mod:`kvpool.controller.side_statuses` for policy and budget
statuses.
"""
