"""Capacity leases in Redis (see :mod:`kvpool.adapters.lease.store`)."""
