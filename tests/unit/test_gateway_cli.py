"""``kvpool gateway``'s command line: what each flag means before anything starts."""

from __future__ import annotations

import argparse

import pytest

from kvpool.gateway.main import REDIS_URL_ENV, add_arguments


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
