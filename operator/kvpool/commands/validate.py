"""``kvpool validate -f PATH ... [--require-secrets]``: check manifests before they reach a cluster.

Prints one line per problem, ``FILE: Kind/name: field.path: reason``, and exits 1; or
prints ``N objects valid`` and exits 0. Warnings (a TenantBudget's Secret that is not in
the manifests: External Secrets or SOPS may create it in the cluster) are printed as
``warning: FILE: ...`` lines and do not fail the run unless ``--require-secrets`` is
given. Documents of other kinds (a Deployment, a kustomization file) are skipped, with
one ``note:`` line on stderr. Exit 2 is a usage error (no ``-f``). The checks are those
of :mod:`kvpool.api.validation` (schema, CEL rules, semantics, references across the
given objects); loading is :mod:`kvpool.adapters.manifests`.
"""

from __future__ import annotations

import argparse
import sys

from kvpool.adapters.manifests import load_and_validate, skipped_note


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "-f",
        "--filename",
        dest="paths",
        action="append",
        default=[],
        metavar="PATH",
        help="a manifest file, or a directory searched for *.yaml/*.yml; repeatable; - is stdin",
    )
    parser.add_argument(
        "--require-secrets",
        action="store_true",
        help="a TenantBudget's Secret missing from the manifests is an error, not a warning",
    )


def _plural(count: int, noun: str) -> str:
    return f"{count} {noun}{'s' if count != 1 else ''}"


def run(args: argparse.Namespace) -> int:
    if not args.paths:
        print("kvpool validate: error: give at least one -f PATH", file=sys.stderr)
        return 2
    validated = load_and_validate(args.paths, require_secrets=args.require_secrets)
    for problem in validated.problems:
        print(problem.format())
    for warning in validated.warnings:
        print(f"warning: {warning.format()}")
    if validated.skipped:
        print(f"note: {skipped_note(validated.skipped)}", file=sys.stderr)
    if validated.problems:
        print(f"{_plural(len(validated.problems), 'problem')} found", file=sys.stderr)
        return 1
    summary = f"{_plural(validated.object_count, 'object')} valid"
    if validated.warnings:
        summary += f" ({_plural(len(validated.warnings), 'warning')})"
    print(summary)
    return 0
