"""Command line: argparse only. Flags become arguments for one call into a subcommand module."""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Sequence
from types import ModuleType
from typing import Any

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


def _columns() -> int:
    """shutil.get_terminal_size().columns, without importing shutil (and with it zlib, bz2 and
    lzma): argparse builds a help formatter for every argument it adds, and each one asks."""
    try:
        columns = int(os.environ["COLUMNS"])
    except (KeyError, ValueError):
        columns = 0
    if columns <= 0:
        try:
            columns = os.get_terminal_size(sys.__stdout__.fileno()).columns  # type: ignore[union-attr]
        except (AttributeError, ValueError, OSError):
            columns = 0
    return columns or 80


def _formatters() -> tuple[type[argparse.HelpFormatter], type[argparse.HelpFormatter]]:
    """The help formatters (plain, raw description), sized to the terminal."""
    class _Help(argparse.HelpFormatter):
        def __init__(self, prog: str, indent_increment: int = 2, max_help_position: int = 24,
                     width: int | None = None) -> None:
            super().__init__(prog, indent_increment, max_help_position,
                             _columns() - 2 if width is None else width)

    class _RawHelp(_Help, argparse.RawDescriptionHelpFormatter):
        pass

    return _Help, _RawHelp


class CliError(Exception):
    """A user-facing error: printed as one line, exit code 2."""


def _load(name: str) -> ModuleType:
    module = SUBCOMMANDS[name][0]
    __import__(module)  # (not importlib.import_module: importlib is not on the `ls` path)
    return sys.modules[module]


def build_parser(command: str | None = None) -> argparse.ArgumentParser:
    """The whole command line. With `command`, only that subcommand's module is imported (the
    others are listed with their one-line help but take no arguments): `ipvsproxy ls` must not
    pay for importing what `sync` or `run` need."""
    _Help, _RawHelp = _formatters()
    parser = argparse.ArgumentParser(
        prog="ipvsproxy",
        description="ipvsproxy: a Kubernetes service proxy that programs Linux IPVS over netlink.",
        formatter_class=_Help,
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
        if command is not None and name != command:
            subs.add_parser(name, help=help_text, formatter_class=_Help)
            continue
        module = _load(name)
        sub = subs.add_parser(
            name,
            help=help_text,
            description=getattr(module, "DESCRIPTION", help_text),
            formatter_class=_RawHelp,
            **getattr(module, "PARSER_OPTIONS", {}),
        )
        module.add_arguments(sub)
    return parser


def _command(argv: Sequence[str]) -> str | None:
    """The subcommand named on the command line: the first word that is one (no global option
    takes a subcommand's name as its value)."""
    return next((a for a in argv if a in SUBCOMMANDS), None)


def main(argv: Sequence[str] | None = None) -> int:
    if argv is None:
        argv = sys.argv[1:]
    args = build_parser(_command(argv) or "").parse_args(argv)
    args.argv = list(argv)  # which flags were typed (run --config: typed flags beat the file)
    module = _load(args.command)
    if getattr(module, "LOGS", True):
        # structlog pulls in asyncio: seconds under emulation. Listing commands skip it.
        from ipvsproxy.logsetup import setup_logging

        setup_logging(args.verbosity, args.log_format)
    return _call(module, args)


def entry() -> None:
    """The process: main() with the command line, then exit with its code (the `ipvsproxy`
    command and `python -m ipvsproxy`)."""
    sys.exit(main())


def _call(module: ModuleType, args: Any) -> int:
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
