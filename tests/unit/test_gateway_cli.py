"""``kvpool gateway``'s command line: what each flag means before anything starts."""

from __future__ import annotations

import argparse

import pytest

import kvpool
from kvpool.cli import main
from kvpool.gateway.flags import REDIS_URL_ENV, add_arguments


def parse(*argv: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="kvpool gateway")
    add_arguments(parser)
    return parser.parse_args(list(argv))


def test_the_redis_url_can_come_from_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(REDIS_URL_ENV, "redis://:s3cret@redis:6379/0")

    assert parse("--config", "c.json").redis == "redis://:s3cret@redis:6379/0"
    assert parse("--config", "c.json", "--redis", "redis://other:6379").redis == (
        "redis://other:6379"
    )


def test_without_the_environment_budgets_stay_in_memory(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(REDIS_URL_ENV, raising=False)

    assert parse("--config", "c.json").redis is None


BAD_FLAGS = {
    "port-out-of-range": (["--listen", "127.0.0.1:99999"], "argument --listen: "
                          "'127.0.0.1:99999': port 99999 is not in 1-65535"),
    "not-an-address": (["--listen", "foo"], "argument --listen: 'foo' is not HOST:PORT"),
    "metrics-not-an-address": (["--metrics-listen", "8081"], "argument --metrics-listen: '8081'"),
    "not-a-redis-url": (["--redis", "notaurl"], "argument --redis: 'notaurl' is not a Redis URL"),
    "redis-password-hidden": (["--redis", "http://:s3cret@redis:6379"],
                              "argument --redis: http://... (password hidden)"),
    "negative-redis-timeout": (["--redis-timeout", "-1"],
                               "argument --redis-timeout: '-1': must be more than 0 seconds"),
    "zero-body-timeout": (["--body-timeout", "0"], "must be more than 0 seconds"),
    "fraction-over-1": (["--local-budget-fraction", "1.5"], "must be between 0 and 1"),
    "threshold-zero": (["--redis-failure-threshold", "0"], "must be at least 1"),
    "threshold-not-whole": (["--redis-failure-threshold", "2.5"], "'2.5' is not a whole number"),
    "bad-log-level": (["--log-level", "loud"], "argument --log-level: invalid choice"),
    "endpoints-without-f": (["--endpoints", "chat=http://a:1"],
                            "--endpoints goes with -f MANIFESTS"),
}  # fmt: skip


@pytest.mark.parametrize(("flags", "expected"), BAD_FLAGS.values(), ids=BAD_FLAGS.keys())
def test_a_bad_flag_is_one_error_line_and_exit_2(
    flags: list[str], expected: str, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as exited:
        code = main(["gateway", "--config", "/nonexistent/config.json", *flags])
        raise SystemExit(code)  # errors found after parsing return 2 instead of raising

    assert exited.value.code == 2
    lines = capsys.readouterr().err.splitlines()
    assert len(lines) == 1, lines
    assert lines[0].startswith("kvpool gateway: error: ") and expected in lines[0]
    assert "s3cret" not in lines[0]


def test_addresses_parse_to_host_and_port() -> None:
    args = parse("--config", "c.json", "--listen", "[::1]:8080", "--metrics-listen", "")

    assert (args.listen, args.metrics_listen) == (("::1", 8080), None)
    assert parse("--config", "c.json").listen == ("0.0.0.0", 8080)


def test_version(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exited:
        main(["--version"])

    assert exited.value.code == 0
    assert capsys.readouterr().out.strip() == f"kvpool {kvpool.__version__}"
