"""`ipvsproxy run`: not built yet; see the issue tracker."""

from __future__ import annotations

import argparse

from ipvsproxy.cli import CliError

DESCRIPTION = """Run the node proxy as a daemon (normally in a DaemonSet): list and watch Services,
EndpointSlices and this Node, and keep the kernel's IPVS table, the KUBE-* ipsets, the iptables
shim and the kube-ipvs0 addresses equal to what they should be."""


def add_arguments(parser: argparse.ArgumentParser) -> None:
    del parser


def run(args: argparse.Namespace) -> int:
    raise CliError("not implemented yet")
