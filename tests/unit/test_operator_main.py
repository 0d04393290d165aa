"""``kvpool operator`` flags and environment -> OperatorConfig."""

from __future__ import annotations

import argparse

import pytest

from kvpool.controller.main import add_arguments, build_config


def _config(argv: list[str], monkeypatch: pytest.MonkeyPatch, **env: str) -> object:
    for name in ("KVPOOL_PROMETHEUS_URL", "KVPOOL_MEASURE_INTERVAL", "KVPOOL_NAMESPACES"):
        monkeypatch.delenv(name, raising=False)
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    parser = argparse.ArgumentParser()
    add_arguments(parser)
    return build_config(parser.parse_args(argv))


@pytest.mark.parametrize(
    ("argv", "env", "expected"),
    [
        ([], {}, {"namespaces": (), "prometheus_url": None, "measure_interval": 15.0}),
        (["--measure-interval", "2s"], {}, {"measure_interval": 2.0}),
        (["--measure-interval", "0.5"], {}, {"measure_interval": 0.5}),
        (["--measure-interval", "1m30s"], {}, {"measure_interval": 90.0}),
        ([], {"KVPOOL_MEASURE_INTERVAL": "30s"}, {"measure_interval": 30.0}),
        ([], {"KVPOOL_PROMETHEUS_URL": "http://prom:9090"}, {"prometheus_url": "http://prom:9090"}),
        (
            ["--prometheus-url", "http://a:1"],
            {"KVPOOL_PROMETHEUS_URL": "http://b:2"},
            {"prometheus_url": "http://a:1"},
        ),
        (["--namespace", "a", "--namespace", "b"], {}, {"namespaces": ("a", "b")}),
        ([], {"KVPOOL_NAMESPACES": "a,b"}, {"namespaces": ("a", "b")}),
        (
            ["--metrics-port", "0", "--health-port", "0"],
            {},
            {"metrics_port": None, "health_port": None},
        ),
        (
            ["--peering", "kvpool", "--priority", "5"],
            {},
            {"peering": "kvpool", "priority": 5, "standalone": False},
        ),
        (["--standalone"], {}, {"standalone": True, "peering": None}),
    ],
    ids=[
        "defaults",
        "interval-duration",
        "interval-seconds",
        "interval-compound",
        "interval-from-env",
        "prometheus-from-env",
        "flag-beats-env",
        "namespaces-repeated",
        "namespaces-from-env",
        "servers-disabled",
        "peering",
        "standalone",
    ],
)
def test_flags_and_environment(
    argv: list[str],
    env: dict[str, str],
    expected: dict[str, object],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    config = _config(argv, monkeypatch, **env)
    assert {k: getattr(config, k) for k in expected} == expected
