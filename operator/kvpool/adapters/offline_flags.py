"""The flags that say where an offline compile finds engines and keys, defined once.

Why this module exists: ``kvpool compile`` and ``kvpool gateway -f`` compile manifests
the same way (:mod:`kvpool.adapters.offline_compile`) and take the same ``--endpoints``
and ``--key-file`` flags; one definition keeps their spelling, metavar and help alike
(the values are parsed by ``parse_endpoint_flags`` and ``parse_key_file_flags``).
"""

from __future__ import annotations

import argparse


def add_engine_and_key_flags(group: argparse._ActionsContainer) -> None:
    """Add ``--endpoints POOL=URL[,URL]`` and ``--key-file SECRET/KEY=PATH`` (both
    repeatable, into ``endpoints`` and ``key_files``) to a parser or argument group."""
    group.add_argument(
        "--endpoints",
        action="append",
        default=[],
        metavar="POOL=URL[,URL]",
        help="the engines of a ModelPool (repeatable; default: its kvpool.dev/static-endpoints)",
    )
    group.add_argument(
        "--key-file",
        dest="key_files",
        action="append",
        default=[],
        metavar="SECRET/KEY=PATH",
        help="a tenant key's file, for a Secret that is not in the manifests (repeatable)",
    )
