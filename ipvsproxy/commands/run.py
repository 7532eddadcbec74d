"""`ipvsproxy run`: the node proxy daemon. Wires the watches, the store, the reconciler loop and
the health, metrics and health-check-node-port servers together; the work is in ipvsproxy/daemon
and ipvsproxy/kube. SIGTERM and SIGINT stop it with exit 0 and leave the kernel as it is:
traffic keeps flowing while the daemon restarts, and the next one adopts what it finds."""

from __future__ import annotations

import argparse
import signal
import sys
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

from ipvsproxy.cli import CliError
from ipvsproxy.settings.config import (
    Config,
    ConfigError,
    add_daemon_flags,
    add_proxy_flags,
    from_args,
)

DESCRIPTION = """Run the node proxy as a daemon (normally in a DaemonSet): list and watch Services,
EndpointSlices and this Node, and keep the kernel's IPVS table, the KUBE-* ipsets, the iptables
shim and the kube-ipvs0 addresses equal to what they should be. Flags are kube-proxy's; --config
takes a KubeProxyConfiguration file (flags given on the command line win over it)."""


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--kubeconfig", metavar="PATH",
                        help="API server credentials (default: in-cluster, else ~/.kube/config)")
    parser.add_argument("--config", metavar="FILE",
                        help="a KubeProxyConfiguration (kubeproxy.config.k8s.io/v1alpha1) file")
    add_proxy_flags(parser)
    add_daemon_flags(parser)
    parser.add_argument("--sysctls-only", action="store_true",
                        help="write the sysctls this configuration needs (net.ipv4.vs.*, "
                             "net.ipv4.ip_forward, arp_* with strictARP) and exit: the "
                             "DaemonSet's privileged init container, so that the proxy's own "
                             "container needs no privilege, only NET_ADMIN and NET_RAW")


def write_sysctls(cfg: Config) -> int:
    """`run --sysctls-only`: the sysctls the daemon would write at its first sync (the same
    function computes them), written where they differ; 1 if one could not be written."""
    import structlog

    from ipvsproxy.core.desired import sysctls
    from ipvsproxy.kernel.host import host_facts, read_sysctls, write_sysctl
    from ipvsproxy.kernel.ipvs import IpvsClient

    log = structlog.get_logger("ipvsproxy.sysctls")
    # net/ipv4/vs/* exist once ip_vs is loaded; the kernel loads it for the first IPVS request.
    with IpvsClient() as client:
        client.info()
    want = sysctls(cfg, host_facts())
    have = read_sysctls(k for k, _ in want)
    written = failed = 0
    for key, value in want:
        name = key.replace("/", ".")
        if have.get(key) == value:
            continue
        try:
            write_sysctl(key, value)
        except OSError as exc:
            failed += 1
            log.error("sysctl not written", sysctl=name, value=value, error=str(exc))
            continue
        written += 1
        log.info("sysctl written", sysctl=name, value=value, was=have.get(key))
    log.info("sysctls set", needed=len(want), written=written, failed=failed)
    return 1 if failed else 0


def _config(args: argparse.Namespace) -> Config:
    if args.config:
        from ipvsproxy.settings.kpconfig import defaults_from_file

        values, warnings = defaults_from_file(args.config)
        for w in warnings:
            print(f"ipvsproxy run: warning: {w}", file=sys.stderr)
        # Flags typed on the command line win over the file; the file wins over defaults.
        # (kube-proxy ignores most flags when --config is given; typed ones are meant.)
        typed = _typed(getattr(args, "argv", []))
        for dest, value in values.items():
            if dest not in typed:
                setattr(args, dest, value)
    return from_args(args)


def _typed(argv: list[str]) -> set[str]:
    """The dests of `run`'s flags present in argv."""
    parser = argparse.ArgumentParser(add_help=False)
    add_arguments(parser)
    for action in parser._actions:
        action.default = argparse.SUPPRESS
    known, _ = parser.parse_known_args(argv)
    return set(vars(known))


def preflight() -> None:
    """Refuse to start, with the reason, when the node cannot be programmed at all: better no
    proxy (and a crash-looping pod someone will look at) than a half-programmed node."""
    from ipvsproxy.kernel import iptables
    from ipvsproxy.kernel.ipset import IPSets
    from ipvsproxy.kernel.ipvs import IpvsClient

    def ipvs() -> None:
        with IpvsClient() as client:
            client.info()

    def ipset() -> None:
        with IPSets() as sets:
            sets.read_all()

    checks = [("IPVS (is the ip_vs module loaded?)", ipvs), ("ipset", ipset),
              ("iptables", lambda: iptables.save(4))]
    for what, check in checks:
        try:
            check()
        except Exception as exc:
            raise CliError(f"{what} is not usable: {exc}") from None


def _service_stats(rec: Any) -> Iterator[tuple[str, str, str, int, int, int, int, int]]:
    """Per service port: connections, packets and bytes of its virtual servers, read now."""
    from ipvsproxy.kernel.ipvs import IpvsClient

    applied = rec.applied
    if applied is None:
        return
    sums: dict[str, list[int]] = {}
    with IpvsClient() as ipvs:
        for vs, st in ipvs.services(stats=True):
            owner = applied.owners.get(vs.key)
            if owner is None:
                continue
            acc = sums.setdefault(owner, [0, 0, 0, 0, 0])
            for i, v in enumerate((st.conns, st.inpkts, st.outpkts, st.inbytes, st.outbytes)):
                acc[i] += v
    for owner, (c, pi, po, bi, bo) in sorted(sums.items()):
        ns, _, rest = owner.partition("/")
        name, _, port = rest.partition(":")
        yield ns, name, port, c, pi, po, bi, bo


def run(args: argparse.Namespace) -> int:
    try:
        cfg = _config(args)
    except ConfigError as exc:
        raise CliError(str(exc)) from None
    if args.sysctls_only:
        return write_sysctls(cfg)
    from ipvsproxy.daemon import fds

    fds.raise_soft_limit()  # before anything sizes itself from it (the HTTP servers' shares)
    preflight()

    import structlog

    from ipvsproxy.daemon.health import Health
    from ipvsproxy.daemon.metrics import Metrics
    from ipvsproxy.daemon.reconciler import FAMILY_LABEL, Reconciler
    from ipvsproxy.daemon.store import Store
    from ipvsproxy.kube.listing import load_client_config
    from ipvsproxy.kube.reflector import start_reflectors

    log = structlog.get_logger("ipvsproxy.run")
    metrics = Metrics()
    health = Health(cfg.families, cfg.sync_period)

    def queued() -> None:
        now = time.time()
        for fam in cfg.families:
            health.queued_update(fam)
            metrics.last_queued.labels(ip_family=FAMILY_LABEL[fam]).set(now)

    store = Store(cfg.hostname, on_queued=queued, on_node=health.set_node)
    stop = threading.Event()

    def on_signal(signum: int, _frame: Any) -> None:
        log.info("stopping", signal=signal.Signals(signum).name)
        stop.set()
        store.notify()

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    servers = _start_servers(cfg, metrics, health)
    rec = Reconciler(cfg, store, metrics, health)
    from ipvsproxy import names

    rec.names = names.Publisher()
    if cfg.service_metrics:
        metrics.set_service_stats_source(lambda: _service_stats(rec))
    try:
        api = load_client_config(args.kubeconfig)
    except Exception as exc:
        raise CliError(f"cannot load API server credentials: {exc}") from None
    start_reflectors(api, cfg.hostname, store, stop)
    log.info("started", node=cfg.hostname, families=list(cfg.families),
             sync_period=cfg.sync_period, min_sync_period=cfg.min_sync_period)
    hc = _hcnp(health)
    try:
        rec.after_sync = (lambda: hc.sync(store.health_check_ports())) if hc else None
        rec.run(stop)
    finally:
        for s in servers:
            s.stop()
        if hc is not None:
            hc.close()
    log.info("stopped; the kernel state is left in place")
    return 0


def _hcnp(health: Any) -> Any:
    from ipvsproxy.daemon.hcnp import HealthCheckPorts

    return HealthCheckPorts(health, None)


# How long a port the daemon listens on may be held by another process before it gives up:
# kube-proxy's, while its pod ends in a DaemonSet swap (both listen on 10256 and 10249). Waiting
# for it is also what keeps the two proxies from syncing one node at once: nothing is synced
# before these ports are ours.
PORT_WAIT = 120.0


def _start_servers(cfg: Config, metrics: Any, health: Any,
                   wait: float = PORT_WAIT) -> list[Any]:
    import errno

    import structlog

    from ipvsproxy.daemon import http

    log = structlog.get_logger("ipvsproxy.run")
    out: list[Any] = []
    starts: list[Callable[[], Any]] = []
    if cfg.healthz_bind_address:
        starts.append(lambda: http.start_healthz(cfg.healthz_bind_address, health, metrics))
    if cfg.metrics_bind_address:
        starts.append(lambda: http.start_metrics(cfg.metrics_bind_address, metrics))
    deadline = time.monotonic() + wait
    for start in starts:
        said = False
        while True:
            try:
                out.append(start())
                break
            except OSError as exc:
                if exc.errno != errno.EADDRINUSE or time.monotonic() > deadline:
                    for s in out:
                        s.stop()
                    raise CliError(str(exc)) from None
                if not said:
                    log.warning("port in use, waiting (is kube-proxy still running?)",
                                error=str(exc), seconds=wait)
                    said = True
                time.sleep(1.0)
    return out
