"""``kvpool operator``: run the kopf operator (cluster-wide or in given namespaces).

Why it exists: the command-line surface of the operator - flags (each with an environment
variable for containers), logging, the operator's own metrics server - and nothing else.

Flags (environment variable in brackets):

- ``--namespace NS`` (repeatable) [KVPOOL_NAMESPACES, comma-separated]: watch only these;
  default cluster-wide;
- ``--prometheus-url URL`` [KVPOOL_PROMETHEUS_URL]: where engine metrics are queried;
  without it the operator plans with declared capacity and says so;
- ``--measure-interval 15s`` [KVPOOL_MEASURE_INTERVAL]: periodic re-plan of every pool;
- ``--metrics-port 8080`` / ``--health-port 8081`` (``0`` disables): the operator's own
  ``/metrics`` and kopf's liveness endpoint ``/healthz``;
- ``--peering NAME`` / ``--standalone`` / ``--priority N``: kopf peering; by default kopf
  auto-detects (peering when the KopfPeering CRDs are installed, standalone otherwise);
- ``--kubeconfig PATH`` [KUBECONFIG]: else ~/.kube/config, else in-cluster.
"""

from __future__ import annotations

import argparse
import logging
import os

from kvpool.api.common import parse_duration
from kvpool.controller.config import OperatorConfig


def add_arguments(parser: argparse.ArgumentParser) -> None:
    env = os.environ.get
    parser.add_argument(
        "--namespace",
        action="append",
        default=[n for n in env("KVPOOL_NAMESPACES", "").split(",") if n],
        help="namespace to watch (repeatable); default: cluster-wide",
    )
    parser.add_argument(
        "--prometheus-url",
        default=env("KVPOOL_PROMETHEUS_URL"),
        help="Prometheus base URL for engine metrics (env KVPOOL_PROMETHEUS_URL)",
    )
    parser.add_argument(
        "--measure-interval",
        default=env("KVPOOL_MEASURE_INTERVAL", "15s"),
        help="periodic re-plan interval, e.g. 15s (env KVPOOL_MEASURE_INTERVAL)",
    )
    parser.add_argument("--kubeconfig", default=None, help="kubeconfig path (default: KUBECONFIG)")
    parser.add_argument("--metrics-port", type=int, default=int(env("KVPOOL_METRICS_PORT", "8080")))
    parser.add_argument("--health-port", type=int, default=int(env("KVPOOL_HEALTH_PORT", "8081")))
    parser.add_argument("--listen-host", default=env("KVPOOL_LISTEN_HOST", "0.0.0.0"))
    parser.add_argument("--peering", default=env("KVPOOL_PEERING"), help="kopf peering name")
    parser.add_argument("--standalone", action="store_true", help="no peering")
    parser.add_argument("--priority", type=int, default=0, help="kopf peering priority")
    parser.add_argument("--verbose", action="store_true", help="debug logging")


def build_config(args: argparse.Namespace) -> OperatorConfig:
    interval = args.measure_interval
    seconds = (
        float(interval) if interval.replace(".", "", 1).isdigit() else parse_duration(interval)
    )
    return OperatorConfig(
        namespaces=tuple(args.namespace or ()),
        prometheus_url=args.prometheus_url or None,
        measure_interval=seconds,
        kubeconfig=args.kubeconfig,
        metrics_port=args.metrics_port or None,
        health_port=args.health_port or None,
        listen_host=args.listen_host,
        peering=args.peering,
        standalone=args.standalone,
        priority=args.priority,
        apply_delay=float(os.environ.get("KVPOOL_TESTING_APPLY_DELAY", "0")),
        rollout_recheck=float(os.environ.get("KVPOOL_ROLLOUT_RECHECK_SECONDS", "2")),
    )


def run(args: argparse.Namespace) -> int:
    import kopf

    from kvpool.adapters.kube import KubeClient, load_connection
    from kvpool.adapters.prometheus import SnapshotCache
    from kvpool.controller.context import Operator
    from kvpool.controller.handlers import build_registry
    from kvpool.controller.metrics import OperatorMetrics

    logging.basicConfig(
        level=logging.DEBUG if args.verbose else logging.INFO,
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
    )
    if not args.verbose:
        logging.getLogger("kopf.objects").setLevel(logging.WARNING)  # per-handler chatter
    config = build_config(args)
    op = Operator(
        config=config,
        kube=KubeClient(load_connection(config.kubeconfig)),
        snapshots=SnapshotCache(
            config.prometheus_url, max_age=max(config.measure_interval / 2, 0.5)
        ),
        metrics=OperatorMetrics(),
    )
    if config.metrics_port:
        op.metrics.serve(config.metrics_port, config.listen_host)
    liveness = (
        f"http://{config.listen_host}:{config.health_port}/healthz" if config.health_port else None
    )
    kopf.run(
        registry=build_registry(op),
        clusterwide=not config.namespaces,
        namespaces=config.namespaces,
        standalone=True if config.standalone else None,
        peering_name=config.peering,
        priority=config.priority,
        liveness_endpoint=liveness,
    )
    return 0
