"""Canary rollouts through the operator against the API emulator (local mode, no engines).

Given a pool in local mode (``kvpool.dev/static-endpoints`` for stable,
``kvpool.dev/canary-static-endpoints`` for the canary) and no Prometheus, a change of the
engine image must start a rollout with a ``chat-canary`` Deployment while ``chat-stable``
keeps its template; the KV gate stays Inconclusive (nothing measured), so the canary gets
no weight. Users act through the ``kvpool.dev/rollout`` annotation: pause, resume, abort,
promote. Reverting the spec ends the rollout; a new change supersedes the canary. An
operator killed at any phase and restarted never makes a second canary and never loses
stable. (Gates against real engines and Prometheus: test_rollout_real_parts.py.)
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from typing import Any

from tests.integration.test_operator import (
    admission_config,
    core,
    events,
    given_policy_tenant_and_pool,
    mp,
    names,
    status,
)
from tests.operator_process import OperatorProcess, run_operator
from tests.support.kube import KubeApi, write_kubeconfig
from tests.support.waiting import wait_until

OLD, NEW, NEWER = "vllm/vllm-openai:v0.11.0", "vllm/vllm-openai:v0.12.0", "vllm/vllm-openai:v0.13.0"
STABLE_URLS = "s1=http://127.0.0.1:9001,s2=http://127.0.0.1:9002"
CANARY_URLS = "c1=http://127.0.0.1:9101,c2=http://127.0.0.1:9102"


def deployment(kube: KubeApi, name: str) -> dict[str, Any]:
    return kube.client.get(core("deployments", name, api="apps/v1"))  # type: ignore[no-any-return]


def image(kube: KubeApi, name: str) -> str:
    return str(deployment(kube, name)["spec"]["template"]["spec"]["containers"][0]["image"])


def rollout(kube: KubeApi) -> dict[str, Any]:
    return status(kube).get("rollout") or {}


def phase(kube: KubeApi) -> tuple[Any, Any, Any]:
    r = rollout(kube)
    return r.get("phase"), r.get("stage"), r.get("reason")


def annotate(kube: KubeApi, **annotations: str | None) -> None:
    kube.client.patch(mp("chat"), {"metadata": {"annotations": annotations}})


def set_image(kube: KubeApi, value: str) -> None:
    kube.client.patch(mp("chat"), {"spec": {"engine": {"image": value}}})


def tracks(kube: KubeApi) -> dict[str, dict[str, Any]]:
    return {t["name"]: t for t in admission_config(kube)["pools"][0]["tracks"]}


def given_a_local_pool(kube: KubeApi) -> str:
    given_policy_tenant_and_pool(kube)
    kube.client.patch(
        mp("chat"),
        {
            "metadata": {"annotations": {"kvpool.dev/static-endpoints": STABLE_URLS}},
            "spec": {"rollout": {"drainTimeout": "1s", "analysisInterval": "1s"}},
        },
    )
    wait_until(lambda: rollout(kube).get("phase") == "Idle")
    return str(rollout(kube)["stableRevision"])


def test_annotations_drive_a_rollout_and_a_revert_ends_it(
    kube_api: KubeApi, tmp_path: Path
) -> None:
    with run_operator(kube_api, tmp_path):
        first = given_a_local_pool(kube_api)
        assert image(kube_api, "chat-stable") == OLD

        # When the engine image changes: a canary, stable untouched, no canary weight yet
        annotate(kube_api, **{"kvpool.dev/canary-static-endpoints": CANARY_URLS})
        set_image(kube_api, NEW)
        wait_until(lambda: phase(kube_api) == ("Progressing", "Starting", None))
        assert image(kube_api, "chat-canary") == NEW and image(kube_api, "chat-stable") == OLD
        assert deployment(kube_api, "chat-canary")["spec"]["replicas"] == 1
        assert rollout(kube_api)["stableRevision"] == first
        assert rollout(kube_api)["canaryRevision"] == status(kube_api)["revision"] != first
        wait_until(lambda: "canary" in tracks(kube_api))
        assert tracks(kube_api)["canary"]["weight"] == 0  # the KV gate has not passed
        assert admission_config(kube_api)["pools"][0]["canaryTiers"] == ["interactive"]
        assert "RolloutStarted" in events(kube_api)

        # pause / resume / abort by annotation
        annotate(kube_api, **{"kvpool.dev/rollout": "pause"})
        wait_until(lambda: phase(kube_api) == ("Paused", "Starting", "ManualPause"))
        annotate(kube_api, **{"kvpool.dev/rollout": "resume"})
        wait_until(lambda: phase(kube_api)[0] == "Progressing")
        annotate(kube_api, **{"kvpool.dev/rollout": "abort"})
        wait_until(lambda: phase(kube_api) == ("Aborted", "Starting", "ManualAbort"))
        wait_until(lambda: deployment(kube_api, "chat-canary")["spec"]["replicas"] == 0)
        wait_until(lambda: tracks(kube_api)["canary"]["endpoints"] == [])
        assert tracks(kube_api)["canary"]["weight"] == 0
        assert image(kube_api, "chat-stable") == OLD  # stable pinned

        # When a newer change arrives: it supersedes the canary (same Deployment)
        set_image(kube_api, NEWER)
        wait_until(lambda: phase(kube_api) == ("Progressing", "Starting", None))
        wait_until(lambda: image(kube_api, "chat-canary") == NEWER)
        assert names(kube_api, "deployments", "apps/v1") == ["chat-canary", "chat-stable"]
        wait_until(lambda: "RolloutSuperseded" in events(kube_api))  # posted after the status

        # When the spec goes back to the stable image: the rollout ends, canary removed
        set_image(kube_api, OLD)
        wait_until(lambda: phase(kube_api) == ("Idle", None, None))
        wait_until(lambda: names(kube_api, "deployments", "apps/v1") == ["chat-stable"])
        wait_until(lambda: set(tracks(kube_api)) == {"stable"})
        assert names(kube_api, "services") == ["chat-stable"]
        assert rollout(kube_api)["stableRevision"] == first
        cond = next(c for c in status(kube_api)["conditions"] if c["type"] == "Progressing")
        assert (cond["status"], cond["reason"]) == ("False", "NoRollout")


def test_promote_by_hand_drains_and_replaces_stable(kube_api: KubeApi, tmp_path: Path) -> None:
    with run_operator(kube_api, tmp_path) as operator:
        given_a_local_pool(kube_api)
        annotate(kube_api, **{"kvpool.dev/canary-static-endpoints": CANARY_URLS})
        set_image(kube_api, NEW)
        wait_until(lambda: phase(kube_api) == ("Progressing", "Starting", None))
        new = rollout(kube_api)["canaryRevision"]

        annotate(kube_api, **{"kvpool.dev/rollout": "promote"})
        # Then: every tier on the canary at full size, stable drained, then replaced
        wait_until(lambda: phase(kube_api) == ("Promoted", None, None), timeout=30)
        assert rollout(kube_api)["stableRevision"] == new
        assert image(kube_api, "chat-stable") == NEW
        wait_until(lambda: names(kube_api, "deployments", "apps/v1") == ["chat-stable"])
        wait_until(lambda: set(tracks(kube_api)) == {"stable"})
        assert tracks(kube_api)["stable"]["revision"] == new
        reasons = events(kube_api)
        assert "RolloutPromoting" in reasons and "RolloutPromoted" in reasons
        metrics = operator.metrics()
        assert 'kvpool_rollout_phase{namespace="default",phase="Promoted",pool="chat"} 1.0' in (
            metrics
        )


def test_an_operator_killed_at_every_phase_keeps_one_canary_and_stable(
    kube_api: KubeApi, tmp_path: Path
) -> None:
    op = OperatorProcess(kube_api, tmp_path)
    try:
        op.start()
        given_a_local_pool(kube_api)
        annotate(kube_api, **{"kvpool.dev/canary-static-endpoints": CANARY_URLS})

        def killed_and_restarted(expected: tuple[Any, Any, Any]) -> None:
            op.restart(kill=True)
            wait_until(lambda: phase(kube_api) == expected)
            assert names(kube_api, "deployments", "apps/v1") == ["chat-canary", "chat-stable"]
            assert image(kube_api, "chat-stable") == OLD

        set_image(kube_api, NEW)
        wait_until(lambda: phase(kube_api) == ("Progressing", "Starting", None))
        killed_and_restarted(("Progressing", "Starting", None))
        annotate(kube_api, **{"kvpool.dev/rollout": "pause"})
        wait_until(lambda: phase(kube_api)[0] == "Paused")
        killed_and_restarted(("Paused", "Starting", "ManualPause"))
        annotate(kube_api, **{"kvpool.dev/rollout": "abort"})
        wait_until(lambda: phase(kube_api)[0] == "Aborted")
        killed_and_restarted(("Aborted", "Starting", "ManualAbort"))
        assert deployment(kube_api, "chat-canary")["spec"]["replicas"] == 0
        # a handled annotation is not acted on again after the restart
        annotate(kube_api, **{"kvpool.dev/rollout": "resume@1"})
        wait_until(lambda: phase(kube_api) == ("Progressing", "Starting", None))
        killed_and_restarted(("Progressing", "Starting", None))
        assert rollout(kube_api)["handledAction"] == "resume@1"
    finally:
        op.stop()


def plugin_env(kubeconfig: Path, tmp_path: Path) -> dict[str, str]:
    """What ``kubectl kvpool`` runs with: the venv's bin on the PATH, this kubeconfig."""
    return {
        "PATH": f"{Path(sys.executable).parent}:/usr/bin:/bin",
        "KUBECONFIG": str(kubeconfig),
        "HOME": str(tmp_path),
    }


def run_plugin(
    kubeconfig: Path, tmp_path: Path, *args: str, expect: int = 0
) -> subprocess.CompletedProcess[str]:
    """``kubectl kvpool ...`` through the real kubectl, finding the plugin on the PATH."""
    done = subprocess.run(
        ["kubectl", "kvpool", *args],
        check=False,
        env=plugin_env(kubeconfig, tmp_path),
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == expect, (done.stdout, done.stderr)
    return done


def kubectl_kvpool(kube: KubeApi, tmp_path: Path, *args: str) -> str:
    """``kubectl kvpool ...`` with the emulator's own kubeconfig; must exit 0."""
    return run_plugin(kube.kubeconfig, tmp_path, *args).stdout


def test_the_kubectl_plugin_shows_and_drives_a_rollout(kube_api: KubeApi, tmp_path: Path) -> None:
    with run_operator(kube_api, tmp_path):
        given_a_local_pool(kube_api)
        annotate(kube_api, **{"kvpool.dev/canary-static-endpoints": CANARY_URLS})
        set_image(kube_api, NEW)
        wait_until(lambda: phase(kube_api) == ("Progressing", "Starting", None))
        shown = kubectl_kvpool(kube_api, tmp_path, "rollout", "status", "chat", "-n", "default")
        assert "ModelPool chat: Progressing/Starting" in shown
        assert "-> 1. weight 10% for 5m" in shown and "2. weight 50% for 10m" in shown

        out = kubectl_kvpool(kube_api, tmp_path, "rollout", "pause", "chat")
        assert "kvpool.dev/rollout=pause@" in out
        wait_until(lambda: phase(kube_api) == ("Paused", "Starting", "ManualPause"))
        shown = kubectl_kvpool(kube_api, tmp_path, "rollout", "status", "chat")
        assert "paused because: ManualPause" in shown

        kubectl_kvpool(kube_api, tmp_path, "rollout", "resume", "chat")
        wait_until(lambda: phase(kube_api)[0] == "Progressing")
        kubectl_kvpool(kube_api, tmp_path, "rollout", "abort", "chat")
        wait_until(lambda: phase(kube_api) == ("Aborted", "Starting", "ManualAbort"))
        kubectl_kvpool(kube_api, tmp_path, "rollout", "resume", "chat")
        wait_until(lambda: phase(kube_api) == ("Progressing", "Starting", None))
        assert kube_api.client.get(mp("chat"))["spec"]["engine"]["image"] == NEW  # spec kept


def test_the_plugin_follows_the_context_namespace_refuses_ignored_actions_and_watches(
    kube_api: KubeApi, tmp_path: Path
) -> None:
    with run_operator(kube_api, tmp_path):
        given_a_local_pool(kube_api)
        annotate(kube_api, **{"kvpool.dev/canary-static-endpoints": CANARY_URLS})

        # Given a kubeconfig whose context namespace is "elsewhere" (the pool is in default)
        elsewhere = write_kubeconfig(tmp_path / "elsewhere", kube_api.url, namespace="elsewhere")
        missing = run_plugin(elsewhere, tmp_path, "rollout", "status", "chat", expect=1)
        assert "ModelPool elsewhere/chat not found" in missing.stderr
        assert "kubectl kvpool rollout list -n elsewhere" in missing.stderr
        shown = run_plugin(elsewhere, tmp_path, "rollout", "status", "chat", "-n", "default")
        assert "ModelPool chat: Idle" in shown.stdout

        # list: one line per pool
        listed = kubectl_kvpool(kube_api, tmp_path, "rollout", "list").splitlines()
        assert listed[0].split() == ["NAME", "PHASE", "STAGE", "STEP", "WEIGHT", "STABLE", "CANARY",
                                     "REASON"]  # fmt: skip
        assert listed[1].split()[:2] == ["chat", "Idle"]

        # an action the operator would ignore is refused, and nothing is annotated
        refused = run_plugin(kube_api.kubeconfig, tmp_path, "rollout", "abort", "chat", expect=1)
        assert "no rollout in progress (phase Idle): 'abort' would be ignored" in refused.stderr
        annotations = kube_api.client.get(mp("chat"))["metadata"].get("annotations", {})
        assert "kvpool.dev/rollout" not in annotations

        # --watch follows a rollout to its end: aborted is exit 1
        set_image(kube_api, NEW)
        watcher = subprocess.Popen(
            ["kubectl", "kvpool", "rollout", "status", "chat", "--watch", "--interval", "0.2"],
            env=plugin_env(kube_api.kubeconfig, tmp_path),
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        try:
            wait_until(lambda: phase(kube_api) == ("Progressing", "Starting", None))
            refused = run_plugin(kube_api.kubeconfig, tmp_path, "rollout", "resume", "chat",
                                 expect=1)  # fmt: skip
            assert "'resume' does nothing in phase Progressing" in refused.stderr
            done = kubectl_kvpool(kube_api, tmp_path, "rollout", "abort", "chat")
            assert "rollout status chat -n default --watch" in done
            out, err = watcher.communicate(timeout=60)
        finally:
            watcher.kill()
            watcher.wait()
        assert watcher.returncode == 1, err
        assert "ModelPool chat: Progressing/Starting" in out
        assert "ModelPool chat: Aborted/Starting (ManualAbort)" in out


def test_an_unschedulable_canary_pauses_instead_of_stalling(
    kube_api: KubeApi, tmp_path: Path
) -> None:
    with run_operator(kube_api, tmp_path):
        # Given a pool in cluster mode (no static endpoints) with a short unschedulableTimeout
        given_policy_tenant_and_pool(kube_api)
        kube_api.client.patch(mp("chat"), {"spec": {"rollout": {"unschedulableTimeout": "3s"}}})
        wait_until(lambda: rollout(kube_api).get("phase") == "Idle")
        set_image(kube_api, NEW)
        wait_until(lambda: phase(kube_api) == ("Progressing", "Starting", None))
        # When the canary's pod stays Pending: no node has room for it
        pod = {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {
                "name": "chat-canary-abc",
                "namespace": "default",
                "labels": {"kvpool.dev/pool": "chat", "kvpool.dev/track": "canary"},
            },
            "spec": {"containers": [{"name": "engine", "image": NEW}]},
        }
        kube_api.client.create(core("pods"), pod)
        kube_api.client.patch(
            core("pods", "chat-canary-abc") + "/status",
            {
                "status": {
                    "phase": "Pending",
                    "conditions": [
                        {
                            "type": "PodScheduled",
                            "status": "False",
                            "reason": "Unschedulable",
                            "message": "0/3 nodes are available: 3 Insufficient nvidia.com/gpu.",
                        }
                    ],
                }
            },
        )
        # Then the rollout pauses with CanaryUnschedulable after the timeout (no silent stall)
        wait_until(lambda: phase(kube_api) == ("Paused", "Starting", "CanaryUnschedulable"))
        assert "unschedulable" in rollout(kube_api)["message"]
        wait_until(lambda: "RolloutPaused" in events(kube_api))  # posted after the status
        cond = next(c for c in status(kube_api)["conditions"] if c["type"] == "Progressing")
        assert (cond["status"], cond["reason"]) == ("False", "CanaryUnschedulable")
