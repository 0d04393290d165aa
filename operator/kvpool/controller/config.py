"""Settings of one operator process, parsed once from flags and environment.

Why it exists: handlers, timers and adapters read one frozen object instead of flags,
environment variables and defaults scattered over modules.
"""

from __future__ import annotations

from dataclasses import dataclass

DEFAULT_MEASURE_INTERVAL = 15.0


@dataclass(frozen=True)
class OperatorConfig:
    """What ``kvpool operator`` was asked to do."""

    namespaces: tuple[str, ...] = ()  # empty: cluster-wide
    prometheus_url: str | None = None  # None: no measurements (declared capacity only)
    measure_interval: float = DEFAULT_MEASURE_INTERVAL  # seconds between periodic re-plans
    kubeconfig: str | None = None  # None: $KUBECONFIG, ~/.kube/config, then in-cluster
    metrics_port: int | None = 8080  # the operator's own /metrics (None: off)
    health_port: int | None = 8081  # kopf liveness at /healthz (None: off)
    listen_host: str = "0.0.0.0"  # where metrics and health listen
    peering: str | None = None  # kopf peering name (mandatory); None: auto-detect
    standalone: bool = False  # no peering at all
    priority: int = 0  # kopf peering priority of this replica
    apply_delay: float = 0.0  # testing only: pause between child writes (restart tests)
    leader_election: bool = True  # act only while holding the Lease (one active replica)
    lease_namespace: str = "default"  # where the Lease lives (the operator's namespace)
    lease_name: str = "kvpool-operator"  # the Lease's name (one per installation)
    lease_duration: float = 15.0  # seconds a standby waits after the leader's last renew
    identity: str = ""  # this replica's holder identity (default: host name = pod name)
    allow_static_endpoints: bool = False  # honour kvpool.dev/static-endpoints (local mode)
    rollout_recheck: float = 2.0  # re-reconcile period while the KV gate waits (0: ticks only)
