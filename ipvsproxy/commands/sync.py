"""`ipvsproxy sync`: not built yet; see the issue tracker."""

from __future__ import annotations

import argparse

from ipvsproxy.cli import CliError

DESCRIPTION = """Compute the desired dataplane once, from a manifest file or an API server, and
program the kernel: IPVS virtual and real servers, ipsets, iptables rules and kube-ipvs0 addresses.
With --dry-run, print the operations instead of applying them."""


def add_arguments(parser: argparse.ArgumentParser) -> None:
    del parser


def run(args: argparse.Namespace) -> int:
    raise CliError("not implemented yet")
