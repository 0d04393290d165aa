"""Requests the leases start, this code's allocation against a baseline commit's.

Why this benchmark exists: with several gateway replicas a plan split into leases can
leave each replica a piece smaller than its next request, idle while its queue waits
(docs/0008: the four-replica gap). The scale-out bench sees this on a real engine, but
its output moves by ~10 % between runs on this machine, more than one allocation change
moves it. This one counts what the allocation itself decides, on the same sampled
tables for two versions of the code in one run: four replicas at 70/10/10/10 under the
peers bench's flood (bench/lease_cpu.py's tables, the examples' plan for one bench
engine, checked against the planner first), and for every replica's lease the queued
requests it starts and the KV tokens it leaves idle while a request of it waits.

The walk is this file's, the same for both versions, and follows the dispatcher of
docs/0003 as the allocation models it: tiers by priority; a queued request (its tier's
head size, one slot) starts inside its tier's idle floor (with its standby), else on the
shared part and loans, then the other tiers' idle lendable floors; once a tier's next
request does not start, lower tiers start only inside their own floors.

    .venv/bin/python bench/lease_fragments.py [--baseline COMMIT] [--tables N]

``--baseline`` defaults to ``d808832``, the allocation before floor pieces moved in
consolidation (2026-12-06).

Writes bench/results/lease_fragments.json and prints a table.
"""

from __future__ import annotations

import argparse
import os
import random
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from benchkit import REPO, machine_info, write_results
from lease_cpu import (
    MEMBERS,
    BaselineError,
    extract,
    flood_demand,
    flood_plan,
    planner_mismatch,
    run_version,
)

RESULTS = REPO / "bench" / "results" / "lease_fragments.json"
DIMS = ("tokens", "slots")


def walk(plan: Any, report: Any, lease: Any) -> tuple[int, int, bool]:
    """Walk one replica's ``lease`` as its dispatcher would: (requests started, KV tokens
    left idle, whether a request still waits)."""

    def part(amount: Any, dim: str) -> int:
        return int(amount.tokens if dim == "tokens" else amount.slots)

    def of(amounts: Any, tier: str, dim: str) -> int:
        amount = amounts.get(tier)
        return part(amount, dim) if amount is not None else 0

    own: dict[str, dict[str, int]] = {}
    lendable: dict[str, dict[str, int]] = {}
    pool: dict[str, int] = {}
    for dim in DIMS:
        room = {
            t: of(lease.floors, t, dim)
            + of(lease.standby, t, dim)
            - part(report.demand(t).held, dim)
            for t in plan.tiers
        }
        pool[dim] = part(lease.shared, dim) + sum(part(v, dim) for v in lease.loans.values())
        pool[dim] -= sum(max(0, -r) for r in room.values())
        own[dim] = {t: max(0, r) for t, r in room.items()}
        lendable[dim] = {
            t: min(own[dim][t], of(lease.floors, t, dim) * plan.lend_percent.get(t, 0) // 100)
            for t in plan.tiers
        }

    def reach(dim: str, tier: str) -> int:
        others = sum(v for t, v in lendable[dim].items() if t != tier)
        return own[dim][tier] + max(0, pool[dim]) + others

    def take(dim: str, tier: str, amount: int) -> None:
        got = min(amount, own[dim][tier])
        own[dim][tier] -= got
        lendable[dim][tier] = min(lendable[dim][tier], own[dim][tier])
        amount -= got
        got = min(amount, max(0, pool[dim]))
        pool[dim] -= got
        amount -= got
        for lender in reversed(plan.tiers):
            if amount <= 0:
                break
            if lender != tier:
                got = min(amount, lendable[dim][lender])
                lendable[dim][lender] -= got
                own[dim][lender] -= got
                amount -= got

    started, blocked = 0, False
    for tier in plan.tiers:
        demand = report.demand(tier)
        if demand.head_tokens <= 0:
            continue
        queued = demand.now.slots - demand.held.slots
        size = {"tokens": demand.head_tokens, "slots": 1}
        while queued > 0:
            in_floor = all(own[d][tier] >= size[d] for d in DIMS)
            if not in_floor and (blocked or any(reach(d, tier) < size[d] for d in DIMS)):
                break
            for d in DIMS:
                take(d, tier, size[d])
            started += 1
            queued -= 1
        blocked = blocked or queued > 0
    idle = sum(own["tokens"].values()) + max(0, pool["tokens"]) if blocked else 0
    return started, idle, blocked


def count_starts(tables: int, seed: int) -> dict[str, Any]:
    """Over ``tables`` sampled tables (seeded): requests the leases start, tokens idle
    where requests wait, and replicas whose queue still waits, each a table."""
    from kvpool.domain.lease import plan_leases
    from kvpool.domain.lease.model import Report

    plan = flood_plan()
    rng = random.Random(seed)
    started = idle = waiting = 0
    for _ in range(tables):
        table = {
            member: Report(tiers={t: flood_demand(rng, weight, t) for t in plan.tiers})
            for member, weight in MEMBERS.items()
        }
        for member, lease in plan_leases(plan, table).items():
            s, i, w = walk(plan, table[member], lease)
            started, idle, waiting = started + s, idle + i, waiting + w
    return {
        "started_per_table": round(started / tables, 3),
        "idle_tokens_where_waiting_per_table": round(idle / tables, 1),
        "replicas_waiting_per_table": round(waiting / tables, 3),
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--baseline", default="d808832", help="commit to compare against (before floor pieces)"
    )
    parser.add_argument("--tables", type=int, default=3000, help="sampled report tables")
    parser.add_argument("--seed", type=int, default=7)
    parser.add_argument("--output", type=Path, default=RESULTS)
    args = parser.parse_args()
    load_before = os.getloadavg()
    with tempfile.TemporaryDirectory() as tmp:
        mismatch = planner_mismatch(Path(tmp))
        if mismatch is not None:
            print(f"lease_fragments: error: {mismatch}", file=sys.stderr)
            return 2
        try:
            baseline = extract(args.baseline, Path(tmp))
        except BaselineError as exc:
            print(f"lease_fragments: error: {exc}", file=sys.stderr)
            return 2
        figures = {
            name: run_version(path, args.tables, args.seed, "lease_fragments.count_starts")
            for name, path in (("baseline", baseline), ("current", REPO / "operator"))
        }
    result = {
        "benchmark": "lease_fragments",
        "when": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "machine": machine_info(load_before),
        "params": vars(args) | {"output": str(args.output), "members": MEMBERS},
        "versions": figures,
    }
    print(f"{'version':10} {'started':>9} {'idle tokens where waiting':>26} {'waiting':>8}")
    for name, f in figures.items():
        print(
            f"{name:10} {f['started_per_table']:9.3f}"
            f" {f['idle_tokens_where_waiting_per_table']:26.1f}"
            f" {f['replicas_waiting_per_table']:8.3f}"
        )
    print("(each a table of four replicas)")
    print(f"wrote {write_results(args.output, result)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
