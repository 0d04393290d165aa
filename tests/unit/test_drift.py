"""Drift of owned fields (domain/drift): what a hand edit is, and what a server default is not."""

from __future__ import annotations

from typing import Any

import pytest

from kvpool.domain.drift import find_drift

TEMPLATE = {
    "spec": {
        "containers": [
            {
                "name": "engine",
                "image": "vllm:1",
                "args": ["--port=8000"],
                "ports": [{"containerPort": 8000}],
                "resources": {"requests": {"cpu": "1000m", "memory": "1Gi"}},
            }
        ]
    }
}


def stored(**container: Any) -> dict[str, Any]:
    """The template as an API server stores it: defaults added, then ``container`` edits."""
    engine = dict(TEMPLATE["spec"]["containers"][0])  # type: ignore[index]
    engine |= {
        "imagePullPolicy": "IfNotPresent",
        "terminationMessagePath": "/dev/termination-log",
        "ports": [{"containerPort": 8000, "protocol": "TCP"}],
        "resources": {"requests": {"cpu": "1", "memory": "1073741824"}},
    }
    engine |= container
    return {
        "spec": {"containers": [engine], "restartPolicy": "Always", "dnsPolicy": "ClusterFirst"}
    }


CASES = [
    ("server-defaults-are-not-drift", stored(), []),
    ("hand-patched-image", stored(image="vllm:evil"), ["spec.containers[0].image"]),
    ("arg-added", stored(args=["--port=8000", "--x"]), ["spec.containers[0].args"]),
    ("port-changed-as-text", stored(ports=[{"containerPort": "8000"}]), []),
    ("memory-lowered", stored(resources={"requests": {"cpu": "1", "memory": "512Mi"}}),
     ["spec.containers[0].resources.requests.memory"]),
    ("field-removed", stored(args=None), ["spec.containers[0].args"]),
]  # fmt: skip


@pytest.mark.parametrize(("current", "drift"), [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_find_drift(current: dict[str, Any], drift: list[str]) -> None:
    assert find_drift(TEMPLATE, current) == drift


def test_a_sidecar_added_by_hand_is_drift() -> None:
    current = stored()
    current["spec"]["containers"].append({"name": "sidecar", "image": "x"})
    assert find_drift(TEMPLATE, current) == ["spec.containers"]
