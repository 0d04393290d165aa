"""``kvpool gateway``: run the admission gateway from a config file or the operator's ConfigMap.

Examples::

    kvpool gateway --config admission.json --listen 127.0.0.1:8080
    kvpool gateway --config admission.json --redis redis://127.0.0.1:6379/0
    kvpool gateway --configmap kvpool-system --redis redis://redis:6379/0   # in a pod
    kvpool gateway -f manifests/ --endpoints llama-8b=http://10.0.0.7:8000  # no operator

Flags are checked as they are parsed (a wrong value is one ``error:`` line and exit 2);
``--fail-closed-tier`` is checked against the first config; an address the gateway cannot
listen on is one line naming it and exit 1.

The config is re-read when it changes (file identity, or the ConfigMap's resourceVersion)
and applied without dropping in-flight requests; a config that does not parse is logged,
counted and ignored. SIGTERM/SIGINT stop accepting, let in-flight requests finish (up to
``--shutdown-timeout``) and exit.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import logging
import os
import signal
import sys
from collections.abc import Coroutine
from typing import Any

from aiohttp import web

from kvpool.adapters.budget import (
    BudgetStore,
    FailoverBudgetStore,
    FailoverPolicy,
    InMemoryBudgetStore,
    RedisBudgetStore,
)
from kvpool.adapters.config_source import (
    ConfigError,
    ConfigMapSource,
    FileConfigSource,
    KubeAccess,
)
from kvpool.adapters.lease.store import RedisLeaseStore
from kvpool.adapters.offline_compile import (
    ManifestConfigSource,
    OfflineCompileError,
    parse_endpoint_flags,
    parse_key_file_flags,
)
from kvpool.api.admission_config import AdmissionConfig
from kvpool.domain.lease import LeaseClock
from kvpool.gateway.capacity import CapacityShare, StaticShare
from kvpool.gateway.flags import add_arguments
from kvpool.gateway.http import GatewayRunner
from kvpool.gateway.leases import LeaseKeeper
from kvpool.gateway.metrics import GatewayMetrics
from kvpool.gateway.server import Gateway
from kvpool.gateway.settings import GatewaySettings

__all__ = ["add_arguments", "run"]  # the CLI's subcommand interface (kvpool.cli)

log = logging.getLogger("kvpool.gateway")


def build_store(args: argparse.Namespace, metrics: GatewayMetrics) -> BudgetStore:
    """The budget store the options ask for."""
    if not args.redis:
        return InMemoryBudgetStore()
    members = getattr(args, "live_replicas", None)
    policy = FailoverPolicy(
        fail_closed_tiers=frozenset(args.fail_closed_tier),
        local_fraction=args.local_budget_fraction,
        failure_threshold=args.redis_failure_threshold,
    )
    return FailoverBudgetStore(
        RedisBudgetStore(args.redis, timeout=args.redis_timeout),
        policy,
        on_error=lambda op, exc: metrics.redis_errors.labels(op).inc(),
        on_fallback=lambda tier, result: metrics.budget_fallback.labels(tier, result).inc(),
        replicas=members,
    )


def build_capacity(
    args: argparse.Namespace, metrics: GatewayMetrics, namespace: str
) -> CapacityShare:
    """Capacity leases with the other replicas when Redis is set (unless --plan-share
    fixes a share), else the whole plan (or the given share)."""
    if not args.redis or args.plan_share is not None:
        return StaticShare(args.plan_share if args.plan_share is not None else 100)
    ttl = args.lease_ttl
    clock = LeaseClock(
        period=args.lease_period,
        lease_ttl=max(ttl - 0.5, ttl * 0.8),
        member_ttl=ttl,
        redis_timeout=args.redis_timeout,
    )
    store = RedisLeaseStore(args.redis, namespace, timeout=args.redis_timeout)
    keeper = LeaseKeeper(store, metrics, member=args.replica_id, clock=clock)
    args.live_replicas = lambda: keeper.members
    log.info("capacity leases in redis as replica %s", keeper.member)
    return keeper


ConfigSource = FileConfigSource | ConfigMapSource | ManifestConfigSource


async def _open_source(args: argparse.Namespace) -> tuple[ConfigSource, AdmissionConfig]:
    """The config source the flags name, and its first config (raises ConfigError)."""
    source: ConfigSource
    if args.manifests:
        source = ManifestConfigSource(
            args.manifests,
            args.endpoint_map,
            args.key_file_map,
            namespace=args.namespace,
            kv_tokens_per_replica=args.kv_tokens_per_replica,
            interval=args.reload_interval,
        )
        config: AdmissionConfig = source.load()
    elif args.config:
        source = FileConfigSource(args.config, interval=args.reload_interval)
        config = source.load()
    else:
        access = (
            KubeAccess(server=args.kube_server, token=args.kube_token)
            if args.kube_server
            else KubeAccess.in_cluster()
        )
        source = ConfigMapSource(args.configmap, access, interval=max(args.reload_interval, 2.0))
        config = await source.load()
    return source, config


async def serve(args: argparse.Namespace) -> int:
    """Run until SIGTERM/SIGINT."""
    source, config = await _open_source(args)
    unknown_tier = _unknown_fail_closed_tier(args.fail_closed_tier, config)
    if unknown_tier is not None:
        print(f"kvpool gateway: error: {unknown_tier}", file=sys.stderr)
        return 2
    metrics = GatewayMetrics()
    settings = GatewaySettings(
        max_body_bytes=args.max_body_bytes,
        upstream_timeout=args.upstream_timeout,
        upstream_first_token_timeout=args.upstream_first_token_timeout,
        upstream_idle_timeout=args.upstream_idle_timeout,
        health_probe_interval=args.health_probe_interval,
        health_probe_timeout=args.health_probe_timeout,
        set_engine_priority=not args.no_engine_priority,
        access_log=not args.no_access_log,
        plan_share_percent=args.plan_share or 100,
        body_timeout=args.body_timeout,
        metrics_on_api_port=args.metrics_on_api_port,
        learn_reservations=not args.no_learn_reservations,
        engine_poll_seconds=args.engine_poll_seconds,
        borrow_pause_usage=args.borrow_pause_usage,
        handover_tokens=args.handover_tokens,
        budget_overlap=not args.no_budget_overlap,
    )
    capacity = build_capacity(args, metrics, config.namespace)
    gateway = Gateway(
        config,
        build_store(args, metrics),
        settings=settings,
        metrics=metrics,
        capacity=capacity,
    )
    runner = GatewayRunner(
        gateway.app(),
        handler_cancellation=True,
        access_log=None,
        shutdown_timeout=args.shutdown_timeout,
        keepalive_timeout=args.header_timeout,
    )
    await runner.setup()
    host, port = args.listen
    metrics_runner: web.AppRunner | None = None
    try:
        await _bind(web.TCPSite(runner, host, port, backlog=1024), "--listen", host, port)
        if args.metrics_listen:
            metrics_runner = web.AppRunner(gateway.metrics_app(), access_log=None)
            await metrics_runner.setup()
            metrics_host, metrics_port = args.metrics_listen
            site = web.TCPSite(metrics_runner, metrics_host, metrics_port)
            await _bind(site, "--metrics-listen", metrics_host, metrics_port)
            log.info("metrics on %s:%d", metrics_host, metrics_port)
    except BindError as error:
        print(f"kvpool gateway: {error}", file=sys.stderr)
        await runner.cleanup()
        if metrics_runner is not None:
            await metrics_runner.cleanup()
        return 1
    log.info(
        "kvpool gateway on %s:%d: %d pools, %d tenants, budgets in %s",
        host,
        port,
        len(config.pools),
        len(config.tenants),
        "redis" if args.redis else "memory",
    )
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    watcher = asyncio.create_task(source.watch(gateway.apply_config, gateway.config_rejected))
    try:
        await stop.wait()
    finally:
        watcher.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await watcher
        await runner.cleanup()
        if metrics_runner is not None:
            await metrics_runner.cleanup()
    return 0


class BindError(Exception):
    """An address the gateway cannot listen on (in use, not local, not permitted)."""


async def _bind(site: web.TCPSite, flag: str, host: str, port: int) -> None:
    try:
        await site.start()
    except OSError as error:
        reason = os.strerror(error.errno) if error.errno else str(error)
        raise BindError(f"cannot listen on {host}:{port} ({flag}): {reason}") from None


def _unknown_fail_closed_tier(tiers: list[str], config: AdmissionConfig) -> str | None:
    """Why a ``--fail-closed-tier`` names no tier of the config, or None."""
    known = sorted({t.name for p in config.tier_policies for t in p.tiers})
    for tier in tiers:
        if tier not in known:
            return (
                f"--fail-closed-tier {tier!r} is not a tier of the config "
                f"(tiers: {', '.join(known) or 'none'})"
            )
    return None


def _manifest_flags(args: argparse.Namespace) -> str | None:
    """Parse the -f companions into ``args`` (``endpoint_map``, ``key_file_map``); the
    usage error when one is wrong or given without -f."""
    given = [
        flag
        for flag, value in (
            ("--endpoints", args.endpoints),
            ("--key-file", args.key_files),
            ("--namespace", args.namespace),
            ("--kv-tokens-per-replica", args.kv_tokens_per_replica),
        )
        if value
    ]
    if given and not args.manifests:
        return f"{given[0]} goes with -f MANIFESTS (a --config or --configmap is compiled already)"
    try:
        args.endpoint_map = parse_endpoint_flags(args.endpoints)
        args.key_file_map = parse_key_file_flags(args.key_files)
    except OfflineCompileError as error:
        return str(error)
    return None


def _run_loop(main: Coroutine[Any, Any, int]) -> int:
    """Run on uvloop when it is installed (about half the per-chunk relay cost), else asyncio."""
    try:
        import uvloop
    except ImportError:
        return asyncio.run(main)
    return uvloop.run(main)


def run(args: argparse.Namespace) -> int:
    """Entry point of ``kvpool gateway``."""
    logging.basicConfig(
        level=getattr(logging, str(args.log_level).upper(), logging.INFO),
        format="%(message)s" if args.log_level.upper() != "DEBUG" else "%(name)s %(message)s",
        stream=sys.stderr,
    )
    if args.plan_share is not None and not 1 <= args.plan_share <= 100:
        print("kvpool gateway: --plan-share must be 1-100 (percent)", file=sys.stderr)
        return 2
    problem = _manifest_flags(args)
    if problem is not None:
        print(f"kvpool gateway: error: {problem}", file=sys.stderr)
        return 2
    try:
        return _run_loop(serve(args))
    except ConfigError as exc:
        print(f"kvpool gateway: {exc}", file=sys.stderr)
        return 1
