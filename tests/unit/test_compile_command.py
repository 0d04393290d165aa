"""``kvpool compile``: manifests to the gateway's config without a cluster - keys from files
for a repository without Secrets, warnings for what the gateway could not serve, and flag
values refused with their fix. (That it writes what the operator publishes:
tests/integration/test_offline_compile.py.)"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import yaml

from kvpool.cli import main
from kvpool.domain.api_keys import api_key_digest
from tests.builders import (
    apikey_secret_manifest,
    modelpool_manifest,
    standard_tierpolicy_manifest,
    tenantbudget_manifest,
)

URL = "http://10.0.0.7:8000"


def repo(tmp_path: Path, *, secret: bool = True, extra: list[Any] | None = None) -> Path:
    """A GitOps repo: policy, a declared pool, a tenant (and its Secret unless not)."""
    pool = modelpool_manifest("chat").peak(interactive=10).capacity(kvTokensPerReplica=200_000)
    docs = [
        standard_tierpolicy_manifest().dict(),
        pool.dict(),
        tenantbudget_manifest("acme").tiers("interactive").dict(),
        *([apikey_secret_manifest("acme-key", "api-key", "sk-acme")] if secret else []),
        *(extra or []),
    ]
    (tmp_path / "repo").mkdir(exist_ok=True)
    (tmp_path / "repo" / "kvpool.yaml").write_text(yaml.safe_dump_all(docs))
    return tmp_path / "repo"


def run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, dict[str, Any] | None, str]:
    code = main(["compile", *argv])
    out, err = capsys.readouterr()
    return code, (json.loads(out) if out.strip() else None), err


def test_a_repo_with_its_secret_compiles_the_tenant_and_the_endpoints(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    code, config, err = run(capsys, "-f", str(repo(tmp_path)), "--endpoints", f"chat={URL}")

    assert code == 0, err
    assert config is not None
    (tenant,) = config["tenants"]
    assert tenant["keySha256"] == api_key_digest("sk-acme")
    (pool,) = config["pools"]
    assert pool["planOk"] is True and pool["tracks"][0]["endpoints"][0]["url"] == URL
    assert err.splitlines() == ["compiled namespace default: 1 pools, 1 tier policies, 1 tenants"]


def test_a_key_file_stands_in_for_a_secret_kept_out_of_the_repo(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    key = tmp_path / "acme.key"
    key.write_text("sk-from-vault\n")
    out = tmp_path / "config.json"

    flags = ["--endpoints", f"chat={URL}", "--key-file", f"acme-key/api-key={key}", "-o", str(out)]

    code, _, err = run(capsys, "-f", str(repo(tmp_path, secret=False)), *flags)

    assert code == 0, err
    (tenant,) = json.loads(out.read_text())["tenants"]
    assert tenant["keySha256"] == api_key_digest("sk-from-vault")
    assert "sk-from-vault" not in out.read_text()
    assert "warning" not in err and "left out" not in err


def test_without_its_key_a_tenant_is_left_out_with_a_warning_and_strict_fails(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = str(repo(tmp_path, secret=False))

    lenient = run(capsys, "-f", path, "--endpoints", f"chat={URL}")
    strict = run(capsys, "-f", path, "--endpoints", f"chat={URL}", "--strict")

    assert lenient[0] == 0 and lenient[1] is not None and lenient[1]["tenants"] == []
    assert "TenantBudget default/acme left out (no key resolved" in lenient[2]
    assert "--key-file SECRET/KEY=PATH" in lenient[2]
    assert (strict[0], strict[1]) == (1, None)
    assert "--strict: 1 warning(s): nothing written" in strict[2]


def test_a_pool_without_endpoints_takes_its_annotation_or_is_warned_about(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = repo(tmp_path)
    code, config, err = run(capsys, "-f", str(path))
    assert code == 0 and config is not None
    assert config["pools"][0]["tracks"][0]["endpoints"] == []
    assert "ModelPool default/chat has no endpoints: the gateway answers 503" in err

    docs = list(yaml.safe_load_all((path / "kvpool.yaml").read_text()))
    docs[1]["metadata"]["annotations"] = {"kvpool.dev/static-endpoints": f"e1={URL}"}
    (path / "kvpool.yaml").write_text(yaml.safe_dump_all(docs))
    code, config, err = run(capsys, "-f", str(path))
    assert config is not None
    assert config["pools"][0]["tracks"][0]["endpoints"] == [
        {"name": "e1", "url": URL, "ready": True}
    ]
    assert "no endpoints" not in err


def test_invalid_manifests_are_reported_as_validate_does_and_nothing_is_written(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    bad = modelpool_manifest("orphan").policy("missing").dict()
    code, config, err = run(capsys, "-f", str(repo(tmp_path, extra=[bad])))

    assert (code, config) == (1, None)
    assert "ModelPool/orphan: spec.tierPolicyRef.name: TierPolicy 'missing' not found" in err


FLAG_ERRORS = {
    "unknown-pool": (["--endpoints", f"chta={URL}"],
                     "--endpoints names ModelPool 'chta', which is not in namespace 'default' "
                     "(ModelPools: chat)"),
    "no-equals": (["--endpoints", URL], "expected POOL=URL[,URL]..."),
    "not-http": (["--endpoints", "chat=10.0.0.7:8000"], "'10.0.0.7:8000' is not an http(s) URL"),
    "pool-twice": (["--endpoints", f"chat={URL}", "--endpoints", f"chat={URL}"],
                   "pool 'chat' given twice"),
    "missing-key-file": (["--key-file", "acme-key/api-key=/nonexistent/key"],
                         "--key-file /nonexistent/key: cannot read"),
    "bad-key-file-flag": (["--key-file", "/run/secrets/key"], "expected SECRET/KEY=PATH"),
    "unknown-namespace": (["-n", "llm"], "--namespace 'llm': no kvpool object there"),
}  # fmt: skip


@pytest.mark.parametrize(("flags", "reason"), FLAG_ERRORS.values(), ids=FLAG_ERRORS.keys())
def test_a_flag_value_that_cannot_be_used_is_exit_2_naming_it(
    flags: list[str], reason: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    code, config, err = run(capsys, "-f", str(repo(tmp_path)), *flags)

    assert (code, config) == (2, None)
    assert reason in err


def test_several_namespaces_need_one_chosen(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    other = standard_tierpolicy_manifest().dict()
    other["metadata"]["namespace"] = "team-b"
    path = str(repo(tmp_path, extra=[other]))

    code, _, err = run(capsys, "-f", path)
    chosen = run(capsys, "-f", path, "-n", "team-b")

    assert code == 2 and "several namespaces (default, team-b)" in err
    assert chosen[0] == 0 and chosen[1] is not None and chosen[1]["namespace"] == "team-b"
