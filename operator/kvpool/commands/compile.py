"""``kvpool compile -f PATH... --endpoints POOL=URL[,URL]... [-o config.json]``.

Why it exists: the gateway can run without Kubernetes (``kvpool gateway --config FILE``)
but needs the compiled admission config of docs/0002, which only the operator produced.
This command compiles the manifests exactly as the operator would publish them
(:mod:`kvpool.adapters.offline_compile`): the pools planned on their declared KV capacity
(or ``--kv-tokens-per-replica``), the engines at the ``--endpoints`` given, tenant keys
from the manifests' Secrets or from ``--key-file SECRET/KEY=PATH`` files (a GitOps repo
keeps no Secrets; only the SHA-256 digest of a key is written).

    kvpool compile -f manifests/ --endpoints llama-8b=http://10.0.0.7:8000,http://10.0.0.8:8000 \\
        --key-file tenant-chat-product/api-key=/run/secrets/chat-key -o config.json
    kvpool gateway --config config.json --redis redis://redis:6379/0

Warnings (a pool without endpoints or plan, a tenant left out without a key) go to stderr;
``--strict`` makes them fail. Exit codes: 0 written; 1 the manifests have problems (printed
as ``kvpool validate`` prints them) or a warning under ``--strict``; 2 a flag value that
cannot be used (named, with the fix).
"""

from __future__ import annotations

import argparse
import datetime
import sys
from pathlib import Path

from kvpool.adapters.offline_compile import (
    OfflineCompileError,
    compile_manifests,
    parse_endpoint_flags,
    parse_key_file_flags,
)
from kvpool.adapters.offline_flags import add_engine_and_key_flags


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "-f",
        "--filename",
        dest="paths",
        action="append",
        default=[],
        metavar="PATH",
        help="manifest file or directory (repeatable; other kinds are skipped)",
    )
    add_engine_and_key_flags(parser)
    parser.add_argument("-n", "--namespace", default=None, help="the namespace to compile")
    parser.add_argument(
        "--kv-tokens-per-replica",
        type=int,
        default=None,
        metavar="N",
        help="plan every pool with this KV capacity per replica instead of its declared one",
    )
    parser.add_argument("-o", "--output", default="-", metavar="FILE", help="default: stdout")
    parser.add_argument("--strict", action="store_true", help="a warning fails the run")


def now_rfc3339() -> str:
    return datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def run(args: argparse.Namespace) -> int:
    if not args.paths:
        print("kvpool compile: error: give at least one -f PATH", file=sys.stderr)
        return 2
    if args.kv_tokens_per_replica is not None and args.kv_tokens_per_replica < 1:
        print("kvpool compile: error: --kv-tokens-per-replica must be positive", file=sys.stderr)
        return 2
    try:
        result = compile_manifests(
            args.paths,
            parse_endpoint_flags(args.endpoints),
            parse_key_file_flags(args.key_files),
            namespace=args.namespace,
            kv_tokens_per_replica=args.kv_tokens_per_replica,
            generated_at=now_rfc3339(),
        )
    except OfflineCompileError as error:
        print(f"kvpool compile: error: {error}", file=sys.stderr)
        return 2
    for problem in result.problems:
        print(problem.format(), file=sys.stderr)
    if result.config is None:
        print(f"{len(result.problems)} problem(s): nothing compiled", file=sys.stderr)
        return 1
    for warning in result.warnings:
        print(warning, file=sys.stderr)
    if args.strict and result.warnings:
        print(f"--strict: {len(result.warnings)} warning(s): nothing written", file=sys.stderr)
        return 1
    text = result.config.to_json() + "\n"
    if args.output == "-":
        sys.stdout.write(text)
    else:
        Path(args.output).write_text(text, encoding="utf-8")
    config = result.config
    print(
        f"compiled namespace {config.namespace}: {len(config.pools)} pools, "
        f"{len(config.tier_policies)} tier policies, {len(config.tenants)} tenants"
        + ("" if args.output == "-" else f" -> {args.output}"),
        file=sys.stderr,
    )
    return 0
