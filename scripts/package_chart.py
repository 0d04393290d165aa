"""Package charts/kvpool as a Helm chart archive (``helm package``), versions from kvpool.

The chart's ``version`` is the SemVer spelling of ``kvpool.__version__`` (PEP 440
``0.1.0.dev0`` -> ``0.1.0-dev.0``, ``1.2.0rc1`` -> ``1.2.0-rc.1``) and its ``appVersion``
the version itself (the image tag). The archive is OCI-ready: ``helm push
dist/kvpool-VERSION.tgz oci://REGISTRY/charts`` (``make chart-push``). Uses the Helm SDK
through helm-python-sdk, so no helm binary is needed to package.

    python scripts/package_chart.py --out-dir dist     # -> dist/kvpool-0.1.0-dev.0.tgz
    python scripts/package_chart.py --print-version    # -> 0.1.0-dev.0
"""

from __future__ import annotations

import argparse
import re
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
CHART = ROOT / "charts" / "kvpool"
sys.path.insert(0, str(ROOT / "operator"))

from kvpool import __version__  # noqa: E402  (the package may not be installed)

_PEP440 = re.compile(r"^(\d+\.\d+\.\d+)(?:(a|b|rc)(\d+))?(?:\.post(\d+))?(?:\.dev(\d+))?$")


def chart_version(version: str = __version__) -> str:
    """The SemVer 2 spelling of a PEP 440 release version.

    >>> chart_version("0.1.0.dev0"), chart_version("1.2.0rc1"), chart_version("1.2.0")
    ('0.1.0-dev.0', '1.2.0-rc.1', '1.2.0')
    """
    match = _PEP440.match(version)
    if match is None:
        raise SystemExit(
            f"kvpool.__version__ {version!r} is not MAJOR.MINOR.PATCH[aN|bN|rcN][.devN]"
        )
    release, pre, pre_n, post, dev = match.groups()
    suffix = []
    if pre:
        label = {"a": "alpha", "b": "beta"}.get(pre, pre)
        suffix.append(f"{label}.{pre_n}")
    if post:
        suffix.append(f"post.{post}")
    if dev:
        suffix.append(f"dev.{dev}")
    return release + ("-" + ".".join(suffix) if suffix else "")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out-dir", type=Path, default=ROOT / "dist")
    parser.add_argument("--print-version", action="store_true")
    args = parser.parse_args()
    if args.print_version:
        print(chart_version())
        return 0
    import helm_python

    args.out_dir.mkdir(parents=True, exist_ok=True)
    archive = helm_python.package(
        CHART, destination=args.out_dir, version=chart_version(), app_version=__version__
    )
    print(archive)
    return 0


if __name__ == "__main__":
    sys.exit(main())
