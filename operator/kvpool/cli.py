"""The ``kvpool`` command: validate and plan manifests, print CRDs, run the operator or gateway.

Each subcommand lives in its own module and is imported lazily, so ``kvpool validate``
does not pay for importing kopf or aiohttp.
"""

from __future__ import annotations

import argparse
import importlib
import sys
from collections.abc import Callable, Sequence
from typing import NoReturn

from kvpool import __version__

# subcommand -> (module, help); each module defines add_arguments(parser) and run(args) -> int
SUBCOMMANDS: dict[str, tuple[str, str]] = {
    "validate": ("kvpool.commands.validate", "check manifests against the CRDs and each other"),
    "plan": ("kvpool.commands.plan", "print the admission plan of each ModelPool"),
    "compile": (
        "kvpool.commands.compile",
        "compile manifests into the gateway's admission config (no cluster needed)",
    ),
    "crds": ("kvpool.commands.crds", "print the generated CustomResourceDefinitions"),
    "operator": ("kvpool.controller.main", "run the operator"),
    "gateway": ("kvpool.gateway.main", "run the admission gateway"),
    "rollout": ("kvpool.commands.rollout", "show or act on a ModelPool's canary rollout"),
    "tenant": ("kvpool.commands.tenant", "create a tenant: a Secret with a new key and a budget"),
}


class CommandParser(argparse.ArgumentParser):
    """argparse with usage errors on one line: ``kvpool gateway: error: argument --listen:
    'foo' is not HOST:PORT (e.g. 0.0.0.0:8080)``, exit 2 (``--help`` shows the usage)."""

    def error(self, message: str) -> NoReturn:
        self.exit(2, f"{self.prog}: error: {message} (see {self.prog} --help)\n")


def build_parser() -> argparse.ArgumentParser:
    parser = CommandParser(prog="kvpool", description=__doc__.splitlines()[0])
    parser.add_argument("--version", action="version", version=f"kvpool {__version__}")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for name, (module_name, help_text) in SUBCOMMANDS.items():
        module = importlib.import_module(module_name)
        command = sub.add_parser(name, help=help_text, description=help_text)
        command.error = CommandParser.error.__get__(command)  # type: ignore[method-assign]
        module.add_arguments(command)
        run: Callable[[argparse.Namespace], int] = module.run
        command.set_defaults(run=run)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    # Import only the module of the chosen subcommand when we can tell which it is.
    if argv and argv[0] in SUBCOMMANDS:
        module = importlib.import_module(SUBCOMMANDS[argv[0]][0])
        parser = CommandParser(prog=f"kvpool {argv[0]}", description=SUBCOMMANDS[argv[0]][1])
        module.add_arguments(parser)
        args = parser.parse_args(argv[1:])
        return int(module.run(args))
    args = build_parser().parse_args(argv)
    return int(args.run(args))


if __name__ == "__main__":
    sys.exit(main())
