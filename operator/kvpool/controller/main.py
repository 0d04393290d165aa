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
- ``--leader-election`` (default) / ``--no-leader-election`` [KVPOOL_LEADER_ELECTION]: act
  only while holding the Lease ``--leader-election-id`` (``kvpool-operator``) in
  ``--leader-election-namespace`` [POD_NAMESPACE; default: the pod's namespace, else
  ``default``]; ``--lease-duration 15s``; ``--identity`` [POD_NAME; default: host name];
- ``--peering NAME`` / ``--standalone`` / ``--priority N``: kopf peering (an alternative
  to leader election); with leader election on and no ``--peering``, kopf runs standalone;
- ``--allow-static-endpoints`` [KVPOOL_ALLOW_STATIC_ENDPOINTS=true]: honour the ModelPool
  annotation ``kvpool.dev/static-endpoints`` (local mode only: in a cluster, anyone who
  may annotate a pool could send its traffic anywhere, so it is off by default);
- ``--kubeconfig PATH`` [KUBECONFIG]: else ~/.kube/config, else in-cluster.
"""

from __future__ import annotations

import argparse
import logging
import os
import socket
from pathlib import Path

from kvpool.api.common import parse_duration
from kvpool.controller.config import OperatorConfig

NAMESPACE_FILE = Path("/var/run/secrets/kubernetes.io/serviceaccount/namespace")


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
    parser.add_argument(
        "--leader-election",
        action=argparse.BooleanOptionalAction,
        default=env("KVPOOL_LEADER_ELECTION", "true").lower() not in ("0", "false", "no"),
        help="act only while holding the Lease (default: on)",
    )
    parser.add_argument(
        "--leader-election-namespace",
        default=env("POD_NAMESPACE") or _own_namespace(),
        help="namespace of the Lease (default: the pod's namespace, else default)",
    )
    parser.add_argument("--leader-election-id", default="kvpool-operator", help="Lease name")
    parser.add_argument("--lease-duration", default="15s", help="Lease duration, e.g. 15s")
    parser.add_argument(
        "--identity",
        default=env("POD_NAME") or socket.gethostname(),
        help="holder identity (default: the host name, i.e. the pod name)",
    )
    parser.add_argument(
        "--allow-static-endpoints",
        action="store_true",
        default=env("KVPOOL_ALLOW_STATIC_ENDPOINTS", "").lower() in ("1", "true", "yes"),
        help="honour the kvpool.dev/static-endpoints annotation (local mode only)",
    )
    parser.add_argument("--verbose", action="store_true", help="debug logging")


def _own_namespace() -> str:
    """The pod's namespace from its service account, else ``default``."""
    try:
        return NAMESPACE_FILE.read_text().strip() or "default"
    except OSError:
        return "default"


def _seconds(text: str) -> float:
    return float(text) if text.replace(".", "", 1).isdigit() else parse_duration(text)


def build_config(args: argparse.Namespace) -> OperatorConfig:
    return OperatorConfig(
        namespaces=tuple(args.namespace or ()),
        prometheus_url=args.prometheus_url or None,
        measure_interval=_seconds(args.measure_interval),
        kubeconfig=args.kubeconfig,
        metrics_port=args.metrics_port or None,
        health_port=args.health_port or None,
        listen_host=args.listen_host,
        peering=args.peering,
        standalone=args.standalone,
        priority=args.priority,
        apply_delay=float(os.environ.get("KVPOOL_TESTING_APPLY_DELAY", "0")),
        leader_election=args.leader_election,
        lease_namespace=args.leader_election_namespace,
        lease_name=args.leader_election_id,
        lease_duration=_seconds(args.lease_duration),
        identity=args.identity,
        allow_static_endpoints=args.allow_static_endpoints,
        rollout_recheck=float(os.environ.get("KVPOOL_ROLLOUT_RECHECK_SECONDS", "2")),
    )


def run(args: argparse.Namespace) -> int:
    import kopf

    from kvpool.adapters.kube import KubeClient, load_connection
    from kvpool.adapters.prometheus import SnapshotCache
    from kvpool.controller.handlers import build_registry
    from kvpool.controller.metrics import OperatorMetrics
    from kvpool.controller.state import OperatorState
    from kvpool.controller.wiring import Operator

    logging.basicConfig(
        level=logging.DEBUG if args.verbose else logging.INFO,
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
    )
    if not args.verbose:
        logging.getLogger("kopf.objects").setLevel(logging.WARNING)  # per-handler chatter
    config = build_config(args)
    state = OperatorState(
        config=config,
        kube=KubeClient(load_connection(config.kubeconfig)),
        snapshots=SnapshotCache(
            config.prometheus_url, max_age=max(config.measure_interval / 2, 0.5)
        ),
        metrics=OperatorMetrics(),
    )
    if config.metrics_port:
        state.metrics.serve(config.metrics_port, config.listen_host)
    liveness = (
        f"http://{config.listen_host}:{config.health_port}/healthz" if config.health_port else None
    )
    kopf.run(
        registry=build_registry(Operator(state)),
        clusterwide=not config.namespaces,
        namespaces=config.namespaces,
        # with leader election, kopf peering is not needed (and not auto-detected)
        standalone=True
        if config.standalone or (config.leader_election and not config.peering)
        else None,
        peering_name=config.peering,
        priority=config.priority,
        liveness_endpoint=liveness,
    )
    return 0
