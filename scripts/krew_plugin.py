"""The krew release of the kubectl plugin: its archive, and plugins/kvpool.yaml in step.

``make plugin`` writes ``dist/kubectl-kvpool.tar.gz`` (the launcher plugins/kubectl-kvpool,
with fixed owner and times so the archive and its sha256 are the same on every machine)
and rewrites the manifest's ``version``, ``uri`` and ``sha256``. Publishing is attaching
the archive to the GitHub release ``vVERSION`` and submitting plugins/kvpool.yaml to
krew-index; until then, ``kubectl krew install
--manifest=plugins/kvpool.yaml --archive=dist/kubectl-kvpool.tar.gz`` installs it.

    python scripts/krew_plugin.py --out-dir dist          # build, update the manifest
    python scripts/krew_plugin.py --check                 # exit 1 when the manifest is stale
"""

from __future__ import annotations

import argparse
import gzip
import hashlib
import io
import re
import sys
import tarfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
LAUNCHER = ROOT / "plugins" / "kubectl-kvpool"
MANIFEST = ROOT / "plugins" / "kvpool.yaml"
sys.path.insert(0, str(ROOT / "scripts"))
sys.path.insert(0, str(ROOT / "operator"))

from package_chart import chart_version  # noqa: E402

from kvpool import __version__  # noqa: E402

RELEASES = "https://github.com/kvpool/kvpool/releases/download"


def build_archive() -> bytes:
    """The tar.gz krew unpacks: ``kubectl-kvpool`` (executable), reproducible byte for byte."""
    launcher = LAUNCHER.read_bytes()
    raw = io.BytesIO()
    with tarfile.open(fileobj=raw, mode="w", format=tarfile.USTAR_FORMAT) as tar:
        info = tarfile.TarInfo("kubectl-kvpool")
        info.size, info.mode, info.mtime = len(launcher), 0o755, 0
        info.uid = info.gid = 0
        info.uname = info.gname = "root"
        tar.addfile(info, io.BytesIO(launcher))
    out = io.BytesIO()
    with gzip.GzipFile(fileobj=out, mode="wb", mtime=0) as gz:
        gz.write(raw.getvalue())
    return out.getvalue()


def expected_manifest(text: str, archive: bytes) -> str:
    """``text`` (the manifest) with version, uri and sha256 of this release."""
    tag = f"v{chart_version()}"
    text = re.sub(r"(?m)^  version: .*$", f"  version: {tag}", text)
    text = re.sub(r"(?m)^(\s+uri: ).*$", rf"\g<1>{RELEASES}/{tag}/kubectl-kvpool.tar.gz", text)
    return re.sub(r"(?m)^(\s+sha256: ).*$", rf"\g<1>{hashlib.sha256(archive).hexdigest()}", text)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out-dir", type=Path, default=ROOT / "dist")
    parser.add_argument("--check", action="store_true", help="only check the manifest")
    args = parser.parse_args()
    launcher_version = re.search(r'^version="(.*)"', LAUNCHER.read_text(), re.M)
    if launcher_version is None or launcher_version.group(1) != __version__:
        print(f"{LAUNCHER}: version must be {__version__!r}", file=sys.stderr)
        return 1
    archive = build_archive()
    current = MANIFEST.read_text()
    wanted = expected_manifest(current, archive)
    if args.check:
        if wanted != current:
            print(f"{MANIFEST} is stale: run make plugin", file=sys.stderr)
            return 1
        return 0
    args.out_dir.mkdir(parents=True, exist_ok=True)
    (args.out_dir / "kubectl-kvpool.tar.gz").write_bytes(archive)
    MANIFEST.write_text(wanted)
    print(args.out_dir / "kubectl-kvpool.tar.gz")
    return 0


if __name__ == "__main__":
    sys.exit(main())
