"""``kvpool tenant create``: a Secret with a fresh key and a TenantBudget that pass
``kvpool validate`` with the policy they name, and refusals that name the value.
(``--apply`` through a real kubectl: tests/integration/test_tenant_apply.py.)"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml

from kvpool.adapters.manifests import load_and_validate
from kvpool.cli import main
from kvpool.commands.tenant import KEY_PREFIX
from tests.builders import standard_tierpolicy_manifest


def create(capsys: pytest.CaptureFixture[str], *extra: str) -> tuple[int, list[Any], str]:
    code = main(["tenant", "create", "acme", "--tier", "interactive", "--tier", "batch",
                 "--tokens-per-minute", "100000", *extra])  # fmt: skip
    out, err = capsys.readouterr()
    return code, [d for d in yaml.safe_load_all(out) if d], err


def test_the_manifests_pass_validate_with_the_policy(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    code, docs, err = create(capsys, "--tokens-per-day", "5000000", "--max-concurrency", "8",
                             "--label", "kvpool.dev/workload=interactive")  # fmt: skip
    (tmp_path / "tenant.yaml").write_text(yaml.safe_dump_all(docs))
    (tmp_path / "policy.yaml").write_text(yaml.safe_dump(standard_tierpolicy_manifest().dict()))

    validated = load_and_validate([str(tmp_path)])

    assert code == 0, err
    assert validated.problems == [] and validated.warnings == []
    (budget,) = validated.tenant_budgets
    assert budget.spec.tiers == ["interactive", "batch"]
    assert [(w.window, w.tokens) for w in budget.spec.limits] == [("1m", 100000), ("1d", 5000000)]
    assert budget.spec.max_concurrency == 8
    assert budget.metadata.labels == {"kvpool.dev/workload": "interactive"}
    (secret,) = validated.secrets
    assert secret.labels == {"kvpool.dev/api-key": "true"}
    assert budget.spec.api_key_secret_ref is not None
    assert secret.name == budget.spec.api_key_secret_ref.name


def test_every_run_makes_a_new_strong_key(capsys: pytest.CaptureFixture[str]) -> None:
    keys = {create(capsys)[1][0]["stringData"]["api-key"] for _ in range(5)}

    assert len(keys) == 5
    assert all(k.startswith(KEY_PREFIX) and len(k) >= len(KEY_PREFIX) + 43 for k in keys)


REFUSED = {
    "bad-name": (["tenant", "create", "Acme", "--tier", "interactive",
                  "--tokens-per-minute", "5"], "metadata.name: 'Acme' is not a valid name"),
    "bad-tier": (["tenant", "create", "acme", "--tier", "Gold", "--tokens-per-minute", "5"],
                 "spec.tiers[0]: 'Gold' is not a DNS label"),
    "zero-tokens": (["tenant", "create", "acme", "--tier", "interactive",
                     "--tokens-per-minute", "0"], "spec.limits[0].tokens: must be at least 1"),
    "bad-label": (["tenant", "create", "acme", "--tier", "interactive", "--tokens-per-minute",
                   "5", "--label", "team"], "--label 'team': expected KEY=VALUE"),
}  # fmt: skip


@pytest.mark.parametrize(("argv", "reason"), REFUSED.values(), ids=REFUSED.keys())
def test_a_value_the_crd_refuses_is_a_usage_error_naming_it(
    argv: list[str], reason: str, capsys: pytest.CaptureFixture[str]
) -> None:
    code = main(argv)

    out, err = capsys.readouterr()
    assert (code, out) == (2, "")
    assert reason in err
