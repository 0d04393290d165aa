"""The import-linter contracts catch what they are there for: a back-import fails lint.

Why it exists: a layers contract that never breaks proves nothing (the circles behind the
controller's and the gateway's ``TYPE_CHECKING`` imports once went unseen because no
contract covered them).
Each case copies the package to a temporary directory, adds one import that goes against
a contract - under ``TYPE_CHECKING``, where a circle hides best - and runs ``lint-imports``
on the copy: it must fail and name the import; the untouched copy must pass.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
LINT_IMPORTS = Path(sys.executable).parent / "lint-imports"


@dataclass(frozen=True)
class Case:
    """One deliberate violation: which contract, which module gets which import."""

    id: str
    module: str  # path below operator/kvpool/
    imported: str  # the module it must not import
    name: str  # a name imported from it
    contract: str = "controller-layers"  # the contract's ``id`` in pyproject.toml


CASES = [
    Case("work-imports-root", "controller/pool.py", "kvpool.controller.wiring", "Operator"),
    Case("state-imports-work", "controller/state.py", "kvpool.controller.publisher", "Cache"),
    Case("rollout-imports-pool", "controller/rollout.py", "kvpool.controller.pool", "PoolOutcome"),
    # the gateway's old circle: the pipeline took GatewaySettings from the server
    Case(
        "pipeline-imports-root",
        "gateway/pipeline.py",
        "kvpool.gateway.server",
        "Gateway",
        contract="gateway-layers",
    ),
    Case(
        "bottom-imports-root",
        "gateway/errors.py",
        "kvpool.gateway.server",
        "Gateway",
        contract="gateway-layers",
    ),
    Case(
        "part-imports-registry",
        "gateway/pool_runtime.py",
        "kvpool.gateway.registry",
        "PoolRegistry",
        contract="gateway-layers",
    ),
]


def _copy(tmp_path: Path) -> Path:
    src = tmp_path / "src"
    ignore = shutil.ignore_patterns("__pycache__")
    shutil.copytree(REPO / "operator" / "kvpool", src / "kvpool", ignore=ignore)
    shutil.copy(REPO / "pyproject.toml", tmp_path / "pyproject.toml")
    return src


def _lint(tmp_path: Path, src: Path, contract: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(LINT_IMPORTS), "--no-cache", "--contract", contract],
        cwd=tmp_path,
        env={**os.environ, "PYTHONPATH": str(src)},
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


def test_the_untouched_copy_passes(tmp_path: Path) -> None:
    src = _copy(tmp_path)
    for contract in sorted({case.contract for case in CASES}):
        result = _lint(tmp_path, src, contract)
        assert result.returncode == 0, f"{contract} broken on the clean tree:\n{result.stdout}"


@pytest.mark.parametrize("case", CASES, ids=[c.id for c in CASES])
def test_a_back_import_breaks_the_contract(tmp_path: Path, case: Case) -> None:
    src = _copy(tmp_path)
    module = src / "kvpool" / case.module
    text = module.read_text()
    marker = "from __future__ import annotations\n"
    assert marker in text, f"{case.module} has no {marker!r} to add the import after"
    module.write_text(
        text.replace(
            marker,
            f"{marker}\nfrom typing import TYPE_CHECKING\n\n"
            f"if TYPE_CHECKING:\n    from {case.imported} import {case.name}  # noqa: F401\n",
            1,
        )
    )
    result = _lint(tmp_path, src, case.contract)
    importer = "kvpool." + case.module.removesuffix(".py").replace("/", ".")
    assert result.returncode == 1, (
        f"lint-imports passed with {importer} importing {case.imported}:\n{result.stdout}"
    )
    assert f"{importer} -> {case.imported}" in result.stdout, result.stdout
