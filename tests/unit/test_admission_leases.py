"""The admission controller under a capacity lease: it starts nothing once its lease ran
out, follows its leased part of a tenant's maxConcurrency, and judges "too large" against
the whole plan, not against the lease (docs/0008-gateway-scale-out.md)."""

from __future__ import annotations

from kvpool.domain.admission import AdmissionController, Admit, Queue, Reject
from tests.builders import AdmissionRequests, CompiledPoolBuilder


def pool(tokens: int = 1000, slots: int = 10) -> CompiledPoolBuilder:
    return CompiledPoolBuilder("p").capacity(tokens, slots).tier("hi", tokens // 2, slots // 2)


def test_nothing_starts_once_the_lease_ran_out_and_a_renewal_starts_what_waits() -> None:
    """Given a lease valid until t=10, when a request arrives at t=11 (the process was
    stopped past its lease), then it waits; when a renewal moves the end on, it starts."""
    compiled = pool().obj()
    controller = AdmissionController(compiled, pool().tiers())
    requests = AdmissionRequests()
    controller.set_admission_until(10.0, now=1.0)
    assert isinstance(controller.offer(requests.make("hi", 100), 9.0), Admit)
    late = requests.make("hi", 100)
    assert isinstance(controller.offer(late, 11.0), Queue)
    assert controller.release("r1", 11.5).admitted == ()  # a release starts nothing either
    wakeups = controller.set_admission_until(20.0, now=12.0)
    assert [a.request_id for a in wakeups.admitted] == [late.request_id]


def test_a_limited_tenant_follows_its_leased_limit() -> None:
    compiled = pool().obj()
    controller = AdmissionController(compiled, pool().tiers())
    requests = AdmissionRequests()
    controller.set_tenant_limits({}, now=0.0)  # leased, but not to this replica yet
    first = requests.make("hi", 10, tenant="acme", max_concurrency=4)
    assert isinstance(controller.offer(first, 1.0), Queue)
    assert isinstance(controller.offer(requests.make("hi", 10, tenant="free"), 1.0), Admit)
    wakeups = controller.set_tenant_limits({"acme": 1}, now=2.0)
    assert [a.request_id for a in wakeups.admitted] == [first.request_id]
    second = requests.make("hi", 10, tenant="acme", max_concurrency=4)
    assert isinstance(controller.offer(second, 3.0), Queue)  # 1 of its 4 is leased here
    assert [a.request_id for a in controller.set_tenant_limits(None, 4.0).admitted] == [
        second.request_id
    ]


def test_too_large_for_the_lease_but_not_for_the_pool_waits() -> None:
    lease = pool(200, 2).obj()
    whole = pool(1000, 10).obj()
    big = AdmissionRequests().make("hi", 600)
    refused = AdmissionController(lease, pool().tiers()).offer(big, 1.0)
    assert isinstance(refused, Reject) and refused.reason == "too_large_for_pool"
    leased = AdmissionController(lease, pool().tiers(), whole=whole)
    assert isinstance(leased.offer(big, 1.0), Queue)
    wakeups = leased.reconfigure(whole, pool().tiers(), 2.0, whole=whole)  # the lease grew
    assert [a.request_id for a in wakeups.admitted] == [big.request_id]
