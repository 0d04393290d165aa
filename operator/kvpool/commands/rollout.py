"""``kubectl kvpool rollout status|list|promote|abort|resume|pause [NAME] [-n NS]``.

Why it exists: a canary rollout is driven by the operator from ``status.rollout``; a human
needs to see where it stands (steps, weight, every gate with its figures, why it is
paused) and to act on it without editing the spec (GitOps tools must see no drift). The
actions merge-patch the annotation ``kvpool.dev/rollout: ACTION@<unix ms>`` on the
ModelPool; the timestamp suffix makes a repeated action a new value, which the operator
handles once and records in ``status.rollout.handledAction``.

- ``status NAME [--watch]``: the rollout; ``--watch`` prints it again on every change
  until the rollout ends (exit 0 when it is promoted or idle, 1 when it is aborted);
- ``list [-A]``: one line per ModelPool of the namespace (or every namespace);
- ``promote|abort|resume|pause NAME``: an action the operator would ignore in the
  rollout's phase (``abort`` with no rollout in progress...) is refused with exit 1 and
  the reason (:mod:`kvpool.domain.rollout.actions`), instead of an annotation nobody acts on.

The namespace is ``-n``, else the kubeconfig context's namespace (as kubectl does), else
the service account's namespace in a pod, else ``default``. Installed as the console
script ``kubectl-kvpool`` (``kubectl kvpool ...`` finds it on the PATH) and as
``kvpool rollout ...``. It talks to the API server with
the operator's own client (kubeconfig: ``--kubeconfig``, ``$KUBECONFIG``,
``~/.kube/config``, in-cluster).

Exit codes: 0 done; 1 the pool does not exist, the action would be ignored, the API call
failed or a watched rollout was aborted; 2 usage; 130 interrupted.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from kvpool.adapters import kube
from kvpool.domain.manifests import ANNOTATION_ROLLOUT
from kvpool.domain.rollout.actions import ACTIONS, assess_action

VERBS = ("status", "list", *ACTIONS)  # show or list rollouts, or an action the operator handles
SA_NAMESPACE = Path("/var/run/secrets/kubernetes.io/serviceaccount/namespace")
FINAL_PHASES = {"Idle": 0, "Promoted": 0, "Aborted": 1}  # phase -> exit code of --watch


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("verb", choices=VERBS, help="show or list rollouts, or act on one")
    parser.add_argument("name", nargs="?", help="ModelPool name (all but list)")
    parser.add_argument(
        "-n",
        "--namespace",
        default=None,
        help="namespace (default: the kubeconfig context's, else default)",
    )
    parser.add_argument("-A", "--all-namespaces", action="store_true", help="list: every namespace")
    parser.add_argument(
        "-w", "--watch", action="store_true", help="status: print every change until it ends"
    )
    parser.add_argument(
        "--interval", type=float, default=2.0, help="--watch: seconds between reads (default 2)"
    )
    parser.add_argument("--kubeconfig", default=None, help="kubeconfig path")
    parser.add_argument("--context", default=None, help="kubeconfig context")
    parser.add_argument("-o", "--output", choices=("text", "json"), default="text")


def resolve_namespace(
    flag: str | None, kubeconfig: str | None = None, context: str | None = None
) -> str:
    """``-n``, else the kubeconfig context's namespace, else the pod's, else ``default``."""
    if flag:
        return flag
    from kubernetes import config  # only parses the file

    path = kubeconfig or os.environ.get("KUBECONFIG") or str(Path.home() / ".kube" / "config")
    first = path.split(os.pathsep)[0]
    if Path(first).exists():
        try:
            contexts, active = config.list_kube_config_contexts(config_file=first)  # type: ignore[no-untyped-call]
        except config.ConfigException:
            contexts, active = [], None
        chosen = (
            next((c for c in contexts if c.get("name") == context), None) if context else active
        )
        namespace = ((chosen or {}).get("context") or {}).get("namespace")
        if namespace:
            return str(namespace)
        return "default"
    if SA_NAMESPACE.exists():
        return SA_NAMESPACE.read_text(encoding="utf-8").strip() or "default"
    return "default"


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
    namespace = pool.get("metadata", {}).get("namespace") or "default"
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
            f"resume|promote|abort {name} -n {namespace}`"
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


LIST_COLUMNS = ("NAME", "PHASE", "STAGE", "STEP", "WEIGHT", "STABLE", "CANARY", "REASON")


def render_list(pools: Sequence[Mapping[str, Any]], all_namespaces: bool) -> str:
    """One line per pool: its rollout at a glance (pure).

    >>> print(render_list([{"metadata": {"name": "chat"}, "status": {"rollout": {
    ...     "phase": "Paused", "stage": "Analyzing", "step": 0, "steps": 2, "weight": 10,
    ...     "stableRevision": "aaa", "canaryRevision": "bbb", "reason": "ManualPause"}}}], False))
    NAME  PHASE   STAGE      STEP  WEIGHT  STABLE  CANARY  REASON
    chat  Paused  Analyzing  1/2   10%     aaa     bbb     ManualPause
    """
    header = (("NAMESPACE",) if all_namespaces else ()) + LIST_COLUMNS
    rows = [header]
    for pool in pools:
        meta = pool.get("metadata") or {}
        r = (pool.get("status") or {}).get("rollout") or {}
        step = f"{r['step'] + 1}/{r.get('steps') or '?'}" if r.get("step") is not None else "-"
        row = (
            str(meta.get("name", "?")),
            str(r.get("phase") or "-"),
            str(r.get("stage") or "-"),
            step,
            f"{r.get('weight', 0)}%",
            str(r.get("stableRevision") or "-"),
            str(r.get("canaryRevision") or "-"),
            str(r.get("reason") or "-"),
        )
        rows.append(((str(meta.get("namespace") or "default"),) if all_namespaces else ()) + row)
    widths = [max(len(row[i]) for row in rows) for i in range(len(header))]
    return "\n".join(
        "  ".join(cell.ljust(width) for cell, width in zip(row, widths, strict=True)).rstrip()
        for row in rows
    )


def _not_found(namespace: str, name: str) -> int:
    print(
        f"ModelPool {namespace}/{name} not found (`kubectl kvpool rollout list -n {namespace}` "
        "lists the pools of a namespace, `-A` of all)",
        file=sys.stderr,
    )
    return 1


async def _status(client: kube.KubeClient, args: argparse.Namespace, namespace: str) -> int:
    body = await client.get(kube.MODELPOOLS, namespace, args.name)
    if body is None:
        return _not_found(namespace, args.name)
    if args.output == "json":
        print(json.dumps((body.get("status") or {}).get("rollout"), indent=2))
    else:
        print(render_status(body))
    return 0


def _settled(body: Mapping[str, Any]) -> int | None:
    """The exit code of ``--watch`` when the rollout has ended, else None (keep watching).

    A status the operator wrote for an older generation says nothing about the spec now
    (a rollout just asked for is still Idle there): keep watching until it catches up.
    """
    status = body.get("status") or {}
    generation = (body.get("metadata") or {}).get("generation")
    observed = status.get("observedGeneration")
    if generation is not None and (observed is None or observed < generation):
        return None
    return FINAL_PHASES.get(str((status.get("rollout") or {}).get("phase")))


async def _watch(client: kube.KubeClient, args: argparse.Namespace, namespace: str) -> int:
    shown: str | None = None
    while True:
        body = await client.get(kube.MODELPOOLS, namespace, args.name)
        if body is None:
            return _not_found(namespace, args.name)
        rollout = (body.get("status") or {}).get("rollout")
        text = json.dumps(rollout) if args.output == "json" else render_status(body)
        if text != shown:
            if shown is not None and args.output == "text":
                print(f"--- {time.strftime('%H:%M:%S')}")
            print(text, flush=True)
            shown = text
        code = _settled(body)
        if code is not None:
            return code
        await asyncio.sleep(args.interval)


async def _list(client: kube.KubeClient, args: argparse.Namespace, namespace: str) -> int:
    scope = None if args.all_namespaces else namespace
    pools = await client.list_objects(kube.MODELPOOLS, scope)
    pools.sort(key=lambda p: ((p["metadata"].get("namespace") or ""), p["metadata"]["name"]))
    if args.output == "json":
        print(
            json.dumps(
                [
                    {
                        "namespace": p["metadata"].get("namespace"),
                        "name": p["metadata"]["name"],
                        "rollout": (p.get("status") or {}).get("rollout"),
                    }
                    for p in pools
                ],
                indent=2,
            )
        )
    elif not pools:
        where = "any namespace" if args.all_namespaces else f"namespace {namespace!r}"
        print(f"no ModelPools in {where}", file=sys.stderr)
    else:
        print(render_list(pools, args.all_namespaces))
    return 0


async def _act(client: kube.KubeClient, args: argparse.Namespace, namespace: str) -> int:
    body = await client.get(kube.MODELPOOLS, namespace, args.name)
    if body is None:
        return _not_found(namespace, args.name)
    phase = ((body.get("status") or {}).get("rollout") or {}).get("phase")
    refusal = assess_action(args.verb, phase)
    if refusal is not None:
        print(
            f"refused: {args.verb} on ModelPool {namespace}/{args.name}: {refusal} (see "
            f"`kubectl kvpool rollout status {args.name} -n {namespace}`)",
            file=sys.stderr,
        )
        return 1
    value = f"{args.verb}@{int(time.time() * 1000)}"
    patched = await client.merge_patch(
        kube.MODELPOOLS,
        namespace,
        args.name,
        {"metadata": {"annotations": {ANNOTATION_ROLLOUT: value}}},
    )
    if patched is None:
        return _not_found(namespace, args.name)
    print(
        f"modelpool.kvpool.dev/{args.name} annotated {ANNOTATION_ROLLOUT}={value} (follow it: "
        f"`kubectl kvpool rollout status {args.name} -n {namespace} --watch`)"
    )
    return 0


def _usage_error(args: argparse.Namespace) -> str | None:
    if args.verb != "list" and not args.name:
        return f"rollout {args.verb} needs a ModelPool NAME"
    if args.verb == "list" and args.name:
        return "rollout list takes no NAME (use -n NS or -A)"
    if args.watch and args.verb != "status":
        return "--watch goes with rollout status"
    if args.all_namespaces and args.verb != "list":
        return "-A goes with rollout list"
    if args.interval <= 0:
        return f"--interval must be positive (got {args.interval:g})"
    return None


async def _run(args: argparse.Namespace) -> int:
    namespace = resolve_namespace(args.namespace, args.kubeconfig, args.context)
    client = kube.KubeClient(kube.load_connection(args.kubeconfig, args.context), attempts=3)
    try:
        if args.verb == "list":
            return await _list(client, args, namespace)
        if args.verb == "status":
            return await (_watch if args.watch else _status)(client, args, namespace)
        return await _act(client, args, namespace)
    except kube.ApiError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    finally:
        await client.close()


def run(args: argparse.Namespace) -> int:
    problem = _usage_error(args)
    if problem is not None:
        print(f"kubectl kvpool: error: {problem}", file=sys.stderr)
        return 2
    try:
        return asyncio.run(_run(args))
    except KeyboardInterrupt:
        return 130


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
