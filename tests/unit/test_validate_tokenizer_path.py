"""``kvpool validate`` refuses a ModelPool ``tokenizerPath`` that is no tokenizer file
(issue 18.2): anything under /dev, /proc or /sys (on every machine), and a FIFO, device or
socket it finds at the path on this machine (a real FIFO here). Before, ``tokenizerPath:
/dev/zero`` passed ("4 objects valid") and froze the gateway that loaded it.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from tests.unit.test_validate import run_cli, valid_set, write_manifests


def _validate(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], tokenizer_path: str
) -> tuple[int, list[str]]:
    manifests = valid_set()
    manifests.pool["spec"]["model"]["tokenizerPath"] = tokenizer_path
    file = write_manifests(tmp_path / "set.yaml", manifests.documents())
    code, out, _ = run_cli(capsys, "validate", "-f", str(file))
    return code, out


@pytest.mark.parametrize(
    ("path", "said"),
    [
        ("/dev/zero", "'/dev/zero' is a device or kernel file (under /dev/)"),
        ("/dev//./urandom", "'/dev//./urandom' is a device or kernel file (under /dev/)"),
        ("/proc/self/mem", "'/proc/self/mem' is a device or kernel file (under /proc/)"),
        ("/sys/kernel/notes", "is a device or kernel file (under /sys/)"),
        ("FIFO", "is a FIFO (named pipe) on this machine, not a tokenizer.json"),
    ],
    ids=["dev-zero", "dev-spelled-oddly", "proc", "sys", "fifo-on-this-machine"],
)
def test_device_and_fifo_tokenizer_paths_are_refused(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], path: str, said: str
) -> None:
    if path == "FIFO":
        path = str(tmp_path / "tokenizer.json")
        os.mkfifo(path)
    code, out = _validate(tmp_path, capsys, path)
    assert code == 1, f"tokenizerPath {path!r} passed: {out}"
    [line] = [line for line in out if "tokenizerPath" in line]
    assert "ModelPool/chat: spec.model.tokenizerPath: " in line and said in line, line
    assert "regular file" in line, line


@pytest.mark.parametrize(
    "kind", ["file", "folder", "elsewhere"], ids=["file", "folder", "not-on-this-machine"]
)
def test_regular_and_unseen_tokenizer_paths_pass(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], kind: str
) -> None:
    path = tmp_path / "tokenizer.json"
    if kind == "file":
        path.write_text("{}")
    elif kind == "folder":
        path = tmp_path
    else:
        path = Path("/models/llama/tokenizer.json")  # inside the gateway's pod
    code, out = _validate(tmp_path, capsys, str(path))
    assert code == 0, out
