"""From a clone to an install: one version everywhere, an image that builds the package as
``pip install .`` does, a chart that packages for an OCI registry, a krew plugin.

There is no Docker engine on the development machines: the image test builds the wheel
from exactly the files the Dockerfile copies (after .dockerignore) and checks what the
image would carry; with a Docker engine the image itself is built.
"""

from __future__ import annotations

import hashlib
import io
import os
import re
import shutil
import subprocess
import sys
import tarfile
import zipfile
from pathlib import Path

import helm_python
import pytest
import yaml

import kvpool

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "scripts"))

from krew_plugin import build_archive  # noqa: E402
from package_chart import chart_version  # noqa: E402


def make_dry_run(*targets: str) -> str:
    done = subprocess.run(
        ["make", "-n", *targets], cwd=ROOT, capture_output=True, text=True, check=True
    )
    return done.stdout


# --- one version --------------------------------------------------------------------------


def test_the_chart_and_the_image_follow_the_package_version() -> None:
    chart = yaml.safe_load((ROOT / "charts" / "kvpool" / "Chart.yaml").read_text())

    assert chart["appVersion"] == kvpool.__version__  # the image tag the chart deploys
    assert chart["version"] == chart_version(kvpool.__version__)
    assert 'dynamic = ["version"]' in (ROOT / "pyproject.toml").read_text()
    assert f"-t ghcr.io/kvpool/kvpool:{kvpool.__version__} -f Dockerfile ." in make_dry_run("image")


@pytest.mark.parametrize(
    ("pep440", "semver"),
    [("0.1.0.dev0", "0.1.0-dev.0"), ("1.2.0rc1", "1.2.0-rc.1"), ("1.2.0", "1.2.0"),
     ("2.0.0b3", "2.0.0-beta.3"), ("1.0.0.post1", "1.0.0-post.1")],
)  # fmt: skip
def test_chart_versions_are_semver(pep440: str, semver: str) -> None:
    assert chart_version(pep440) == semver


# --- the image ----------------------------------------------------------------------------


def docker_context_copies() -> list[str]:
    """What the build stage COPYs from the context, in order."""
    build = (ROOT / "Dockerfile").read_text().split("FROM ")[1]
    return [
        src
        for line in build.splitlines()
        if line.startswith("COPY ") and "--from" not in line
        for src in line.split()[1:-1]
    ]


def test_the_dockerfile_builds_the_wheel_pip_install_builds(tmp_path: Path) -> None:
    context = tmp_path / "context"
    ignored = shutil.ignore_patterns("__pycache__", "*.egg-info", "*.pyc")
    for src in docker_context_copies():
        source = ROOT / src
        if source.is_dir():
            shutil.copytree(source, context / src, ignore=ignored)
        else:
            context.mkdir(exist_ok=True)
            shutil.copy(source, context / src)
    done = subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "-q", "-w", str(tmp_path / "w"), "."],
        cwd=context, capture_output=True, text=True, timeout=300, check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    (wheel,) = (tmp_path / "w").glob("*.whl")

    names = zipfile.ZipFile(wheel).namelist()
    assert wheel.name == f"kvpool-{kvpool.__version__}-py3-none-any.whl"
    entry_points = (
        zipfile.ZipFile(wheel)
        .read(f"kvpool-{kvpool.__version__}.dist-info/entry_points.txt")
        .decode()
    )
    assert "kvpool = kvpool.cli:main" in entry_points
    assert "kubectl-kvpool = kvpool.commands.rollout:main" in entry_points  # the plugin
    assert "kvpool/py.typed" in names
    assert any(n.startswith("kvpool/adapters/budget/") and n.endswith(".lua") for n in names)
    assert not any(n.startswith(("tests/", "e2e/", "bench/")) for n in names)


def test_make_builds_the_kind_engine_image_from_a_small_context() -> None:
    script = make_dry_run("engine-image")

    assert "-f e2e/kind/engine.Dockerfile" in script
    assert "tests/support/tiny_model.py tests/support/make_tiny_model.py" in script


@pytest.mark.timeout(1800)
def test_the_image_builds_when_a_docker_engine_answers() -> None:
    docker = shutil.which("docker")
    if (
        docker is None
        or subprocess.run([docker, "info"], capture_output=True, check=False).returncode
    ):
        pytest.skip("no Docker engine answers here (docker info failed)")
    tag = f"kvpool:test-{os.getpid()}"
    subprocess.run(["make", "image", f"IMAGE_TAG={tag.split(':')[1]}", "IMAGE=kvpool"],
                   cwd=ROOT, check=True, timeout=1800)  # fmt: skip
    version = subprocess.run([docker, "run", "--rm", tag, "--version"], capture_output=True,
                             text=True, check=True).stdout.strip()  # fmt: skip
    assert version == f"kvpool {kvpool.__version__}"


# --- the chart archive --------------------------------------------------------------------


def test_the_chart_packages_with_the_versions(tmp_path: Path) -> None:
    done = subprocess.run(
        [sys.executable, "scripts/package_chart.py", "--out-dir", str(tmp_path)],
        cwd=ROOT, capture_output=True, text=True, timeout=120, check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    archive = tmp_path / f"kvpool-{chart_version()}.tgz"

    chart = helm_python.Chart.load_archive(archive.read_bytes())
    assert (chart.metadata["version"], chart.metadata["appVersion"]) == (
        chart_version(),
        kvpool.__version__,
    )
    assert chart.render({}, name="kvpool", namespace="kvpool-system")
    assert "helm push dist/kvpool-" in make_dry_run("chart-push")


# --- the krew plugin ----------------------------------------------------------------------


def test_the_krew_manifest_is_in_step_with_the_archive() -> None:
    manifest = yaml.safe_load((ROOT / "plugins" / "kvpool.yaml").read_text())
    archive = build_archive()

    assert (manifest["kind"], manifest["metadata"]["name"]) == ("Plugin", "kvpool")
    spec = manifest["spec"]
    assert spec["version"] == f"v{chart_version()}"
    (platform,) = spec["platforms"]
    assert platform["sha256"] == hashlib.sha256(archive).hexdigest()
    assert platform["uri"].endswith(f"/v{chart_version()}/kubectl-kvpool.tar.gz")
    assert platform["bin"] == "kubectl-kvpool"
    with tarfile.open(fileobj=io.BytesIO(archive)) as tar:
        members = tar.getmembers()
    assert [(m.name, m.mode & 0o111 != 0) for m in members] == [("kubectl-kvpool", True)]
    launcher = (ROOT / "plugins" / "kubectl-kvpool").read_text()
    assert re.search(rf'^version="{re.escape(kvpool.__version__)}"', launcher, re.M)
    assert build_archive() == archive  # reproducible: the sha256 is the same everywhere


def test_kubectl_runs_the_krew_launcher(tmp_path: Path) -> None:
    if shutil.which("kubectl") is None:
        pytest.skip("kubectl not installed")
    venv = Path(sys.executable).parent.parent  # an existing venv: nothing to install
    env = {"PATH": f"{ROOT / 'plugins'}:/usr/bin:/bin", "HOME": str(tmp_path),
           "KVPOOL_PLUGIN_VENV": str(venv)}  # fmt: skip

    done = subprocess.run(["kubectl", "kvpool", "rollout", "status"], env=env,
                          capture_output=True, text=True, timeout=60, check=False)  # fmt: skip

    assert done.returncode == 2, done.stderr  # the plugin's own usage error: it ran
    assert "rollout status needs a ModelPool NAME" in done.stderr
