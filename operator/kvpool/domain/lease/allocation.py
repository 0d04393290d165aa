"""The lease allocation: one pure function from every replica's demand to every lease.

Why this module exists: when several gateway replicas admit against one plan, capacity
must follow the requests, wherever the balancer sends them, with the plan's promises
intact: each tier's floor where that tier's requests arrive, the rest by priority, and
nothing idle on one replica while another has requests waiting. Every replica runs this
function on the same table of reports (returned by its last renewal), so they agree on
who should hold what; the grant (:mod:`.grant`) makes sure that a replica that computed
from an older table can still never take what another one holds.

The allocation, per dimension (KV tokens and slots, independently), with ``peak`` a
replica's largest demand of the last few seconds and ``now`` its demand at the report
(reserved plus queued), of which ``held`` is reserved by requests in flight:

1. **Floors where their tier is.** A tier's floor is split max-min fair (:func:`fill`)
   over the replicas' ``now`` demand of that tier, then what is left over their ``peak``
   (so a burst at one replica is served by the floor idle at the others, as on one).
   What the demand does not need goes in equal parts to the replicas where the tier
   came lately (``peak > 0``, or demand within the longer presence window; not where a
   replica new to the plan only presumes it), so a new request finds floor at once where
   that tier arrives, however seldom it comes; a tier that came nowhere has its floor
   placed where the borrowers are (by total demand), where its lendable part is of use.
2. **Standbys of ``Preempt`` tiers.** A replica where a ``Preempt`` tier arrives
   (``peak > 0``, or demand within the longer presence window, which the replica reports
   as the tier with no demand; see :mod:`.peaks`) but whose part of its floor has no
   room for one more request of it (the tier's typical request: its head, or its peak
   per slot) gets that room as a standby, booked twice against the tier's idle lendable
   floor at the other replicas (see :mod:`.model`): the next chat starts at once wherever
   it lands, as on one replica, instead of waiting for a renewal because four slots of
   floor cannot be in four places and follow a burst too.
3. **Borrowing at home first.** A replica's demand above its floors (by priority) is met
   first by the idle lendable floors it holds itself (as one replica would lend them).
4. **The shared remainder by priority**: within a tier, first what requests in flight
   reserve and the floors do not cover (the grant never takes that from them, so a lease
   below it only strands a piece elsewhere), then the queues max-min fair across replicas.
5. **Loans of idle floors.** What still waits borrows the idle lendable floors held by
   *other* replicas, lowest-priority lenders first: a ``Wait`` tier's floor moves to the
   borrower (and comes back as its borrowers finish), a ``Preempt`` tier's is booked on
   both (the lender takes it back at once through the engines' preemption; see
   :mod:`.model`), and the lender's lease says what it may still lend at home
   (``Lease.lendable_here``): one borrower a piece, as on one replica. Requests in
   flight come first throughout: their over-floor part borrows at home, then the
   shared remainder, then loans, all before any queue borrows at home (step 3 for the
   queues comes after), so a loan that runs stays booked on its lender.
6. **Slack.** The shared remainder no one waits for is spread over the active replicas
   (any demand in the last few seconds), so a burst starts without waiting for a renewal.
7. **Consolidation.** Steps 1-5 each cut their part in whole requests, but the pieces of
   several steps can still leave a replica more than the requests it starts and less
   than its next one, at two or three replicas at once: idle, while each of their
   queues waits. Walking each replica's lease as its dispatcher would, the shared and
   loaned part left idle where queues still wait goes to the replica whose next request
   it completes (highest priority, then least lacking, first; one request a receiver a
   renewal). A floor split over several replicas leaves pieces too: the idle piece of a
   ``Wait`` tier's floor at a replica where that tier's own next request does not fit it
   moves to a replica where the same tier waits (it serves the tier only where it starts
   a request), and the idle lendable floor of a ``Preempt`` tier that nothing at its
   replica can use is lent, booked on the lender as in step 5 (the lender keeps it, and
   takes it back through the engines' preemption). The shared part, loans and ``Wait``
   floor pieces only move, so their groups sum to the same; a replica never gives up
   what its requests in flight hold; a ``Preempt`` tier's floor stays where its
   requests arrive, and loans and standbys on it stay within its lendable part; a loan
   never moves onto a replica whose own idle floor it is booked on.

Tenants' ``maxConcurrency``: split max-min fair over the replicas' peak in-flight+queued
requests of the tenant, the rest in equal parts over every replica (a limit is no
capacity: held where the tenant has not been lately it costs nothing, and its next request
there starts without waiting for a renewal). A tenant no replica reports gets nothing
anywhere (its first request asks for a renewal).

Worked example (slots only; floors interactive 4 (lend 100 %, Preempt), batch 2, eval 1,
shared 1; replica ``b`` has 1 chat running (peak 2), replica ``a`` 6 batch and 3 eval
requests waiting or running):

    floors:  interactive -> b 4 (only b has interactive); batch -> a 2; eval -> a 1
    at home: a's over-floor need is batch 4 + eval 2 = 6; a holds no idle lendable floor
    shared:  1 -> a (batch first)                                  a needs 5 more
    loans:   b's idle lendable interactive floor is 4 - 1 = 3 -> a 3 (batch; Preempt: b
             keeps its floor of 4 and takes it back by preemption)
    leases:  b: interactive 4                       (total 4)
             a: batch 2, eval 1, shared 1, loan 3   (total 7; 7 + 4 = 11 > 8: the loan is
                                                     preempted by b's next chats)
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from kvpool.domain.admission.amount import Amount
from kvpool.domain.lease.model import DIMENSIONS, Lease, LeasePlan, Report


def fill(capacity: int, wants: Mapping[str, int]) -> dict[str, int]:
    """Max-min fair split: each member gets ``min(want, level)`` for one level, so that the
    sum is ``min(capacity, sum of wants)``. Integer shares; the rounding remainder goes to
    the members that want more (ties by name), so the result is the same on every replica.

    >>> fill(5, {"a": 1, "b": 10, "c": 10})
    {'a': 1, 'b': 2, 'c': 2}
    >>> fill(10, {"a": 1, "b": 3})
    {'a': 1, 'b': 3}
    """
    if sum(max(0, w) for w in wants.values()) <= capacity:
        return {m: max(0, w) for m, w in wants.items()}  # enough for everyone
    out = dict.fromkeys(wants, 0)
    left = max(0, capacity)
    order = sorted(wants, key=lambda m: (wants[m], m))
    for i, member in enumerate(order):
        share = left // (len(order) - i)
        give = min(max(0, wants[member]), share)
        out[member] = give
        left -= give
    return out


def fill_whole(
    capacity: int, wants: Mapping[str, int], unit: int, held: Mapping[str, int] | None = None
) -> dict[str, int]:
    """Max-min fair split in whole requests of ``unit`` tokens: as :func:`fill`, but the
    level counts requests, so no member is left holding less than one request's worth while
    another holds a fraction too (both idle). ``held`` is what each member already has
    toward its demand (from an earlier step of the allocation), counted in whole requests
    in the level, so the fewest requests go first. A member's want is cut into pieces from
    the top - a first piece of ``want % unit`` (what completes the request it holds part
    of), then whole units; what fits no one's next piece goes where it lacks least to complete
    one (a later step may complete it).
    The parts sum to ``min(capacity, sum of wants)``, as with :func:`fill`; ``unit <= 0``
    is :func:`fill` (and ``unit`` 1 splits slots in the order tokens are split).

    >>> fill(475, {"a": 600, "b": 600})  # two batch requests of 300 each: neither fits
    {'a': 237, 'b': 238}
    >>> fill_whole(475, {"a": 600, "b": 600}, 300)  # one fits; the rest waits with it
    {'a': 475, 'b': 0}
    >>> # b holds 175 of a request, a one whole one: b's 125 first, then 300 each
    >>> fill_whole(773, {"a": 900, "b": 1025}, 300, held={"a": 300, "b": 175})
    {'a': 348, 'b': 425}
    """
    if unit <= 0:
        return fill(capacity, wants)
    want = {m: max(0, w) for m, w in wants.items()}
    if sum(want.values()) <= capacity:
        return want
    whole = {m: max(0, (held or {}).get(m, 0)) // unit for m in want}

    def given(member: str, level: int) -> int:
        pieces = level - whole[member]
        if pieces <= 0:
            return 0
        first = want[member] % unit or unit
        return min(want[member], first + (pieces - 1) * unit)

    def total(level: int) -> int:
        return sum(given(m, level) for m in want)

    low = min(whole.values())  # total(low) is 0; total(high) is every want: > capacity
    high = max(whole[m] + want[m] // unit + 1 for m in want)
    while low < high - 1:  # the highest level every member can reach
        mid = (low + high) // 2
        low, high = (mid, high) if total(mid) <= capacity else (low, mid)
    out = {m: given(m, low) for m in want}
    left = capacity - sum(out.values())
    for member in sorted(want, key=lambda m: (whole[m], m)):  # one more where it fits
        extra = given(member, max(low, whole[member]) + 1) - out[member]
        if 0 < extra <= left:
            out[member] += extra
            left -= extra
    while left > 0:  # the crumbs, nearest a whole request (sum of wants > capacity)
        member = min(
            (m for m in want if out[m] < want[m]),
            key=lambda m: ((want[m] - out[m]) % unit or unit, m),
        )
        extra = min(left, want[member] - out[member])
        out[member] += extra
        left -= extra
    return out


def spread(capacity: int, weights: Mapping[str, int]) -> dict[str, int]:
    """Split ``capacity`` in proportion to ``weights`` (equal parts when all are zero),
    largest remainders first (ties by name); the parts sum to ``capacity``.

    >>> spread(5, {"a": 1, "b": 1})
    {'a': 3, 'b': 2}
    >>> spread(4, {"a": 0, "b": 3})
    {'a': 0, 'b': 4}
    """
    if not weights or capacity <= 0:
        return dict.fromkeys(weights, 0)
    use = weights if any(w > 0 for w in weights.values()) else dict.fromkeys(weights, 1)
    total = sum(max(0, w) for w in use.values())
    out = {m: capacity * max(0, w) // total for m, w in use.items()}
    left = capacity - sum(out.values())
    by_remainder = sorted(use, key=lambda m: (-(capacity * max(0, use[m]) % total), m))
    for member in by_remainder[:left]:
        out[member] += 1
    return out


def _dim(amount: Amount, dim: str) -> int:
    return amount.tokens if dim == "tokens" else amount.slots


class _Dimension:
    """The allocation of one dimension (tokens or slots) of one plan."""

    def __init__(self, plan: LeasePlan, reports: Mapping[str, Report], dim: str) -> None:
        self.plan, self.dim = plan, dim
        self.members = sorted(reports)
        self.now: dict[str, dict[str, int]] = {}
        self.peak: dict[str, dict[str, int]] = {}
        self.held: dict[str, dict[str, int]] = {}
        for m in self.members:
            tiers = reports[m].tiers
            now: dict[str, int] = {}
            peak: dict[str, int] = {}
            held: dict[str, int] = {}
            self.now[m], self.peak[m], self.held[m] = now, peak, held
            for t in plan.tiers:
                d = tiers.get(t)
                now[t] = _dim(d.now, dim) if d is not None else 0
                peak[t] = max(now[t], _dim(d.peak, dim)) if d is not None else 0
                held[t] = min(now[t], _dim(d.held, dim)) if d is not None else 0
        self.active = [m for m in self.members if reports[m].active]
        # where each tier arrived lately (its peak, or the longer presence window)
        self.arrives = {
            m: {t: self.peak[m][t] > 0 or reports[m].arrives(t) for t in plan.tiers}
            for m in self.members
        }
        # of them, where it did arrive (not only presumed by a replica new to the plan)
        self.came = {
            m: {t: self.peak[m][t] > 0 or reports[m].came(t) for t in plan.tiers}
            for m in self.members
        }
        # a tier's tokens are split in whole requests of its largest next request, and its
        # slots in the same order (so a replica's tokens and slots fit the same requests)
        heads = {
            t: max((reports[m].demand(t).head_tokens for m in self.members), default=0)
            for t in plan.tiers
        }
        self.unit = {t: (h if dim == "tokens" else min(1, h)) for t, h in heads.items()}
        # a tier's typical request, for standbys: its largest head, else its largest peak
        # per slot (what one of its requests reserved lately); one slot
        self.request = {
            t: (
                max([heads[t], *(_per_slot(reports[m].demand(t).peak) for m in self.members)])
                if dim == "tokens"
                else int(any(self.peak[m][t] > 0 for m in self.members))
            )
            for t in plan.tiers
        }
        self.floors: dict[str, dict[str, int]] = {m: {} for m in self.members}
        self.shared = dict.fromkeys(self.members, 0)
        self.loans: dict[str, dict[str, int]] = {m: {} for m in self.members}
        self.standby: dict[str, dict[str, int]] = {m: {} for m in self.members}
        self.standing: dict[str, dict[str, int]] = {m: {} for m in self.members}  # booked on
        self.need: dict[str, dict[str, int]] = {}  # what still waits, after :meth:`run`
        # per borrower and lender tier, the members whose idle floor its loans are booked on
        self.booked: dict[str, dict[str, dict[str, int]]] = {m: {} for m in self.members}

    def place_floors(self) -> None:
        for tier in self.plan.tiers:
            self._place_floor(tier)

    def run(self) -> None:
        """Everything after the floors and the standbys (:func:`_stand_by`)."""
        need, idle = self._over_floors(), self._idle_lendable()
        self._borrow_at_home(need, idle, running_only=True)
        for member in self.members:  # loans and standbys share the lendable floor
            for tier, booked in self.standing[member].items():
                idle[member][tier] = max(0, idle[member][tier] - booked)
        left = _dim(self.plan.shared, self.dim)
        for tier in self.plan.tiers:
            given = self._in_flight_first(
                left, {m: need[m][tier] for m in self.members}, need, tier
            )
            for member, amount in given.items():
                self.shared[member] += amount
                need[member][tier] -= amount
                left -= amount
        # requests in flight keep the loans they run on before any queue borrows at home:
        # one piece of idle floor, one borrower (the lender's view lends only the rest)
        self._loan(need, idle, running_only=True)
        self._borrow_at_home(need, idle, running_only=False)
        self._loan(need, idle)
        for member, amount in spread(left, dict.fromkeys(self.active or self.members, 1)).items():
            self.shared[member] += amount
        self.need = need

    def _covered(self, need: dict[str, dict[str, int]], tier: str) -> dict[str, int]:
        """Per member, how much of the tier's demand the allocation meets so far."""
        return {m: self.now[m][tier] - need[m][tier] for m in self.members}

    def _in_flight_first(
        self, capacity: int, wants: Mapping[str, int], need: dict[str, dict[str, int]], tier: str
    ) -> dict[str, int]:
        """Split ``capacity`` over ``wants`` of ``tier``: first what the members' requests in
        flight already reserve and the allocation does not cover yet (max-min fair), then
        the queues in whole requests (:func:`fill_whole`, fewest-held first). A replica's
        running requests keep what they reserve whatever the lease says (the grant cannot
        give it to another until they finish), so a lease below them only leaves the
        other replica a wish it cannot be granted, and the part it is granted too small
        for its next request: capacity idle on both."""
        covered = self._covered(need, tier)
        running = {m: min(w, max(0, self.held[m][tier] - covered[m])) for m, w in wants.items()}
        first = fill(capacity, running)
        rest = {m: wants[m] - first[m] for m in wants}
        so_far = {m: covered[m] + first[m] for m in wants}
        then = fill_whole(capacity - sum(first.values()), rest, self.unit[tier], so_far)
        return {m: first[m] + then[m] for m in wants}

    def _place_floor(self, tier: str) -> None:
        floor = _dim(self.plan.floors[tier], self.dim)
        peaks = {m: self.peak[m][tier] for m in self.members}
        # what the tier holds and waits for now first, then its recent peaks: a burst at
        # one replica is served by the floor idle at the others, as on one replica
        placed = fill_whole(floor, {m: self.now[m][tier] for m in self.members}, self.unit[tier])
        recent = {m: max(0, peaks[m] - placed[m]) for m in self.members}
        for member, extra in fill_whole(
            floor - sum(placed.values()), recent, self.unit[tier], placed
        ).items():
            placed[member] += extra
        left = floor - sum(placed.values())
        if left > 0:
            # where the tier came within the presence window, not only within the peaks'
            # window (a tier that comes every ten seconds keeps its floor where it comes),
            # and not where it is only presumed (a replica new to the plan has a standby
            # for it: a floor part there would be its own borrowers' and held by them)
            present = {m: 1 for m in self.members if self.came[m][tier]}
            where = present or {m: sum(self.peak[m].values()) for m in self.members}
            for member, extra in spread(left, where).items():
                placed[member] += extra
        for member, amount in placed.items():
            self.floors[member][tier] = amount

    def _lendable_free(self, member: str, tier: str) -> int:
        """The part of ``member``'s lendable floor of ``tier`` the tier does not hold."""
        lendable = self.floors[member][tier] * self.plan.lend_percent.get(tier, 0) // 100
        return max(0, lendable - self.now[member][tier] - self.standing[member].get(tier, 0))

    def standby_want(self, member: str, tier: str) -> int:
        """What ``member`` lacks of room for one more request of ``tier`` in its floor."""
        room = max(0, self.floors[member][tier] - self.now[member][tier])
        return max(0, self.request[tier] - room)

    def book_standby(self, member: str, tier: str, want: int, *, dry: bool) -> bool:
        """Book ``want`` of ``tier`` as ``member``'s standby on the others' idle lendable
        floor, largest first; whole or not at all (``dry``: only say whether it fits)."""
        lenders = sorted(
            (m for m in self.members if m != member),
            key=lambda m: (-self._lendable_free(m, tier), m),
        )
        if sum(self._lendable_free(m, tier) for m in lenders) < want:
            return False
        if dry or want <= 0:
            return True
        for lender in lenders:
            take = min(want, self._lendable_free(lender, tier))
            if take <= 0:
                break
            self.standing[lender][tier] = self.standing[lender].get(tier, 0) + take
            self.standby[member][tier] = self.standby[member].get(tier, 0) + take
            want -= take
        return True

    def _over_floors(self) -> dict[str, dict[str, int]]:
        """Per member, each tier's demand above its floor there."""
        return {
            m: {t: max(0, self.now[m][t] - self.floors[m][t]) for t in self.plan.tiers}
            for m in self.members
        }

    def _idle_lendable(self) -> dict[str, dict[str, int]]:
        """Per member, the lendable part of each tier's floor its demand leaves idle."""
        idle: dict[str, dict[str, int]] = {}
        for member in self.members:
            floors, now = self.floors[member], self.now[member]
            idle[member] = {
                t: max(
                    0,
                    min(
                        floors[t] * self.plan.lend_percent.get(t, 0) // 100,
                        floors[t] - min(now[t], floors[t]),
                    ),
                )
                for t in self.plan.tiers
            }
        return idle

    def _running_need(self, need: dict[str, dict[str, int]], member: str, tier: str) -> int:
        """Of ``member``'s need of ``tier``, what its requests in flight already reserve."""
        covered = self.now[member][tier] - need[member][tier]
        return min(need[member][tier], max(0, self.held[member][tier] - covered))

    def _borrow_at_home(
        self,
        need: dict[str, dict[str, int]],
        idle: dict[str, dict[str, int]],
        *,
        running_only: bool,
    ) -> None:
        """Meet each member's need (its requests in flight only, or all of it) from the
        idle lendable floors it holds itself, lowest-priority lenders first (as the
        controller attributes them)."""
        for member in self.members:
            for tier in self.plan.tiers:
                want = need[member][tier]
                if running_only:
                    want = self._running_need(need, member, tier)
                for lender in reversed(self.plan.tiers):
                    if want <= 0:
                        break
                    if lender == tier:
                        continue
                    take = min(want, idle[member][lender])
                    idle[member][lender] -= take
                    need[member][tier] -= take
                    want -= take

    def _loan(
        self,
        need: dict[str, dict[str, int]],
        idle: dict[str, dict[str, int]],
        *,
        running_only: bool = False,
    ) -> None:
        """Meet what still waits (or only what requests in flight reserve) from the idle
        lendable floors other members hold, lowest-priority lenders first (as the
        controller attributes borrowing)."""
        for tier in self.plan.tiers:
            for lender in reversed(self.plan.tiers):
                if lender == tier or not any(need[m][tier] > 0 for m in self.members):
                    continue
                pool = sum(idle[m][lender] for m in self.members)
                if pool <= 0:
                    continue
                wants = {
                    m: min(
                        self._running_need(need, m, tier) if running_only else need[m][tier],
                        pool - idle[m][lender],
                    )
                    for m in self.members
                    if need[m][tier] > 0
                }
                for member, amount in self._in_flight_first(pool, wants, need, tier).items():
                    booked = self._take_idle(idle, lender, amount, borrower=member)
                    if booked <= 0:
                        continue
                    self.loans[member][lender] = self.loans[member].get(lender, 0) + booked
                    need[member][tier] -= booked

    def _take_idle(
        self, idle: dict[str, dict[str, int]], lender: str, amount: int, borrower: str
    ) -> int:
        """Book a loan of ``lender``'s floor against the idle floor other members hold,
        largest first; a ``Wait`` tier's floor moves (the lender holds that much less),
        a ``Preempt`` tier's is booked twice (see :mod:`.model`). Returns what was booked."""
        booked = 0
        for member in sorted(self.members, key=lambda m: (-idle[m][lender], m)):
            if booked >= amount:
                break
            if member == borrower:
                continue
            take = min(amount - booked, idle[member][lender])
            idle[member][lender] -= take
            if lender not in self.plan.preempt:
                self.floors[member][lender] -= take
            booked += take
            if take > 0:
                on = self.booked[borrower].setdefault(lender, {})
                on[member] = on.get(member, 0) + take
        return booked

    # -- consolidation (step 7) ------------------------------------------------------------

    def lent_by(self, member: str, tier: str) -> int:
        """What of ``member``'s floor of ``tier`` (a Preempt tier) is booked as loans to
        the other members."""
        return sum(on.get(tier, {}).get(member, 0) for on in self.booked.values())

    def lendable_here(self, member: str, tier: str) -> int:
        """What of ``member``'s floor of ``tier`` (a Preempt tier) its own lower tiers may
        borrow: the lendable part when nothing of it is lent to the others, else the idle
        lendable part less the loans booked on it (one borrower a piece)."""
        floor = self.floors[member][tier]
        lendable = floor * self.plan.lend_percent.get(tier, 0) // 100
        lent = self.lent_by(member, tier)
        if lent <= 0:
            return lendable
        return max(0, min(lendable, floor - min(self.now[member][tier], floor)) - lent)

    def bookable(self, member: str, tier: str) -> int:
        """What more of ``member``'s lendable floor of ``tier`` (a Preempt tier) loans and
        standbys may be booked on: its lendable part less what the tier holds there,
        the standbys and the loans already booked on it."""
        return max(0, self._lendable_free(member, tier) - self.lent_by(member, tier))

    def lend(self, lender: str, receiver: str, tier: str, amount: int) -> int:
        """Book a loan of up to ``amount`` of ``lender``'s idle lendable floor of ``tier``
        (a Preempt tier: the lender keeps it) for ``receiver``. Returns what was booked."""
        take = max(0, min(amount, self.bookable(lender, tier)))
        if take:
            self.loans[receiver][tier] = self.loans[receiver].get(tier, 0) + take
            on = self.booked[receiver].setdefault(tier, {})
            on[lender] = on.get(lender, 0) + take
            _settle_need(self.need[receiver], -take, self.plan.tiers)
        return take

    def move_floor(self, donor: str, receiver: str, tier: str, amount: int) -> int:
        """Move up to ``amount`` of ``donor``'s floor of ``tier`` that its requests in
        flight do not hold to ``receiver``. Returns what moved."""
        free = self.floors[donor][tier] - self.held[donor][tier]
        take = max(0, min(amount, free))
        self.floors[donor][tier] -= take
        self.floors[receiver][tier] += take
        _settle_need(self.need[receiver], -take, self.plan.tiers)
        _settle_need(self.need[donor], take, self.plan.tiers)
        return take

    def move(self, donor: str, receiver: str, amount: int) -> int:
        """Move up to ``amount`` of ``donor``'s shared part and loans to ``receiver`` (the
        shared part first, then the largest loans); a loan moves with its booking, never
        onto a member whose own idle floor it is booked on. Returns what moved."""
        take = min(amount, self.shared[donor])
        self.shared[donor] -= take
        self.shared[receiver] += take
        moved = take
        for lender in sorted(self.loans[donor], key=lambda t: (-self.loans[donor][t], t)):
            if moved >= amount:
                break
            take = self._move_booking(
                donor, lender, receiver, min(amount - moved, self.loans[donor][lender])
            )
            self.loans[donor][lender] -= take
            self.loans[receiver][lender] = self.loans[receiver].get(lender, 0) + take
            moved += take
        _settle_need(self.need[receiver], -moved, self.plan.tiers)
        _settle_need(self.need[donor], moved, self.plan.tiers)
        return moved

    def _move_booking(self, donor: str, lender: str, receiver: str, amount: int) -> int:
        on = self.booked[donor].get(lender, {})
        into = self.booked[receiver].setdefault(lender, {})
        moved = 0
        for member in sorted(on):
            if member == receiver or moved >= amount:
                continue
            take = min(on[member], amount - moved)
            on[member] -= take
            into[member] = into.get(member, 0) + take
            moved += take
        return moved


def _stand_by(plan: LeasePlan, dims: Sequence[_Dimension]) -> None:
    """Standbys of the ``Preempt`` tiers (module docstring, step 2), in both dimensions
    at once (tokens without a slot, or a slot without tokens, start nothing): where the
    tier arrives, likeliest first (largest peak), when its floor part has no room for one
    more of its requests and the others' idle lendable floor has it."""
    slots = next(d for d in dims if d.dim == "slots")
    for tier in plan.tiers:
        if tier not in plan.preempt or any(d.request[tier] <= 0 for d in dims):
            continue
        present = [m for m in slots.members if slots.arrives[m][tier]]
        for member in sorted(present, key=lambda m: (-slots.peak[m][tier], m)):
            wants = [(d, d.standby_want(member, tier)) for d in dims]
            if all(want <= 0 for _, want in wants):
                continue
            if all(d.book_standby(member, tier, want, dry=True) for d, want in wants):
                for d, want in wants:
                    d.book_standby(member, tier, want, dry=False)


def _consolidate(
    plan: LeasePlan, reports: Mapping[str, Report], dims: Sequence[_Dimension]
) -> None:
    """Consolidation (module docstring, step 7), in both dimensions at once: a replica
    whose queues still wait after the requests its lease starts (as its dispatcher would
    start them, :func:`_next_start`) holds the shared and loaned left-over idle, the
    piece of a ``Wait`` tier's floor its own next request of that tier does not fit, and
    a ``Preempt`` tier's lendable floor nothing of it can use; they go to another such
    replica whose next request they complete (a floor piece only where its tier is the
    one that waits; a ``Preempt`` floor as a loan booked on it), highest priority and
    nearest to starting first, one request per receiver and renewal."""
    rank = {t: i for i, t in enumerate(plan.tiers)}
    by_dim = {d.dim: d for d in dims}
    receivers: set[str] = set()
    donors: set[str] = set()

    def waiting() -> dict[str, _Waiting]:
        out = {}
        for member in dims[0].members:
            found = _next_start(plan, reports[member], member, dims)
            if found is not None:
                out[member] = found
        return out

    def offer(giver: str, tier: str, dim: str) -> tuple[int, int, dict[str, int]]:
        """What ``giver`` leaves idle for a receiver waiting in ``tier``: (shared and
        loaned, floor of ``tier``, per Preempt tier the lendable floor it may book)."""
        waits = now[giver]
        floor = waits.stuck_floors[dim].get(tier, 0) if tier not in plan.preempt else 0
        d = by_dim[dim]
        loanable = {
            t: min(v, d.bookable(giver, t))
            for t, v in waits.stuck_lendable[dim].items()
            if t != tier
        }
        return waits.pooled[dim], floor, {t: v for t, v in loanable.items() if v > 0}

    def total(giver: str, tier: str, dim: str) -> int:
        pooled, floor, loanable = offer(giver, tier, dim)
        return pooled + floor + sum(loanable.values())

    now = waiting()
    order = sorted(
        now,
        key=lambda m: (rank[now[m].tier], now[m].lack["tokens"], now[m].lack["slots"], m),
    )
    for member in order:
        if member in donors or member not in now:
            continue
        tier, lack = now[member].tier, now[member].lack
        wants = {d.dim: min(lack[d.dim], sum(d.need[member].values())) for d in dims}
        givers = [m for m in now if m != member and m not in receivers]
        if not all(sum(total(m, tier, d.dim) for m in givers) >= wants[d.dim] for d in dims):
            continue
        for d in dims:
            want = wants[d.dim]
            for giver in sorted(givers, key=lambda m: (-total(m, tier, d.dim), m)):
                if want <= 0:
                    break
                pooled, floor, loanable = offer(giver, tier, d.dim)
                moved = d.move(giver, member, min(want, pooled))
                if want - moved > 0 and floor > 0:
                    moved += d.move_floor(giver, member, tier, min(want - moved, floor))
                for lender, amount in loanable.items():
                    if want - moved > 0:
                        moved += d.lend(giver, member, lender, min(want - moved, amount))
                want -= moved
                if moved:
                    donors.add(giver)
        receivers.add(member)
        now = waiting()  # only a move changes who waits (the walk is pure)


@dataclass(frozen=True)
class _Waiting:
    """A replica whose queues still wait under the allocation so far (:func:`_next_start`)."""

    tier: str  # the first tier that waits
    lack: dict[str, int]  # per dimension: what its next request lacks to start
    pooled: dict[str, int]  # per dimension: the shared and loaned part left idle
    # per dimension and tier that waits here: the idle piece of its floor (too small for
    # its next request)
    stuck_floors: dict[str, dict[str, int]]
    # per dimension and Preempt tier: its lendable floor here that nothing here can use
    stuck_lendable: dict[str, dict[str, int]]


def _next_start(
    plan: LeasePlan, report: Report, member: str, dims: Sequence[_Dimension]
) -> _Waiting | None:
    """Whether ``member``'s queues still wait under the allocation so far, walked as its
    dispatcher would (tiers by priority, each head request inside its own floor, else
    borrowing the shared part, the loans and the others' idle lendable floors; once a
    tier's next request cannot start, lower tiers start only inside their floors), with
    every queued request the size of its tier's head. None when nothing waits; else the
    first tier that waits, what it lacks to start its next request, the shared and loaned
    part left idle, and the idle floor of each tier that waits (per dimension)."""
    own: dict[str, dict[str, int]] = {}  # per dimension and tier: its idle floor
    lendable: dict[str, dict[str, int]] = {}
    pool: dict[str, int] = {}  # the shared part and the loans, less what runs above floors
    for d in dims:
        floors = d.floors[member]
        room = {t: floors[t] + d.standby[member].get(t, 0) - d.held[member][t] for t in plan.tiers}
        pool[d.dim] = d.shared[member] + sum(d.loans[member].values())
        pool[d.dim] -= sum(max(0, -r) for r in room.values())
        own[d.dim] = {t: max(0, r) for t, r in room.items()}
        lendable[d.dim] = {
            t: min(own[d.dim][t], floors[t] * plan.lend_percent.get(t, 0) // 100)
            for t in plan.tiers
        }
    slots = next(d for d in dims if d.dim == "slots")
    found: tuple[str, dict[str, int]] | None = None
    stuck: list[str] = []  # the tiers whose next request does not start
    for tier in plan.tiers:
        head = report.demand(tier).head_tokens
        queued = slots.now[member][tier] - slots.held[member][tier]  # requests waiting
        if head <= 0 or queued <= 0:
            continue
        size = {"tokens": head, "slots": 1}
        while queued > 0:
            if all(own[k][tier] >= v for k, v in size.items()):
                for k, v in size.items():
                    own[k][tier] -= v
                    lendable[k][tier] = min(lendable[k][tier], own[k][tier])
            elif found is None and all(
                _reach(own, lendable, pool, k, tier) >= v for k, v in size.items()
            ):
                for k, v in size.items():
                    _take(own, lendable, pool, k, tier, v)
            else:
                break
            queued -= 1
        if queued > 0:
            stuck.append(tier)
        if queued > 0 and found is None:
            lack = {k: max(0, size[k] - _reach(own, lendable, pool, k, tier)) for k in size}
            found = (tier, lack)
    if found is None:
        return None
    return _Waiting(
        tier=found[0],
        lack=found[1],
        pooled={k: max(0, v) for k, v in pool.items()},
        stuck_floors={k: {t: own[k][t] for t in stuck if own[k][t] > 0} for k in own},
        stuck_lendable={
            k: {t: lendable[k][t] for t in plan.preempt if lendable[k].get(t, 0) > 0}
            for k in lendable
        },
    )


def _reach(
    own: dict[str, dict[str, int]],
    lendable: dict[str, dict[str, int]],
    pool: dict[str, int],
    dim: str,
    tier: str,
) -> int:
    """What a request of ``tier`` may start on: its idle floor, the pool, and the idle
    lendable floors of the other tiers."""
    others = sum(v for t, v in lendable[dim].items() if t != tier)
    return own[dim][tier] + pool[dim] + others


def _take(
    own: dict[str, dict[str, int]],
    lendable: dict[str, dict[str, int]],
    pool: dict[str, int],
    dim: str,
    tier: str,
    amount: int,
) -> None:
    """Start ``amount`` of ``tier`` on its idle floor, then the pool, then the others'
    idle lendable floors (lowest priority first)."""
    take = min(amount, own[dim][tier])
    own[dim][tier] -= take
    lendable[dim][tier] = min(lendable[dim][tier], own[dim][tier])
    amount -= take
    take = min(amount, max(0, pool[dim]))
    pool[dim] -= take
    amount -= take
    for lender in reversed(list(lendable[dim])):
        if amount <= 0:
            break
        if lender == tier:
            continue
        take = min(amount, lendable[dim][lender])
        lendable[dim][lender] -= take
        own[dim][lender] -= take
        amount -= take


def _settle_need(need: dict[str, int], change: int, tiers: Sequence[str]) -> None:
    """Add ``change`` to what waits (a negative one from the highest-priority tier that
    waits, a positive one to it), keeping every figure at least zero."""
    if change >= 0:
        tier = next((t for t in tiers if need[t] > 0), tiers[0])
        need[tier] += change
        return
    left = -change
    for tier in tiers:
        take = min(left, need[tier])
        need[tier] -= take
        left -= take


def _per_slot(amount: Amount) -> int:
    """Tokens per slot of ``amount``, rounded up (0 without slots)."""
    return -(-amount.tokens // amount.slots) if amount.slots > 0 else 0


def _tenant_shares(
    plan: LeasePlan, reports: Mapping[str, Report], members: list[str]
) -> dict[str, dict[str, int]]:
    shares: dict[str, dict[str, int]] = {m: {} for m in members}
    for tenant, limit in plan.tenants.items():
        peaks = {
            m: max(reports[m].tenants[tenant])
            for m in members
            if tenant in reports[m].tenants and max(reports[m].tenants[tenant]) > 0
        }
        if not peaks:
            continue
        placed = dict.fromkeys(members, 0) | fill(limit, peaks)
        left = limit - sum(placed.values())
        for member, extra in spread(left, dict.fromkeys(members, 1)).items():
            placed[member] += extra
        for member, amount in placed.items():
            if amount:
                shares[member][tenant] = amount
    return shares


def plan_leases(plan: LeasePlan, reports: Mapping[str, Report]) -> dict[str, Lease]:
    """Every live replica's lease of ``plan``, from the reports of all of them (see the
    module docstring). The leases' components sum to at most the plan's (loans to at
    most the Preempt tiers' lendable floors), and floors and shared remainder are placed
    in full whenever there is a replica.

    >>> from kvpool.domain.lease.model import LeasePlan, Report, TierDemand
    >>> plan = LeasePlan(("hi",), {"hi": Amount(100, 4)}, {"hi": 100}, frozenset(),
    ...                  Amount(20, 2), Amount(120, 6))
    >>> busy = Report({"hi": TierDemand(now=Amount(90, 3), peak=Amount(90, 3))})
    >>> leases = plan_leases(plan, {"a": busy, "b": Report()})
    >>> leases["a"].floors["hi"], leases["b"].floors["hi"], leases["a"].shared
    (Amount(tokens=100, slots=4), Amount(tokens=0, slots=0), Amount(tokens=20, slots=2))
    """
    if not reports:
        return {}
    by_dim = {dim: _Dimension(plan, reports, dim) for dim in DIMENSIONS}
    for allocation in by_dim.values():
        allocation.place_floors()
    _stand_by(plan, list(by_dim.values()))
    for allocation in by_dim.values():
        allocation.run()
    _consolidate(plan, reports, list(by_dim.values()))
    tokens, slots = by_dim["tokens"], by_dim["slots"]
    members = tokens.members
    tenants = _tenant_shares(plan, reports, members)
    leases: dict[str, Lease] = {}
    for member in members:
        lenders = set(tokens.loans[member]) | set(slots.loans[member])
        standing = set(tokens.standby[member]) | set(slots.standby[member])
        leases[member] = Lease(
            floors={
                t: Amount(tokens.floors[member][t], slots.floors[member][t]) for t in plan.tiers
            },
            shared=Amount(tokens.shared[member], slots.shared[member]),
            loans={
                t: Amount(tokens.loans[member].get(t, 0), slots.loans[member].get(t, 0))
                for t in sorted(lenders)
            },
            tenants=tenants[member],
            standby={
                t: Amount(tokens.standby[member].get(t, 0), slots.standby[member].get(t, 0))
                for t in sorted(standing)
            },
            lendable_here={
                t: Amount(tokens.lendable_here(member, t), slots.lendable_here(member, t))
                for t in sorted(plan.preempt)
                if tokens.lent_by(member, t) or slots.lent_by(member, t)
            },
        )
    return leases
