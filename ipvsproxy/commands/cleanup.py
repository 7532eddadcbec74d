"""`ipvsproxy cleanup`: not built yet; see the issue tracker."""

from __future__ import annotations

import argparse

from ipvsproxy.cli import CliError

DESCRIPTION = """Remove every kernel object ipvsproxy owns: its IPVS virtual servers, the kube-ipvs0
link, its ipsets (both families) and its iptables chains and the jumps to them. Objects made by
anyone else are left alone."""


def add_arguments(parser: argparse.ArgumentParser) -> None:
    del parser


def run(args: argparse.Namespace) -> int:
    raise CliError("not implemented yet")
