"""A real Prometheus server scraping the engines a test starts.

Why: the operator reads engine capacity and load through Prometheus' HTTP query API; a
fake would hide the real label sets, staleness and timing. ``PrometheusServer`` runs the
Debian ``/usr/bin/prometheus`` (2.42) with a generated config (``scrape_interval: 1s``),
its TSDB in a temp dir, on a free loopback port, with ``--web.enable-lifecycle`` so the
targets can be re-written and reloaded (``POST /-/reload``) while it runs.

Usage (the ``prometheus_server`` fixture in tests/conftest.py wraps this)::

    with PrometheusServer(work_dir=tmp_path / "prom", targets={"vllm": [engine.target]}) as prom:
        series = prom.wait_for('vllm:cache_config_info', lambda r: len(r) == 1, timeout=30)
        series[0]["metric"]["kv_cache_size_tokens"]      # "2048"

Timing measured here: ready in ~1-2 s; the first scrape of a target lands after ~1-3 s
(the GUIDE's "first query result after ~7 s" includes Prometheus start-up and the default
scrape offset); after a reload, new targets are scraped within ~2 s.
Every series gets ``job`` and ``instance`` (``127.0.0.1:PORT``) labels from the scrape; a
:class:`ScrapeTarget` adds its own labels, standing in for kubernetes_sd plus the relabeling
a cluster's scrape config does (pod labels ``kvpool.dev/*`` -> ``kvpool_*``, namespace, pod).
"""

from __future__ import annotations

import json
import shutil
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tests.support.ports import free_port
from tests.support.processes import ManagedProcess
from tests.support.waiting import StopWaitingError, WaitTimeoutError, wait_until

PROMETHEUS_BIN = "/usr/bin/prometheus"
READY_TIMEOUT_SECONDS = 60.0


@dataclass(frozen=True)
class ScrapeTarget:
    """One ``host:port`` Prometheus scrapes, with the labels its series get."""

    address: str
    labels: Mapping[str, str] = field(default_factory=dict)


Targets = Mapping[str, Sequence["str | ScrapeTarget"]]  # job -> ["127.0.0.1:PORT" | target]


PrometheusFactory = Callable[..., "PrometheusServer"]
"""Type of the ``prometheus_server`` fixture: ``(targets=None, **kwargs)`` -> a ready server."""


def prometheus_binary() -> str | None:
    """Path of the prometheus binary, or None when it is not installed."""
    if Path(PROMETHEUS_BIN).is_file():
        return PROMETHEUS_BIN
    return shutil.which("prometheus")


def build_config(targets: Targets, scrape_interval: str = "1s") -> str:
    """The prometheus.yml text for ``targets`` (JSON is valid YAML, so no YAML writer needed).

    Example: ``build_config({"vllm": ["127.0.0.1:24001"]})`` gives one scrape job ``vllm``
    scraping ``http://127.0.0.1:24001/metrics`` every second; a ``ScrapeTarget`` gets a
    static group of its own carrying its labels.
    """
    config = {
        "global": {"scrape_interval": scrape_interval, "evaluation_interval": scrape_interval},
        "scrape_configs": [
            {
                "job_name": job,
                "scrape_interval": scrape_interval,
                "scrape_timeout": scrape_interval,
                "static_configs": _static_groups(addresses),
            }
            for job, addresses in sorted(targets.items())
        ],
    }
    return json.dumps(config, indent=2) + "\n"


def _static_groups(targets: Sequence[str | ScrapeTarget]) -> list[dict[str, Any]]:
    plain = [t for t in targets if isinstance(t, str)]
    groups: list[dict[str, Any]] = [{"targets": plain}] if plain else []
    groups += [
        {"targets": [t.address], "labels": dict(t.labels)}
        for t in targets
        if isinstance(t, ScrapeTarget)
    ]
    return groups


class PrometheusServer:
    """A running Prometheus; a context manager (start on enter, stop on exit)."""

    def __init__(
        self,
        work_dir: Path,
        targets: Targets | None = None,
        port: int | None = None,
        scrape_interval: str = "1s",
    ) -> None:
        binary = prometheus_binary()
        if binary is None:
            raise FileNotFoundError("prometheus not installed (apt-get install prometheus)")
        self.work_dir = work_dir
        self.port = port if port is not None else free_port()
        self.scrape_interval = scrape_interval
        self.config_path = work_dir / "prometheus.yml"
        self.targets: dict[str, list[str | ScrapeTarget]] = {
            k: list(v) for k, v in (targets or {}).items()
        }
        work_dir.mkdir(parents=True, exist_ok=True)
        self._write_config()
        self.process = ManagedProcess(
            [
                binary,
                f"--config.file={self.config_path}",
                f"--storage.tsdb.path={work_dir / 'tsdb'}",
                f"--web.listen-address=127.0.0.1:{self.port}",
                "--web.enable-lifecycle",
                "--log.level=warn",
            ],
            log_path=work_dir / "prometheus.log",
            env={"PATH": "/usr/bin:/bin"},
            cwd=work_dir,
        )

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def _write_config(self) -> None:
        self.config_path.write_text(build_config(self.targets, self.scrape_interval))

    def start(self, timeout: float = READY_TIMEOUT_SECONDS) -> PrometheusServer:
        self.process.start()
        try:
            wait_until(self._ready_or_exited, timeout, "prometheus ready", interval=0.2)
        except WaitTimeoutError:
            self.stop()
            raise RuntimeError(
                f"prometheus not ready after {timeout} s:\n{self.process.log_tail()}"
            ) from None
        return self

    def _ready_or_exited(self) -> bool:
        if not self.process.running():
            raise StopWaitingError(
                f"prometheus exited with {self.process.returncode()}:\n{self.process.log_tail()}"
            )
        return self._ready()

    def _ready(self) -> bool:
        try:
            with urllib.request.urlopen(f"{self.url}/-/ready", timeout=2) as resp:
                return bool(resp.status == 200)
        except (urllib.error.URLError, OSError):
            return False

    def stop(self) -> None:
        self.process.stop(timeout=10)

    def running(self) -> bool:
        return self.process.running()

    def log_tail(self, lines: int = 80) -> str:
        return self.process.log_tail(lines)

    def set_targets(self, targets: Targets) -> None:
        """Re-write the scrape config with ``targets`` and reload it (POST /-/reload)."""
        self.targets = {k: list(v) for k, v in targets.items()}
        self._write_config()
        request = urllib.request.Request(f"{self.url}/-/reload", data=b"", method="POST")
        with urllib.request.urlopen(request, timeout=10) as resp:
            if resp.status != 200:
                raise RuntimeError(f"prometheus reload answered {resp.status}")

    def add_target(self, job: str, target: str | ScrapeTarget) -> None:
        """Add one ``host:port`` to ``job`` (created if new) and reload."""
        targets = {k: list(v) for k, v in self.targets.items()}
        targets.setdefault(job, []).append(target)
        self.set_targets(targets)

    def query(self, promql: str) -> list[dict[str, Any]]:
        """Instant query; returns ``data.result`` (a list of {metric, value} for vectors)."""
        url = f"{self.url}/api/v1/query?{urllib.parse.urlencode({'query': promql})}"
        with urllib.request.urlopen(url, timeout=10) as resp:
            body = json.loads(resp.read())
        if body.get("status") != "success":
            raise RuntimeError(f"query {promql!r} failed: {body}")
        result: list[dict[str, Any]] = body["data"]["result"]
        return result

    def active_targets(self) -> list[dict[str, Any]]:
        """``/api/v1/targets`` active targets (with ``health``, ``lastError``, ``scrapeUrl``)."""
        with urllib.request.urlopen(f"{self.url}/api/v1/targets", timeout=10) as resp:
            targets: list[dict[str, Any]] = json.loads(resp.read())["data"]["activeTargets"]
        return targets

    def wait_for(
        self,
        promql: str,
        predicate: Callable[[list[dict[str, Any]]], bool] = bool,
        timeout: float = 30.0,
        interval: float = 0.5,
    ) -> list[dict[str, Any]]:
        """Poll ``promql`` until ``predicate(result)`` holds; return that result.

        Raises ``TimeoutError`` with the last result and the targets' health otherwise.
        """
        last: list[dict[str, Any]] = []

        def met() -> list[dict[str, Any]] | None:
            nonlocal last
            last = self.query(promql)
            return last if predicate(last) else None

        try:
            result: list[dict[str, Any]] = wait_until(met, timeout, promql, interval=interval)
        except WaitTimeoutError:
            health = [(t["scrapeUrl"], t["health"], t["lastError"]) for t in self.active_targets()]
            raise TimeoutError(
                f"{promql!r}: predicate not met in {timeout} s; last result {last}; "
                f"targets {health}"
            ) from None
        return result

    def __enter__(self) -> PrometheusServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
