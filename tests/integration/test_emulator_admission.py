"""The emulator enforces what an API server enforces, and kubectl sees it.

- every invalid object of tests/invalid_objects.py is refused by ``kvpool validate``
  (given with the valid baseline), and those an API server refuses (schema and CEL) are
  refused by ``kubectl apply`` against the emulator with the same field path; the others
  (rules across objects, or beyond CEL) are accepted there - only ``kvpool validate`` and
  the operator catch those (tests/integration/test_operator_validation.py);
- defaults from the CRD schema are applied and unknown fields pruned;
- deleting an owner garbage-collects its dependents (background cascading deletion);
- ``kubectl describe`` shows an object's Events (field selectors on ``involvedObject``).
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.builders import (
    apikey_secret_manifest,
    standard_tierpolicy_manifest,
    tenantbudget_manifest,
)
from tests.integration.test_operator import core, mp, tp
from tests.invalid_objects import INVALID_CASES, InvalidCase, baseline_pool
from tests.support.kube import KubeApi

REPO = Path(__file__).resolve().parents[2]


def baseline() -> list[dict[str, Any]]:
    return [
        standard_tierpolicy_manifest().dict(),
        baseline_pool().dict(),
        tenantbudget_manifest("acme").tiers("interactive", "batch").limit("1h", 10_000).dict(),
        apikey_secret_manifest("acme-key", "api-key", "sk-acme"),
    ]


def write(path: Path, docs: list[dict[str, Any]]) -> Path:
    path.write_text(yaml.safe_dump_all(docs, sort_keys=False))
    return path


@pytest.mark.parametrize("case", INVALID_CASES, ids=[c.id for c in INVALID_CASES])
def test_kvpool_validate_and_kubectl_apply_refuse_invalid_objects(
    kube_api: KubeApi, tmp_path: Path, kubectl_installed: str, case: InvalidCase
) -> None:
    name = case.body["metadata"]["name"]
    others = [d for d in baseline() if (d["kind"], d["metadata"]["name"]) != (case.kind, name)]

    # kvpool validate refuses the set with the invalid object, naming the field
    manifests = write(tmp_path / "set.yaml", [*others, case.body])
    run = subprocess.run(
        [sys.executable, "-m", "kvpool.cli", "validate", "-f", str(manifests)],
        capture_output=True, text=True, cwd=REPO, check=False, timeout=60,
    )  # fmt: skip
    assert run.returncode == 1, run.stdout
    assert f"{case.kind}/{name}: {case.path}: {case.reason}" in run.stdout

    # kubectl apply against the emulator: the baseline goes in, the invalid object...
    kube_api.kubectl(
        "apply", "--validate=false", "-f", str(write(tmp_path / "ok.yaml", baseline()))
    )
    bad = write(tmp_path / "bad.yaml", [case.body])
    applied = kube_api.kubectl("apply", "--validate=false", "-f", str(bad), check=False)
    if case.server_rejects:
        # ...is refused by the schema or a CEL rule, with the field path and reason
        assert applied.returncode != 0, applied.stdout
        path, reason = case.server_path or case.path, case.server_reason or case.reason
        assert "is invalid" in applied.stderr and path in applied.stderr, applied.stderr
        assert reason in applied.stderr, applied.stderr
    else:
        # ...is accepted: only kvpool validate and the operator see this rule
        assert applied.returncode == 0, applied.stderr


def test_defaults_are_applied_and_unknown_fields_pruned(kube_api: KubeApi) -> None:
    policy = standard_tierpolicy_manifest().dict()
    policy["spec"]["tiers"][0]["floorPercnt"] = 40  # a typo: pruned, as a server would
    kube_api.client.create(tp(), policy)

    stored = kube_api.client.get(tp("tiers"))
    assert stored["spec"]["tiers"][0]["reclaim"] == "Wait"  # the schema's default
    assert "floorPercnt" not in stored["spec"]["tiers"][0]

    strict = kube_api.client.request(
        "POST", tp() + "?fieldValidation=Strict", {**policy, "metadata": {"name": "strict"}}
    )
    assert strict.status == 422 and "spec.tiers[0].floorPercnt: unknown field" in str(strict.body)


def test_deleting_an_owner_collects_its_dependents(kube_api: KubeApi) -> None:
    owner = kube_api.client.create(mp(), baseline_pool().dict())
    reference = {"apiVersion": "kvpool.dev/v1alpha1", "kind": "ModelPool", "name": "chat",
                 "uid": owner["metadata"]["uid"], "controller": True}  # fmt: skip
    for name in ("chat-stable", "unrelated"):
        meta: dict[str, Any] = {"name": name}
        if name == "chat-stable":
            meta["ownerReferences"] = [reference]
        kube_api.client.create(core("services"), {"metadata": meta, "spec": {"ports": []}})

    kube_api.client.delete(mp("chat"))

    names = [s["metadata"]["name"] for s in kube_api.client.get(core("services"))["items"]]
    assert names == ["unrelated"]


def test_kubectl_describe_shows_the_events_of_an_object(
    kube_api: KubeApi, kubectl_installed: str
) -> None:
    pool = kube_api.client.create(mp(), baseline_pool().dict())
    for name, reason in (("chat", "InvalidSpec"), ("other", "SomethingElse")):
        kube_api.client.create(core("events"), {
            "metadata": {"generateName": f"{name}."},
            "involvedObject": {"apiVersion": "kvpool.dev/v1alpha1", "kind": "ModelPool",
                               "name": name, "namespace": "default",
                               "uid": pool["metadata"]["uid"] if name == "chat" else "x"},
            "type": "Warning", "reason": reason, "message": f"about {name}",
        })  # fmt: skip

    described = kube_api.kubectl("describe", "modelpool", "chat").stdout

    assert "InvalidSpec" in described and "about chat" in described
    assert "SomethingElse" not in described
