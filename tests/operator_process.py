"""Run the real operator (``kvpool operator``, kopf) as a process for integration tests.

Why a process and not an in-thread runner: the tests kill it (SIGKILL, mid-reconcile) and
start it again, as a crash and a rollout would, and they measure its memory. It runs in
local mode (``--allow-static-endpoints``) with leader election on and its own identity.

    with run_operator(kube_api, tmp_path) as op:    # started, /healthz answers
        op.metrics()                                 # text of its /metrics
        op.restart(kill=True)                        # SIGKILL, then start again

Waiting on it: ``tests.support.waiting.wait_until`` (a dead operator ends the wait at once).
"""

from __future__ import annotations

import contextlib
import os
import re
import sys
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from tests.support.kube import KubeApi
from tests.support.ports import free_port
from tests.support.processes import ManagedProcess
from tests.support.waiting import StopWaitingError, wait_until

REPO = Path(__file__).resolve().parents[1]
RECONCILES = re.compile(r'^kvpool_operator_reconciles_total\{result="ok"\} (\S+)$', re.M)


class OperatorExitedError(StopWaitingError):
    """The operator process is gone (its log tail is the message): waiting on it stops."""


class OperatorProcess:
    """One ``kvpool operator`` process against a test API server."""

    def __init__(
        self,
        kube: KubeApi,
        workdir: Path,
        *,
        prometheus_url: str | None = None,
        interval: str = "1s",
        extra_args: tuple[str, ...] = (),
        env: dict[str, str] | None = None,
        identity: str | None = None,
        allow_static_endpoints: bool = True,
    ) -> None:
        self.metrics_port = free_port()
        self.health_port = free_port()
        # one Lease identity per process object, kept across restarts (as a pod's name is)
        self.identity = identity or f"operator-{self.metrics_port}"
        argv = [
            sys.executable,
            "-m",
            "kvpool.cli",
            "operator",
            f"--kubeconfig={kube.kubeconfig}",
            f"--measure-interval={interval}",
            f"--metrics-port={self.metrics_port}",
            f"--health-port={self.health_port}",
            "--listen-host=127.0.0.1",
            f"--identity={self.identity}",
            *(["--allow-static-endpoints"] if allow_static_endpoints else []),  # local mode
            *(["--standalone"] if not any(a.startswith("--peering") for a in extra_args) else []),
            *([f"--prometheus-url={prometheus_url}"] if prometheus_url else []),
            *extra_args,
        ]
        full_env = {k: v for k, v in os.environ.items() if k != "KVPOOL_PROMETHEUS_URL"}
        self.process = ManagedProcess(argv, workdir / "operator.log", full_env | (env or {}), REPO)

    def start(self) -> None:
        self.process.start()
        wait_until(self.healthy, timeout=30)

    def healthy(self) -> bool:
        if not self.process.running():
            raise OperatorExitedError(f"operator exited:\n{self.process.log_tail()}")
        try:
            with urllib.request.urlopen(
                f"http://127.0.0.1:{self.health_port}/healthz", timeout=1
            ) as rsp:
                return bool(rsp.status == 200)
        except OSError:
            return False

    def metrics(self) -> str:
        with urllib.request.urlopen(
            f"http://127.0.0.1:{self.metrics_port}/metrics", timeout=5
        ) as rsp:
            return str(rsp.read().decode())

    def reconciles(self) -> float:
        """Pool reconciles that succeeded so far (``kvpool_operator_reconciles_total``)."""
        found = RECONCILES.search(self.metrics())
        return float(found.group(1)) if found else 0.0

    def restart(self, *, kill: bool, env: dict[str, str] | None = None) -> None:
        self.process.kill() if kill else self.process.stop()
        if env is not None:
            self.process.env.update(env)
        self.start()

    def stop(self) -> None:
        self.process.stop(timeout=10)

    def log(self) -> str:
        return self.process.log_tail(200)


@contextlib.contextmanager
def run_operator(kube: KubeApi, workdir: Path, **kwargs: Any) -> Iterator[OperatorProcess]:
    op = OperatorProcess(kube, workdir, **kwargs)
    try:
        op.start()
        yield op
    finally:
        op.stop()
