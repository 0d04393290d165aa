"""``kubectl kvpool rollout status|promote|abort|resume|pause NAME [-n NS]``.

Why it exists: a canary rollout is driven by the operator from ``status.rollout``; a human
needs to see where it stands (steps, weight, every gate with its figures, why it is
paused) and to act on it without editing the spec (GitOps tools must see no drift). The
actions merge-patch the annotation ``kvpool.dev/rollout: ACTION@<unix ms>`` on the
ModelPool; the timestamp suffix makes a repeated action a new value, which the operator
handles once and records in ``status.rollout.handledAction``.

Installed as the console script ``kubectl-kvpool`` (so ``kubectl kvpool ...`` finds it on
the PATH) and as ``kvpool rollout ...``. It talks to the API server with the operator's
own client (kubeconfig: ``--kubeconfig``, ``$KUBECONFIG``, ``~/.kube/config``, in-cluster).

Exit codes: 0 done; 1 the pool does not exist or the API call failed; 2 usage.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import time
from collections.abc import Mapping, Sequence
from typing import Any

from kvpool.adapters import kube
from kvpool.domain.manifests import ANNOTATION_ROLLOUT
from kvpool.domain.rollout.machine import ACTIONS

VERBS = ("status", *ACTIONS)  # show the rollout, or one of the actions the operator handles


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("verb", choices=VERBS, help="show the rollout, or act on it")
    parser.add_argument("name", help="ModelPool name")
    parser.add_argument("-n", "--namespace", default="default", help="namespace (default)")
    parser.add_argument("--kubeconfig", default=None, help="kubeconfig path")
    parser.add_argument("--context", default=None, help="kubeconfig context")
    parser.add_argument("-o", "--output", choices=("text", "json"), default="text")


def _fmt(value: Any) -> str:
    if value is None:
        return "-"
    if isinstance(value, float):
        return f"{value:.4g}"
    return str(value)


def render_status(pool: Mapping[str, Any]) -> str:
    """The rollout of a ModelPool object for humans (pure: the object in, text out).

    >>> print(render_status({"metadata": {"name": "chat"}, "spec": {}, "status": {}}))
    ModelPool chat: no rollout recorded yet (the operator has not reconciled it)
    """
    name = pool.get("metadata", {}).get("name", "?")
    rollout = (pool.get("status") or {}).get("rollout")
    if not rollout:
        return f"ModelPool {name}: no rollout recorded yet (the operator has not reconciled it)"
    steps = ((pool.get("spec") or {}).get("rollout") or {}).get("steps") or [
        {"weight": 10, "pause": "5m"},
        {"weight": 50, "pause": "10m"},
    ]
    phase = rollout.get("phase", "?")
    stage = f"/{rollout['stage']}" if rollout.get("stage") else ""
    reason = f" ({rollout['reason']})" if rollout.get("reason") else ""
    lines = [
        f"ModelPool {name}: {phase}{stage}{reason}",
        f"  stable revision: {_fmt(rollout.get('stableRevision'))}",
        f"  canary revision: {_fmt(rollout.get('canaryRevision'))}",
        f"  canary weight:   {rollout.get('weight', 0)}%   canary replicas: "
        f"{rollout.get('canaryReplicas', 0)}",
    ]
    if rollout.get("replicasAfterPromotion") is not None:
        short = (
            " (capacity short: maxReplicas too low)"
            if rollout.get("capacityShortAfterPromotion")
            else ""
        )
        lines.append(
            f"  after promotion: {rollout['replicasAfterPromotion']} warm replicas needed{short}"
        )
    if rollout.get("message"):
        lines.append(f"  message: {rollout['message']}")
    if phase == "Paused":
        lines.append(
            f"  paused because: {rollout.get('reason')} - act with `kubectl kvpool rollout "
            f"resume|promote|abort {name}`"
        )
    current = rollout.get("step")
    lines.append("  steps:")
    for index, step in enumerate(steps):
        mark = "->" if index == current and phase in ("Progressing", "Paused") else "  "
        lines.append(f"   {mark} {index + 1}. weight {step.get('weight')}% for {step.get('pause')}")
    gates = rollout.get("gates") or []
    if gates:
        lines.append("  gates:")
        lines.append(
            f"    {'GATE':<22} {'VERDICT':<13} {'STABLE':>9} {'CANARY':>9} {'RATIO':>7} "
            f"{'LIMIT':>6} {'SAMPLES s/c':>12} {'FAILS':>5}"
        )
        for g in gates:
            samples = (
                f"{_fmt(g.get('stableSamples'))}/{_fmt(g.get('canarySamples'))}"
                if g.get("stableSamples") is not None
                else "-"
            )
            lines.append(
                f"    {g.get('gate', '?'):<22} {g.get('verdict', '?'):<13} "
                f"{_fmt(g.get('stable')):>9} {_fmt(g.get('canary')):>9} "
                f"{_fmt(g.get('ratio')):>7} {_fmt(g.get('threshold')):>6} {samples:>12} "
                f"{g.get('failures', 0):>5}"
            )
            if g.get("verdict") != "Successful" and g.get("message"):
                lines.append(f"      {g['message']}")
    return "\n".join(lines)


async def _run(args: argparse.Namespace) -> int:
    client = kube.KubeClient(kube.load_connection(args.kubeconfig, args.context), attempts=3)
    try:
        if args.verb == "status":
            body = await client.get(kube.MODELPOOLS, args.namespace, args.name)
            if body is None:
                print(f"ModelPool {args.namespace}/{args.name} not found", file=sys.stderr)
                return 1
            if args.output == "json":
                print(json.dumps((body.get("status") or {}).get("rollout"), indent=2))
            else:
                print(render_status(body))
            return 0
        value = f"{args.verb}@{int(time.time() * 1000)}"
        patched = await client.merge_patch(
            kube.MODELPOOLS,
            args.namespace,
            args.name,
            {"metadata": {"annotations": {ANNOTATION_ROLLOUT: value}}},
        )
        if patched is None:
            print(f"ModelPool {args.namespace}/{args.name} not found", file=sys.stderr)
            return 1
        print(f"modelpool.kvpool.dev/{args.name} annotated {ANNOTATION_ROLLOUT}={value}")
        return 0
    except kube.ApiError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    finally:
        await client.close()


def run(args: argparse.Namespace) -> int:
    return asyncio.run(_run(args))


def main(argv: Sequence[str] | None = None) -> int:
    """``kubectl-kvpool rollout VERB NAME`` (the kubectl plugin's entry point)."""
    parser = argparse.ArgumentParser(
        prog="kubectl kvpool", description="kvpool kubectl plugin: canary rollouts"
    )
    sub = parser.add_subparsers(dest="group", required=True, metavar="GROUP")
    add_arguments(sub.add_parser("rollout", help="show or act on a ModelPool's rollout"))
    args = parser.parse_args(list(sys.argv[1:] if argv is None else argv))
    return run(args)


if __name__ == "__main__":
    sys.exit(main())
