"""`ipvsproxy explain`: which real server a client's next connection to a service reaches, and why.

Reads the service and its real servers from the kernel (IpvsClient.get_service, one netlink
request and one dump), the connection table for persistence templates (/proc/net/ip_vs_conn, as
`ipvsadm -Lnc` does) and the sysctl expire_quiescent_template, then asks the scheduler models
(the `scheduler` package) through ipvsproxy.core.explain.
"""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any

from ipvsproxy.cli import CliError

# One answer and exit: no structlog (its import costs seconds in the emulated lab).
LOGS = False

DESCRIPTION = """Read a live IPVS service from the kernel and say which real server a given client's
next connection will reach, and why (scheduler, flags, hash bucket or table entry, overheads
compared, the coming round-robin order, or the persistence template that wins).

  ipvsproxy explain -t 10.96.0.10:80 --client 10.244.1.7
  ipvsproxy explain -u 10.96.0.53:53 --client 10.244.1.7:40000 -o json
  ipvsproxy explain -f 7 --client 192.168.1.100
  ipvsproxy explain --service default/web:http --client 10.244.1.7

With sh-port or mh-port the client's source port is part of the hash: give IP:PORT.
"""

PARSER_OPTIONS: dict[str, Any] = {"allow_abbrev": False}

CONN_PROC_FILE = "/proc/net/ip_vs_conn"
EXPIRE_QUIESCENT = "/proc/sys/net/ipv4/vs/expire_quiescent_template"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    svc = parser.add_argument_group("the virtual service (one of)")
    svc.add_argument("-t", "--tcp-service", metavar="HOST[:PORT]", help="a TCP virtual service")
    svc.add_argument("-u", "--udp-service", metavar="HOST[:PORT]", help="a UDP virtual service")
    svc.add_argument("--sctp-service", metavar="HOST[:PORT]", help="an SCTP virtual service")
    svc.add_argument("-f", "--fwmark-service", metavar="FWMARK",
                     help="a firewall-mark virtual service")
    svc.add_argument("-6", "--ipv6", action="store_true", help="the fwmark service is IPv6")
    svc.add_argument("--service", metavar="NAMESPACE/NAME[:PORT]",
                     help="a Kubernetes service port (its name or number), as the last sync "
                          "published it: its ClusterIP virtual server of the client's family")
    parser.add_argument("--client", required=True, metavar="IP[:PORT]",
                        help="the client's address (and source port: [IPv6]:PORT for IPv6)")
    parser.add_argument("-o", "--output", choices=["text", "json"], default="text",
                        help="text (default) or one JSON object")


def _service_key(args: argparse.Namespace) -> Any:
    from ipvsproxy.commands.ls import IpvsadmExit, parse_fwmark, parse_service
    from ipvsproxy.core.ipvs import AF_INET, AF_INET6, Protocol, ServiceKey

    given = [(name, value) for name, value in (
        ("t", args.tcp_service), ("u", args.udp_service), ("sctp", args.sctp_service),
        ("f", args.fwmark_service)) if value is not None]
    if len(given) != 1:
        raise CliError("give exactly one of -t, -u, --sctp-service, -f or --service")
    name, value = given[0]
    if args.ipv6 and name != "f":
        raise CliError("-6 goes with -f")
    if name == "f":
        try:
            mark = parse_fwmark(value)
        except IpvsadmExit as exc:
            raise CliError(exc.message) from None
        return ServiceKey.mark(mark, AF_INET6 if args.ipv6 else AF_INET)
    proto = {"t": Protocol.TCP, "u": Protocol.UDP, "sctp": Protocol.SCTP}[name]
    key = parse_service(value, proto)
    if key is None:
        raise CliError("illegal virtual server address[:port] specified")
    return key


def _read(path: str) -> str | None:
    try:
        with open(path, encoding="latin-1") as f:
            return f.read()
    except OSError:
        return None


def _named_service(service: str, af: int, published: dict[Any, str]) -> Any:
    """The virtual server of a Kubernetes service port: the first one published (the sync
    writes a port's ClusterIP first) of the client's family."""
    from ipvsproxy import names

    if "/" not in service.partition(":")[0]:
        raise CliError(f"--service {service}: give namespace/name or namespace/name:port")
    keys = names.lookup(published, service, af)
    if not keys:
        where = names.path()
        raise CliError(f"no virtual server of {service} (IPv{6 if af == 10 else 4}) is published "
                       f"in {where}: is the name right, and has ipvsproxy synced on this node?")
    ports = sorted({published[k] for k in keys})
    if len(ports) > 1:
        raise CliError(f"{service} has several ports, name one: {', '.join(ports)}")
    return keys[0]


def run(args: argparse.Namespace) -> int:
    from ipvsproxy import names
    from ipvsproxy.core.explain import explain, parse_client
    from ipvsproxy.kernel.ipvs import IpvsClient, IpvsUnavailable

    try:
        client = parse_client(args.client)
    except ValueError as exc:
        raise CliError(str(exc)) from None
    published = names.read()
    if args.service is not None:
        if any(v is not None for v in (args.tcp_service, args.udp_service, args.sctp_service,
                                       args.fwmark_service)) or args.ipv6:
            raise CliError("give exactly one of -t, -u, --sctp-service, -f or --service")
        key = _named_service(args.service, 10 if client.addr.version == 6 else 2, published)
    else:
        key = _service_key(args)
    if client.addr.version != (6 if key.af == 10 else 4):
        raise CliError(f"client {client.addr} and service {key} are of different families")
    try:
        with IpvsClient() as ipvs:
            observed = ipvs.get_service(key)
    except (OSError, IpvsUnavailable) as exc:
        raise CliError(f"cannot read IPVS: {exc}") from None
    if observed is None:
        raise CliError(f"no such service: {key}")
    quiescent = (_read(EXPIRE_QUIESCENT) or "0").strip() not in ("", "0")
    answer = explain(observed, client, _read(CONN_PROC_FILE), quiescent)
    owner = published.get(key)  # the Kubernetes service port, when a sync published it
    if args.output == "json":
        data = answer.to_json()
        data["kubernetes_service"] = owner
        sys.stdout.write(json.dumps(data) + "\n")
    else:
        text = answer.to_text()
        if owner:
            first, nl, rest = text.partition("\n")
            text = f"{first}  ({owner}){nl}{rest}"
        sys.stdout.write(text)
    sys.stdout.flush()
    return 0
