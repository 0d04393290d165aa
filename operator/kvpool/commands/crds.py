"""``kvpool crds``: print the generated CustomResourceDefinitions, or write them to crds/.

The CRDs are rendered from the pydantic models (:mod:`kvpool.api.crd`); ``make crds``
runs ``kvpool crds --out-dir crds/`` and a unit test fails when the committed files drift.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from kvpool.api.crd import CRD_KINDS, build_crd, render_crd_yaml


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--out-dir",
        type=Path,
        default=None,
        help="write one file per CRD (<plural>.yaml) into this directory instead of printing",
    )


def run(args: argparse.Namespace) -> int:
    rendered = {kind.plural: render_crd_yaml(build_crd(kind)) for kind in CRD_KINDS}
    if args.out_dir is None:
        sys.stdout.write("".join(rendered.values()))
        return 0
    out_dir: Path = args.out_dir
    out_dir.mkdir(parents=True, exist_ok=True)
    for plural, text in rendered.items():
        (out_dir / f"{plural}.yaml").write_text(text, encoding="utf-8")
        print(f"wrote {out_dir / f'{plural}.yaml'}")
    return 0
