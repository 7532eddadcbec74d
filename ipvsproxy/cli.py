"""Command line: argparse only. Flags become arguments for one call into a subcommand module."""

from __future__ import annotations

import argparse
import importlib
import sys
from collections.abc import Sequence
from types import ModuleType

from ipvsproxy import __version__

# name -> (module, one-line help). The module holds the description, flags and the work.
SUBCOMMANDS: dict[str, tuple[str, str]] = {
    "run": (
        "ipvsproxy.commands.run",
        "run the node proxy daemon: watch the API and keep IPVS, ipsets and iptables in sync",
    ),
    "sync": (
        "ipvsproxy.commands.sync",
        "compute the desired dataplane once (from a file or the API) and program the kernel",
    ),
    "ls": (
        "ipvsproxy.commands.ls",
        "list IPVS virtual and real servers; output is identical to ipvsadm's",
    ),
    "cleanup": (
        "ipvsproxy.commands.cleanup",
        "remove everything ipvsproxy owns from the kernel (and nothing else)",
    ),
    "explain": (
        "ipvsproxy.commands.explain",
        "say which real server a client's next connection to a service reaches, and why",
    ),
}


class CliError(Exception):
    """A user-facing error: printed as one line, exit code 2."""


def _load(name: str) -> ModuleType:
    return importlib.import_module(SUBCOMMANDS[name][0])


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="ipvsproxy",
        description="ipvsproxy: a Kubernetes service proxy that programs Linux IPVS over netlink.",
    )
    parser.add_argument("--version", action="version", version=f"ipvsproxy {__version__}")
    parser.add_argument(
        "-v", "--verbosity", type=int, default=0, metavar="N",
        help="log verbosity: 0 (default) info, 2 or more debug including libraries",
    )
    parser.add_argument(
        "--log-format", choices=["json", "console"], default=None,
        help="log format (default: console on a terminal, json otherwise)",
    )
    subs = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    for name, (_, help_text) in SUBCOMMANDS.items():
        module = _load(name)
        sub = subs.add_parser(
            name,
            help=help_text,
            description=getattr(module, "DESCRIPTION", help_text),
            formatter_class=argparse.RawDescriptionHelpFormatter,
            **getattr(module, "PARSER_OPTIONS", {}),
        )
        module.add_arguments(sub)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    module = _load(args.command)
    if getattr(module, "LOGS", True):
        # structlog pulls in asyncio: seconds under emulation. Listing commands skip it.
        from ipvsproxy.logsetup import setup_logging

        setup_logging(args.verbosity, args.log_format)
    try:
        rc: int = module.run(args)
    except CliError as exc:
        print(f"ipvsproxy {args.command}: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130
    except BrokenPipeError:  # output piped into head(1) and the like: not an error
        sys.stderr.close()
        return 141
    return rc
