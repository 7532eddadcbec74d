"""`ipvsproxy ls`: not built yet; see the issue tracker."""

from __future__ import annotations

import argparse

from ipvsproxy.cli import CliError

DESCRIPTION = """List the kernel's IPVS virtual and real servers. The output is byte for byte what
ipvsadm 1.31 prints for the same options (-L -n, --stats, --rate, -S, -c, --timeout ...).
"""


def add_arguments(parser: argparse.ArgumentParser) -> None:
    del parser


def run(args: argparse.Namespace) -> int:
    raise CliError("not implemented yet")
