"""``kvpool plan``: validate manifests, then print each ModelPool's admission plan.

This is how a platform team previews what the operator will do before applying
anything: the warm replicas, the KV tokens per replica planned with (and where the
figure came from), the live sequences per replica, and per tier the floor tokens and
slots, the lendable part and the shared remainder, with capacity-short warnings.

``-o json`` is a stable interface for scripts (``formatVersion`` 1, documented in the
README); ``-o yaml`` is the same document as YAML; ``-o table`` is for humans. The
document is printed whatever happens: manifests that fail validation give ``ok: false``,
their ``problems`` and no pools, and a pool that cannot be planned has every figure
``null``.

Exit codes: 0 every pool planned; 1 a problem (or, with ``--strict``, a capacity-short
pool or tier: its peaks do not fit in ``maxReplicas``), so CI can gate on it; 2 usage.
"""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any

import yaml

from kvpool.adapters.manifests import load_and_validate
from kvpool.api.modelpool import ModelPool
from kvpool.api.tierpolicy import TierPolicy
from kvpool.api.validation import Problem
from kvpool.domain.planner import PlanError, PoolPlan, plan_pool

PLAN_FORMAT_VERSION = 1


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "-f",
        "--filename",
        action="append",
        required=True,
        metavar="PATH",
        help="manifest file or directory (repeatable)",
    )
    parser.add_argument(
        "--kv-tokens-per-replica",
        type=int,
        default=None,
        metavar="N",
        help="plan every pool with this KV capacity per replica instead of its declared figure",
    )
    parser.add_argument("-o", "--output", choices=["table", "yaml", "json"], default="table")
    parser.add_argument(
        "--strict",
        action="store_true",
        help="exit 1 when a pool or tier is capacity-short (its peak does not fit in "
        "maxReplicas), for CI",
    )


def _problem_entry(problem: Problem) -> dict[str, str]:
    return {
        "file": problem.file,
        "kind": problem.kind,
        "name": problem.name,
        "path": problem.path,
        "reason": problem.reason,
        "line": problem.format(),
    }


def run(args: argparse.Namespace) -> int:
    if args.kv_tokens_per_replica is not None and args.kv_tokens_per_replica < 1:
        print("error: --kv-tokens-per-replica must be a positive integer", file=sys.stderr)
        return 2
    resources = load_and_validate(args.filename)
    for warning in resources.warnings:
        print(f"warning: {warning.format()}", file=sys.stderr)
    if resources.problems:
        for problem in resources.problems:
            print(problem.format(), file=sys.stderr)
        print(f"{len(resources.problems)} problem(s): no plan", file=sys.stderr)
        report: dict[str, Any] = {
            "formatVersion": PLAN_FORMAT_VERSION,
            "ok": False,
            "problems": [_problem_entry(p) for p in resources.problems],
            "pools": [],
        }
    else:
        report = build_plan_report(
            resources.pools, resources.tier_policies, args.kv_tokens_per_replica
        )
    if args.output == "json":
        print(json.dumps(report, indent=2))
    elif args.output == "yaml":
        print(yaml.safe_dump(report, sort_keys=False), end="")
    elif report["ok"] or report["pools"]:
        print(render_table(report), end="")
    if not report["ok"]:
        return 1
    short = [f"{p['namespace']}/{p['name']}" for p in report["pools"] if p["capacityShort"]]
    if args.strict and short:
        print(
            f"--strict: capacity-short: {', '.join(short)} (raise capacity.maxReplicas or "
            "lower capacity.peakConcurrency)",
            file=sys.stderr,
        )
        return 1
    return 0


def build_plan_report(
    pools: list[ModelPool], policies: list[TierPolicy], kv_override: int | None
) -> dict[str, Any]:
    """The plan of every pool as a JSON-able document (the ``-o json`` format)."""
    by_key = {(p.metadata.namespace or "default", p.metadata.name): p for p in policies}
    entries = []
    for pool in sorted(pools, key=lambda p: (p.metadata.namespace or "default", p.metadata.name)):
        namespace = pool.metadata.namespace or "default"
        policy = by_key[(namespace, pool.spec.tier_policy_ref.name)]
        result = plan_pool(pool, policy, kv_override)
        entries.append(_pool_entry(pool, namespace, result, overridden=kv_override is not None))
    return {
        "formatVersion": PLAN_FORMAT_VERSION,
        "ok": all(entry["ok"] for entry in entries),
        "problems": [],
        "pools": entries,
    }


# The figures of a planned pool; a pool that cannot be planned has each of them null.
POOL_FIGURES = (
    "replicas",
    "kvTokensPerReplica",
    "kvSource",
    "usableTokensPerReplica",
    "liveSequencesPerReplica",
    "slotsPerReplica",
    "totalTokens",
    "totalSlots",
    "sharedTokens",
    "sharedSlots",
    "capacityShort",
)


def _pool_entry(
    pool: ModelPool, namespace: str, result: PoolPlan | PlanError, *, overridden: bool
) -> dict[str, Any]:
    entry: dict[str, Any] = {
        "namespace": namespace,
        "name": pool.metadata.name,
        "tierPolicy": pool.spec.tier_policy_ref.name,
    }
    if isinstance(result, PlanError):
        return (
            entry
            | {"ok": False, "error": {"reason": result.reason, "message": result.message}}
            | dict.fromkeys(POOL_FIGURES)
            | {"warnings": [], "tiers": []}
        )
    return entry | {
        "ok": True,
        "error": None,
        "replicas": result.replicas,
        "kvTokensPerReplica": result.kv_tokens_per_replica,
        "kvSource": "Override" if overridden else result.kv_source,
        "usableTokensPerReplica": result.usable_tokens_per_replica,
        "liveSequencesPerReplica": result.live_sequences_per_replica,
        "slotsPerReplica": result.slots_per_replica,
        "totalTokens": result.total_tokens,
        "totalSlots": result.total_slots,
        "sharedTokens": result.shared_tokens,
        "sharedSlots": result.shared_slots,
        "capacityShort": result.capacity_short,
        "warnings": list(result.warnings),
        "tiers": [
            {
                "name": t.name,
                "floorPercent": t.floor_percent,
                "floorTokens": t.floor_tokens,
                "floorSlots": t.floor_slots,
                "lendableTokens": t.lendable_tokens,
                "lendableSlots": t.lendable_slots,
                "peak": t.peak,
                "requiredReplicas": t.required_replicas,
                "capacityShort": t.capacity_short,
            }
            for t in result.tiers
        ],
    }


_COLUMNS = (
    ("TIER", "name", "<"),
    ("FLOOR%", "floorPercent", ">"),
    ("FLOOR TOKENS", "floorTokens", ">"),
    ("FLOOR SLOTS", "floorSlots", ">"),
    ("LENDABLE TOKENS", "lendableTokens", ">"),
    ("LENDABLE SLOTS", "lendableSlots", ">"),
    ("PEAK", "peak", ">"),
    ("NEEDS REPLICAS", "requiredReplicas", ">"),
)


def _cell(value: Any) -> str:
    if value is None:
        return "-"
    if isinstance(value, bool):
        return "yes" if value else ""
    if isinstance(value, int):
        return f"{value:,}"
    return str(value)


def render_table(report: dict[str, Any]) -> str:
    """Human-readable plan, one block per pool."""
    lines: list[str] = []
    for pool in report["pools"]:
        lines.append(
            f"ModelPool {pool['namespace']}/{pool['name']}  (TierPolicy {pool['tierPolicy']})"
        )
        if not pool["ok"]:
            lines.append(f"  NO PLAN ({pool['error']['reason']}): {pool['error']['message']}")
            lines.append("")
            continue
        lines.append(
            f"  warm replicas {pool['replicas']}   KV tokens/replica "
            f"{pool['kvTokensPerReplica']:,} ({pool['kvSource'].lower()}), usable "
            f"{pool['usableTokensPerReplica']:,}   live p95 sequences/replica "
            f"{pool['liveSequencesPerReplica']} (sizing)   admission slots/replica "
            f"{pool['slotsPerReplica']} (maxNumSeqs)"
        )
        lines.append(f"  pool total {pool['totalTokens']:,} tokens, {pool['totalSlots']:,} slots")
        rows = [[_cell(tier[key]) for _, key, _ in _COLUMNS] for tier in pool["tiers"]]
        shared = ["(shared)", "", _cell(pool["sharedTokens"]), _cell(pool["sharedSlots"])]
        rows.append(shared + [""] * (len(_COLUMNS) - len(shared)))
        header = [title for title, _, _ in _COLUMNS]
        widths = [max(len(r[i]) for r in [header, *rows]) for i in range(len(_COLUMNS))]
        for row in [header, *rows]:
            cells = [
                f"{value:{align}{width}}"
                for value, width, (_, _, align) in zip(row, widths, _COLUMNS, strict=True)
            ]
            lines.append("  " + "  ".join(cells).rstrip())
        lines.extend(f"  ! {warning}" for warning in pool["warnings"])
        lines.append("")
    return "\n".join(lines) + ("\n" if lines else "")
