"""``kvpool tenant create NAME --tier T --tokens-per-minute N [--apply]``: a new tenant.

Why it exists: a tenant is two objects that must agree (a labelled Secret holding a fresh
random API key, and a TenantBudget referencing it), and hand-written ones get the label,
the key reference or the tier names wrong. This command writes both, checked with the
checks of ``kvpool validate`` before anything is printed or applied:

    kvpool tenant create chat-product -n llm --tier interactive --tier batch \\
        --tokens-per-minute 2000000 --label kvpool.dev/workload=interactive > tenant.yaml
    kvpool tenant create chat-product -n llm --tier interactive --tokens-per-minute 2000000 --apply

Without ``--apply`` it prints the two manifests (the key is in the Secret's
``stringData``: commit it only through a secret manager). With ``--apply`` it pipes them
to ``kubectl apply -f -`` and prints the key once, on stdout, for the tenant's owner.

Exit codes: 0 done; 1 kubectl failed; 2 usage (a value the CRD would refuse, named).
"""

from __future__ import annotations

import argparse
import secrets
import subprocess
import sys
from typing import Any

import yaml

from kvpool.api.common import API_VERSION
from kvpool.api.tenantbudget import API_KEY_SECRET_LABEL
from kvpool.api.validation import check_custom_object

KEY_PREFIX = "kvp_"  # recognisable in a leaked log or a secret scanner's rules
SECRET_KEY = "api-key"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("action", choices=["create"], help="create a tenant (Secret + budget)")
    parser.add_argument("name", help="tenant id (also the TenantBudget's name)")
    parser.add_argument("-n", "--namespace", default="default", help="namespace (default)")
    parser.add_argument(
        "--tier",
        dest="tiers",
        action="append",
        default=[],
        required=True,
        metavar="TIER",
        help="a tier the tenant may use (repeatable)",
    )
    parser.add_argument(
        "--tokens-per-minute", type=int, required=True, metavar="N", help="token budget per minute"
    )
    parser.add_argument("--requests-per-minute", type=int, default=None, metavar="N")
    parser.add_argument(
        "--tokens-per-day", type=int, default=None, metavar="N", help="a second, daily budget"
    )
    parser.add_argument("--max-concurrency", type=int, default=None, metavar="N")
    parser.add_argument("--weight", type=int, default=None, metavar="N")
    parser.add_argument("--over-budget", choices=["Reject", "Demote"], default=None)
    parser.add_argument(
        "--policy", default=None, help="TierPolicy (when the namespace has several)"
    )
    parser.add_argument(
        "--label",
        dest="labels",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="a TenantBudget label (what tenantSelector rules match; repeatable)",
    )
    parser.add_argument(
        "--secret-name", default=None, help="the Secret's name (default: tenant-NAME)"
    )
    parser.add_argument("--apply", action="store_true", help="kubectl apply them instead")
    parser.add_argument("--kubectl", default="kubectl", help="the kubectl to run (--apply)")
    parser.add_argument(
        "--kubectl-arg",
        dest="kubectl_args",
        action="append",
        default=[],
        metavar="ARG",
        help="an argument for kubectl apply, e.g. --kubectl-arg=--context=prod (repeatable)",
    )


def new_api_key() -> str:
    """A fresh random key: 32 bytes from the OS's CSPRNG, URL-safe, with kvpool's prefix."""
    return KEY_PREFIX + secrets.token_urlsafe(32)


def build_tenant_manifests(args: argparse.Namespace, key: str) -> list[dict[str, Any]]:
    """The Secret holding ``key`` and the TenantBudget referencing it (pure)."""
    secret_name = args.secret_name or f"tenant-{args.name}"
    limits: list[dict[str, Any]] = [{"window": "1m", "tokens": args.tokens_per_minute}]
    if args.requests_per_minute is not None:
        limits[0]["requests"] = args.requests_per_minute
    if args.tokens_per_day is not None:
        limits.append({"window": "1d", "tokens": args.tokens_per_day})
    spec: dict[str, Any] = {
        "tenant": args.name,
        "apiKeySecretRef": {"name": secret_name, "key": SECRET_KEY},
        "tiers": list(args.tiers),
        "limits": limits,
    }
    optional = {
        "tierPolicyRef": {"name": args.policy} if args.policy else None,
        "maxConcurrency": args.max_concurrency,
        "weight": args.weight,
        "overBudget": args.over_budget,
    }
    spec.update({k: v for k, v in optional.items() if v is not None})
    labels = dict(label.split("=", 1) for label in args.labels)
    budget_meta: dict[str, Any] = {"name": args.name, "namespace": args.namespace}
    if labels:
        budget_meta["labels"] = labels
    return [
        {
            "apiVersion": "v1",
            "kind": "Secret",
            "metadata": {
                "name": secret_name,
                "namespace": args.namespace,
                "labels": {API_KEY_SECRET_LABEL: "true"},
            },
            "type": "Opaque",
            "stringData": {SECRET_KEY: key},
        },
        {"apiVersion": API_VERSION, "kind": "TenantBudget", "metadata": budget_meta, "spec": spec},
    ]


def _spec_problems(budget: dict[str, Any]) -> list[str]:
    """What the CRD (and kvpool validate) would refuse in the TenantBudget, with the path."""
    _, findings = check_custom_object(budget)
    return [f"{f.path}: {f.reason}" if f.path else f.reason for f in findings]


def run(args: argparse.Namespace) -> int:
    bad_labels = [label for label in args.labels if "=" not in label]
    if bad_labels:
        print(
            f"kvpool tenant: error: --label {bad_labels[0]!r}: expected KEY=VALUE", file=sys.stderr
        )
        return 2
    key = new_api_key()
    documents = build_tenant_manifests(args, key)
    problems = _spec_problems(documents[1])
    if problems:
        for problem in problems:
            print(f"kvpool tenant: error: TenantBudget/{args.name}: {problem}", file=sys.stderr)
        return 2
    text = yaml.safe_dump_all(documents, sort_keys=False)
    if not args.apply:
        sys.stdout.write(text)
        return 0
    command = [args.kubectl, "apply", *args.kubectl_args, "-f", "-"]
    try:
        done = subprocess.run(command, input=text, text=True, capture_output=True, check=False)
    except OSError as error:
        print(f"kvpool tenant: error: cannot run {args.kubectl}: {error}", file=sys.stderr)
        return 1
    sys.stderr.write(done.stdout + done.stderr)
    if done.returncode != 0:
        print(f"kvpool tenant: error: kubectl apply exited {done.returncode}", file=sys.stderr)
        return 1
    secret = documents[0]["metadata"]["name"]
    print(
        f"API key of tenant {args.name} (stored only in Secret {args.namespace}/{secret}, "
        "shown once):",
        file=sys.stderr,
    )
    print(key)
    return 0
