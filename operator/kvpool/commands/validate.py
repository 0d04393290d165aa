"""``kvpool validate -f PATH ...``: check manifests before they reach a cluster.

Prints one line per problem, ``FILE: Kind/name: field.path: reason``, and exits 1; or
prints ``N objects valid`` and exits 0. Exit 2 is a usage error (no ``-f``). The checks
are those of :mod:`kvpool.api.validation` (schema, CEL rules, semantics, references
across the given objects); loading is :mod:`kvpool.commands.manifests`.
"""

from __future__ import annotations

import argparse
import sys

from kvpool.commands.manifests import load_and_validate


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


def run(args: argparse.Namespace) -> int:
    if not args.paths:
        print("kvpool validate: error: give at least one -f PATH", file=sys.stderr)
        return 2
    validated = load_and_validate(args.paths)
    for problem in validated.problems:
        print(problem.format())
    if validated.problems:
        count = len(validated.problems)
        print(f"{count} problem{'s' if count != 1 else ''} found", file=sys.stderr)
        return 1
    count = validated.object_count
    print(f"{count} object{'s' if count != 1 else ''} valid")
    return 0
