"""`ipvsproxy explain`: not built yet; see the issue tracker."""

from __future__ import annotations

import argparse

from ipvsproxy.cli import CliError

DESCRIPTION = """Read a live IPVS service from the kernel and say which real server a given client's
next connection will reach, and why (scheduler, flags, hash bucket, persistence template)."""


def add_arguments(parser: argparse.ArgumentParser) -> None:
    del parser


def run(args: argparse.Namespace) -> int:
    raise CliError("not implemented yet")
