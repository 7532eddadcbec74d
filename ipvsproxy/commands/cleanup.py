"""`ipvsproxy cleanup`: remove everything ipvsproxy owns from the kernel, and nothing else."""

from __future__ import annotations

import argparse
import sys

DESCRIPTION = """Remove everything ipvsproxy owns: its IPVS virtual servers (only those it
created), the jumps to its iptables chains and the chains, the addresses it bound to kube-ipvs0 and
the link, and its ipsets (IPv4 and IPv6). Foreign virtual servers, chains, sets and addresses are
left alone. With --dry-run, print the commands instead."""


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--dry-run", action="store_true",
                        help="print what would be removed, remove nothing")
    parser.add_argument("--records-only", action="store_true",
                        help="after kube-proxy has taken the node back (IPVS mode): remove only "
                             "ipvsproxy's own records (its IPVSPROXY-* sets, the names file), "
                             "not the virtual servers, rules and addresses kube-proxy now serves "
                             "from (README, 'Moving from kube-proxy')")


def run(args: argparse.Namespace) -> int:
    from ipvsproxy.kernel.cleanup import plan_cleanup, plan_records_cleanup

    actions, notes = plan_records_cleanup() if args.records_only else plan_cleanup()
    for n in notes:
        print(f"note: {n}", file=sys.stderr)
    failed = 0
    for a in actions:
        if args.dry_run:
            print("\n".join(a.lines))
            continue
        try:
            a.run()
        except Exception as exc:  # one failure does not stop the rest of the cleanup
            failed += 1
            print(f"error: {a.lines[0]}: {exc}", file=sys.stderr)
    return 1 if failed else 0
