"""CPU of one lease renewal's computation, this code against a baseline commit's.

Why this benchmark exists: under a flood every gateway replica renews its leases 10-20
times a second, and with four replicas on one core what a renewal computes is CPU the
request path of every replica competes for (docs/0008 "What it costs"). The scale-out
bench's CPU per replica moves by a few points between runs on this machine; this one
times the computation alone, on the same inputs, for two versions of the code in the
same run.

A renewal's computation, as :class:`kvpool.gateway.leases.LeaseKeeper` does it under a
flood: observe this replica's demand in its peak windows (tiers and limited tenants),
then compute the allocation twice (the wish, and the wish again on the fresher table the
answer brings). The plan is the planner's for the examples' manifests on one bench engine
(checked against ``bench_manifests.compile_mix`` at every run: 1,843 KV tokens and 8
slots; interactive 893 tokens / 4 slots with reclaim Preempt, batch 475 / 2, eval 475 /
1), the table four replicas at 70/10/10/10 under the peers bench's flood: every
replica with batch and eval queued, a chat or two now and then, demand moving at every
renewal (seeded). Renewals come every 50 ms of simulated time, so a peak window holds
100 observations as it does under a flood.

Each version runs in its own process with its own ``operator/`` on the path: this
working tree's, and ``--baseline`` (a commit; default ``fed6cd2``, before the renewal
work of 2026-12-06) extracted with ``git archive``.

    .venv/bin/python bench/lease_cpu.py [--baseline COMMIT] [--renewals N] [--rounds R]

Writes bench/results/lease_cpu.json and prints a table.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import subprocess
import sys
import tarfile
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from benchkit import REPO, machine_info, write_results

RESULTS = REPO / "bench" / "results" / "lease_cpu.json"
MEMBERS = {"r0": 7, "r1": 1, "r2": 1, "r3": 1}  # ingress weights (70/10/10/10)
PERIOD = 0.05  # seconds of simulated time between renewals
# the planner's plan of the examples' mix for one bench engine, (tokens, slots); the run
# checks them against `bench_manifests.compile_mix` first (a planner change stops it)
FLOORS = {"interactive": (893, 4), "batch": (475, 2), "eval": (475, 1)}
SHARED = (0, 1)
PER_ENGINE = (1843, 8)


def planner_mismatch(workdir: Path) -> str | None:
    """What differs between the figures above and what the planner makes of the
    examples' manifests for one bench engine (None: nothing)."""
    from bench_manifests import compile_mix

    planned = compile_mix("examples", ["http://127.0.0.1:9"], workdir).planned()
    found = {
        "floors": {t: (f["floor_tokens"], f["floor_slots"]) for t, f in planned["tiers"].items()},
        "shared": (planned["shared_tokens"], planned["shared_slots"]),
        "per_engine": (planned["tokens_per_replica"], planned["slots_per_replica"]),
    }
    expected = {"floors": FLOORS, "shared": SHARED, "per_engine": PER_ENGINE}
    if found == expected:
        return None
    return f"the planner now plans {found}, this bench times {expected}: update FLOORS"


def flood_plan() -> Any:
    """The examples' plan for one bench engine as a LeasePlan (of the code on
    ``sys.path``: imported here, so each version's process uses its own)."""
    from kvpool.domain.admission.amount import Amount
    from kvpool.domain.lease.model import LeasePlan

    return LeasePlan(
        tiers=tuple(FLOORS),
        floors={t: Amount(*floor) for t, floor in FLOORS.items()},
        lend_percent={"interactive": 100, "batch": 50, "eval": 100},  # examples/tierpolicy
        preempt=frozenset({"interactive"}),
        shared=Amount(*SHARED),
        per_engine=Amount(*PER_ENGINE),
        tenants={},
    )


FLOOD_SIZES = {"interactive": (60, 140), "batch": (250, 475), "eval": (164, 264)}


def flood_demand(rng: random.Random, weight: int, tier: str) -> Any:
    """One replica's demand of ``tier`` under the flood, at ingress weight ``weight`` of 7:
    a chat or two now and then; batch and eval running one or two and queuing more."""
    from kvpool.domain.admission.amount import Amount
    from kvpool.domain.lease.model import TierDemand

    low, high = FLOOD_SIZES[tier]
    if tier == "interactive":
        running = rng.choice([0, 0, 1, 1, 2]) if rng.random() < weight / 7 else 0
        queued = 0
    else:
        running = rng.randint(0, 2 if weight > 1 else 1)
        queued = rng.randint(weight, 4 * weight)
    held = Amount(sum(rng.randint(low, high) for _ in range(running)), running)
    head = rng.randint(low, high) if queued else 0
    now = held + Amount(head * queued, queued)
    return TierDemand(now=now, peak=now, head_tokens=head, held=held)


def time_renewals(renewals: int, seed: int) -> dict[str, float]:
    """Time ``renewals`` renewals of replica r0 with the code on ``sys.path``; returns
    CPU milliseconds a renewal (the median of 5 repetitions) and the checksum of the
    leases computed (equal across versions when they compute the same)."""
    from kvpool.domain.admission.amount import Amount
    from kvpool.domain.lease import plan_leases
    from kvpool.domain.lease.model import Report, TierDemand
    from kvpool.domain.lease.peaks import PeakWindow

    plan = flood_plan()
    tiers = plan.tiers
    demand = flood_demand

    def checksum(leases: dict[str, Any]) -> int:
        lease = leases["r0"]
        return sum(a.tokens * 7 + a.slots for a in lease.floors.values()) + lease.shared.tokens

    timings: list[float] = []
    total = 0
    for _ in range(5):
        rng = random.Random(seed)
        peaks, tenant_peaks = PeakWindow(), PeakWindow()
        table: dict[str, Report] = {}
        total = 0
        started = time.process_time()
        for index in range(renewals):
            now = index * PERIOD
            for member, weight in MEMBERS.items():
                table[member] = Report(tiers={t: demand(rng, weight, t) for t in tiers})
            # replica r0's own renewal: its peaks, then the allocation twice
            busy = {t: d.now for t, d in table["r0"].tiers.items() if not d.now.is_zero}
            top = peaks.observe(now, busy)
            tenant_peaks.observe(now, {"bulk": Amount(0, busy["batch"].slots)})
            table["r0"] = Report(
                tiers={
                    t: TierDemand(d.now, top.get(t, d.now), d.head_tokens, d.held)
                    for t, d in table["r0"].tiers.items()
                }
            )
            total += checksum(plan_leases(plan, table))
            total += checksum(plan_leases(plan, table))
        timings.append((time.process_time() - started) * 1000 / renewals)
    timings.sort()
    return {"cpu_ms_per_renewal": round(timings[2], 4), "checksum": total}


def run_version(
    operator_dir: Path, renewals: int, seed: int, function: str = "lease_cpu.time_renewals"
) -> dict[str, Any]:
    """``function(renewals, seed)`` (a bench module's, by dotted name) in a child process
    with ``operator_dir`` first on the path; its JSON answer."""
    module, name = function.rsplit(".", 1)
    code = (
        "import json, sys; sys.path.insert(0, sys.argv[1]); sys.path.insert(0, sys.argv[2]);"
        f"from {module} import {name} as r;"
        "print(json.dumps(r(int(sys.argv[3]), int(sys.argv[4]))))"
    )
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    out = subprocess.run(
        [
            sys.executable,
            "-c",
            code,
            str(Path(__file__).parent),
            str(operator_dir),
            str(renewals),
            str(seed),
        ],
        check=True,
        capture_output=True,
        text=True,
        env=env,
        cwd=tempfile.gettempdir(),  # not the repo: the installed kvpool must not shadow
    )
    result: dict[str, Any] = json.loads(out.stdout.strip().splitlines()[-1])
    return result


class BaselineError(Exception):
    """The baseline commit cannot be read from this clone."""


def extract(commit: str, into: Path) -> Path:
    """``commit``'s ``operator/`` directory, unpacked under ``into``."""
    archive = into / "baseline.tar"
    with archive.open("wb") as handle:
        done = subprocess.run(
            ["git", "-C", str(REPO), "archive", commit, "operator"],
            check=False,
            stdout=handle,
            stderr=subprocess.PIPE,
            text=True,
        )
    if done.returncode != 0:
        raise BaselineError(
            f"--baseline {commit}: git cannot read that commit here ({done.stderr.strip()});"
            " pass a commit of this clone (git log --oneline), or fetch the full history"
            " (git fetch --unshallow)"
        )
    with tarfile.open(archive) as tar:
        tar.extractall(into, filter="data")
    return into / "operator"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--baseline", default="fed6cd2", help="commit to compare against")
    parser.add_argument("--renewals", type=int, default=400, help="renewals a repetition")
    parser.add_argument("--rounds", type=int, default=3, help="alternating runs of each")
    parser.add_argument("--seed", type=int, default=7)
    parser.add_argument("--output", type=Path, default=RESULTS)
    args = parser.parse_args()
    load_before = os.getloadavg()
    runs: dict[str, list[dict[str, float]]] = {"baseline": [], "current": []}
    with tempfile.TemporaryDirectory() as tmp:
        mismatch = planner_mismatch(Path(tmp))
        if mismatch is not None:
            print(f"lease_cpu: error: {mismatch}", file=sys.stderr)
            return 2
        try:
            baseline = extract(args.baseline, Path(tmp))
        except BaselineError as exc:
            print(f"lease_cpu: error: {exc}", file=sys.stderr)
            return 2
        versions = {"baseline": baseline, "current": REPO / "operator"}
        for _ in range(args.rounds):
            for name, path in versions.items():
                runs[name].append(run_version(path, args.renewals, args.seed))
    figures = {
        name: {
            "cpu_ms_per_renewal": sorted(r["cpu_ms_per_renewal"] for r in rs)[len(rs) // 2],
            "per_round": [r["cpu_ms_per_renewal"] for r in rs],
            "checksum": rs[0]["checksum"],
        }
        for name, rs in runs.items()
    }
    base, cur = figures["baseline"], figures["current"]
    result = {
        "benchmark": "lease_cpu",
        "when": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "machine": machine_info(load_before),
        "params": vars(args) | {"output": str(args.output), "members": MEMBERS},
        "versions": figures,
        "current_vs_baseline": round(cur["cpu_ms_per_renewal"] / base["cpu_ms_per_renewal"], 3),
        "same_leases": base["checksum"] == cur["checksum"],
    }
    print(f"{'version':10} {'CPU ms a renewal':>17}  per round")
    for name, f in figures.items():
        print(f"{name:10} {f['cpu_ms_per_renewal']:17.3f}  {f['per_round']}")
    print(
        f"current / baseline: {result['current_vs_baseline']}x;"
        f" same leases: {result['same_leases']}"
    )
    print(f"wrote {write_results(args.output, result)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
