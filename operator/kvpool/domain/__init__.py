"""Pure decisions of kvpool: capacity planning, admission, budgets, routing, verdicts.

Nothing in this package performs I/O or reads a clock; callers pass observations
and ``now`` in and get explicit verdicts back, so every decision is a table of cases.
"""
