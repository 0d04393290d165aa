"""Fixtures for tests that need a Kubernetes API: the in-memory emulator, one per test.

Why per test: starting it costs ~10 ms, and a fresh API (no objects but the ``default`` and
``kube-system`` namespaces, resourceVersions from 1) keeps tests independent.

- ``kube_api``: a started :class:`tests.support.kube.KubeApi` serving ``crds/*.yaml``:
  ``.url``, ``.port``, ``.kubeconfig`` (Path), ``.client`` (blocking :class:`KubeClient`),
  ``.async_client()`` (async context manager), ``.kubectl(*args)``, ``.connection_info()``
  (for ``@kopf.on.login``), ``.emulator`` (kmock handler: ``.requests``, reactions for
  fault injection), ``.call(fn)`` (run ``fn(emulator)`` on the emulator's loop). Stopped at
  teardown; the test fails if the emulator itself crashed on a request.
- ``kube_api_env``: the same, with ``KUBECONFIG`` pointing at it for the test's duration (for
  code that logs in from the environment, e.g. ``kvpool.adapters.kube.load_connection()``).
  Beware: ``kubernetes.config.load_kube_config()`` without ``config_file`` uses the
  ``KUBECONFIG`` seen when the ``kubernetes`` package was first imported, not this one.
- ``operator``: a ``kvpool operator`` process (:class:`tests.operator_process.OperatorProcess`,
  standalone, 1 s measure interval, no Prometheus) against ``kube_api``; stopped at teardown.
- ``kubectl_installed``: the path of ``kubectl``; a test that needs it fails under CI
  (``CI=true``) and is skipped locally when it is missing.
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.operator_process import OperatorProcess, run_operator
from tests.support.kube import KubeApi, start_kube_api


@pytest.fixture
def kube_api(tmp_path: Path) -> Iterator[KubeApi]:
    workdir = tmp_path / "kube-api"
    workdir.mkdir()
    with start_kube_api(workdir) as api:
        yield api


@pytest.fixture
def kube_api_env(kube_api: KubeApi, monkeypatch: pytest.MonkeyPatch) -> KubeApi:
    monkeypatch.setenv("KUBECONFIG", str(kube_api.kubeconfig))
    return kube_api


@pytest.fixture
def operator(kube_api: KubeApi, tmp_path: Path) -> Iterator[OperatorProcess]:
    with run_operator(kube_api, tmp_path) as op:
        yield op


@pytest.fixture
def kubectl_installed() -> str:
    path = shutil.which("kubectl")
    if path is None:
        message = "kubectl is not installed (apt-get install kubectl, or put it in PATH)"
        if os.environ.get("CI", "").lower() not in ("", "0", "false", "no"):
            pytest.fail(f"CI: {message}", pytrace=False)
        pytest.skip(message)
    return path
