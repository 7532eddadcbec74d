"""`ipvsproxy sync --once`: compute the desired dataplane from a file or an API server and
program the kernel once (or print the plan with --dry-run, or the desired state with -o json)."""

from __future__ import annotations

import argparse
import gc
import json
import sys

from ipvsproxy.cli import CliError
from ipvsproxy.settings.config import ConfigError, add_proxy_flags, from_args

DESCRIPTION = """Compute the desired dataplane once, from a manifest file or an API server, and
program the kernel: IPVS virtual and real servers, ipsets, iptables rules and kube-ipvs0 addresses.
With --dry-run, print the operations (ipvsadm, ipset, iptables, ip and sysctl commands) instead
of applying them; nothing is printed when there is nothing to do."""


def add_arguments(parser: argparse.ArgumentParser) -> None:
    src = parser.add_mutually_exclusive_group()
    src.add_argument("--from-file", metavar="PATH",
                     help="YAML/JSON manifest (many documents or kind: List) or a directory")
    src.add_argument("--kubeconfig", metavar="PATH",
                     help="list objects from this cluster (default: in-cluster or ~/.kube/config)")
    parser.add_argument("--once", action="store_true",
                        help="sync once and exit (the only mode of this command)")
    parser.add_argument("--dry-run", action="store_true",
                        help="print the planned operations, apply nothing")
    parser.add_argument("-o", "--output", choices=["json"],
                        help="print the desired state as JSON and apply nothing")
    add_proxy_flags(parser)


def _objects(args: argparse.Namespace, node: str) -> list[object]:
    if args.from_file:
        from ipvsproxy.inputs.manifests import ManifestError, load_objects

        try:
            return list(load_objects(args.from_file))
        except ManifestError as exc:
            raise CliError(str(exc)) from None
    from ipvsproxy.kube.listing import list_objects, load_client_config

    try:
        return list(list_objects(load_client_config(args.kubeconfig), node))
    except Exception as exc:  # the client raises many kinds; one line for the user
        raise CliError(f"cannot list objects from the API server: {exc}") from None


def run(args: argparse.Namespace) -> int:
    # One pass over the cluster that builds millions of objects and no cycles worth finding:
    # the cyclic collector would walk the growing heap again and again (json.loads of a
    # 10,000-service manifest alone takes 4.5x as long with it on). Refcounting frees the rest.
    gc.disable()
    import structlog

    log = structlog.get_logger("ipvsproxy.sync")
    try:
        cfg = from_args(args)
    except ConfigError as exc:
        raise CliError(str(exc)) from None
    docs = _objects(args, cfg.hostname)
    if args.output == "json":
        from ipvsproxy.core.desired_json import to_data
        from ipvsproxy.kernel.host import host_facts
        from ipvsproxy.syncer import desired_from

        des = desired_from(docs, cfg, host_facts())
        for p in des.problems:
            print(f"warning: {p}", file=sys.stderr)
        json.dump(to_data(des), sys.stdout, indent=1)
        print()
        return 0
    from ipvsproxy.syncer import sync

    try:
        out = sync(docs, cfg, dry_run=args.dry_run)
    except OSError as exc:
        raise CliError(f"cannot read the kernel's state: {exc}") from None
    for p in out.problems:
        print(f"warning: {p}", file=sys.stderr)
    if args.dry_run:
        lines = out.plan.lines()
        if lines:
            print("\n".join(lines))
        return 0
    for f in out.failures:
        print(f"error: {f}", file=sys.stderr)
    from ipvsproxy import names

    try:
        foreign = set(out.plan.foreign)  # someone else's virtual server: not ours to name
        names.write({k: v for k, v in out.desired.owners.items() if k not in foreign})
    except OSError as exc:  # names are for `ls --services`; the dataplane does not need them
        print(f"warning: cannot publish service names to {names.path()}: {exc}", file=sys.stderr)
    # counted as the daemon counts them (step_counts), not by rendering every operation as a
    # command line: that took 6% of a cold sync at 1,000 and 10,000 services (make profile-cold)
    from ipvsproxy.core.plan import step_counts

    log.info("sync", operations=sum(step_counts(out.plan.steps).values()),
             failed=len(out.failures),
             virtual_servers=len(out.desired.services), problems=len(out.problems),
             seconds=round(out.seconds, 3),
             **({} if out.first_seconds is None else
                {"first_services_seconds": round(out.first_seconds, 3)}))
    return 1 if out.failures else 0
