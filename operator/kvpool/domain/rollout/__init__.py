"""Canary rollouts of a ModelPool: pure gate verdicts and the rollout state machine.

See :mod:`kvpool.domain.rollout.gates` (Successful | Failed | Inconclusive with figures),
:mod:`kvpool.domain.rollout.machine` (the one decision per reconcile, with the modules
it names for its parts) and
:mod:`kvpool.domain.rollout.track_plan` (the canary track's own admission plan), and
docs/0006-rollouts.md.
"""
