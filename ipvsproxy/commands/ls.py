"""`ipvsproxy ls`: list IPVS the way ipvsadm 1.31 does, byte for byte.

Options are ipvsadm's own listing options (-L/-l/--list, -S/--save, -n, -c, --timeout, --stats,
--rate, --thresholds, --persistent-conn, --exact, --nosort, --tun-info, -t/-u/--sctp-service/
-f [-6]); errors and exit codes follow ipvsadm.c parse_options / generic_opt_check. The text
comes from ipvsproxy.core.ipvsadm_format and ipvsadm_conn; this module does the I/O.
"""

from __future__ import annotations

import _socket as socket  # the C module (see core/ipvs.py AF_INET)
import argparse
import contextlib
import errno
import os
import sys
from collections.abc import Iterator, Sequence
from ipaddress import IPv4Address, IPv6Address
from typing import TYPE_CHECKING, Any

from ipvsproxy.core.gcpause import paused
from ipvsproxy.core.ipvs import (
    AF_INET,
    AF_INET6,
    IpvsInfo,
    Protocol,
    ServiceKey,
    VirtualServer,
)
from ipvsproxy.core.ipvsadm_format import (
    FMT_EXACT,
    FMT_NOSORT,
    FMT_NUMERIC,
    FMT_PERSISTENTCONN,
    FMT_RATE,
    FMT_RULE,
    FMT_STATS,
    FMT_THRESHOLDS,
    FMT_TUN_INFO,
    is_plain,
    list_all,
    list_plain,
    list_service,
    list_timeout,
    plain_block,
)

if TYPE_CHECKING:
    from ipvsproxy.kernel.ipvs import IpvsClient
    from ipvsproxy.kernel.ipvs_dump import Frame

# A listing prints and exits: it skips structlog (whose import costs seconds in emulation).
LOGS = False

DESCRIPTION = """List the kernel's IPVS virtual and real servers. The output is byte for byte what
ipvsadm 1.31 prints for the same options (-L -n, --stats, --rate, -S, -c, --timeout ...).

  ipvsproxy ls -Ln                      ipvsadm -Ln
  ipvsproxy ls -Ln --stats --exact      ipvsadm -Ln --stats --exact
  ipvsproxy ls -Ln -t 10.96.0.1:443     one service
  ipvsproxy ls -S -n                    rules that ipvsadm -R reads back
  ipvsproxy ls -Lnc                     connections
"""

PARSER_OPTIONS: dict[str, Any] = {"allow_abbrev": False}

CMD_LIST, CMD_SAVE = "list", "save"

# ipvsadm.c optnames[] index of each listing option (OPTC_*), for its error messages.
OPTNAMES = {0: "numeric", 1: "connection", 2: "service-address", 12: "timeout", 13: "daemon",
            14: "stats", 15: "rate", 16: "thresholds", 17: "persistent-conn", 18: "nosort",
            20: "exact", 28: "tun-info"}
OPT_FMT = {0: FMT_NUMERIC, 14: FMT_STATS, 15: FMT_RATE, 16: FMT_THRESHOLDS,
           17: FMT_PERSISTENTCONN, 18: FMT_NOSORT, 20: FMT_EXACT, 28: FMT_TUN_INFO}
# commands_v_options rows for list and save: ' ' optional, '1' exclusive, anything else 'x'.
LIST_ROW = {0: " ", 1: "1", 2: "1", 12: "1", 13: "1", 14: " ", 15: " ", 16: " ", 17: " ",
            18: " ", 20: " ", 28: " "}
SAVE_ROW = {0: " "}


class IpvsadmExit(Exception):
    """ipvsadm's fail(): a message on stderr (with a newline) and an exit code."""

    def __init__(self, code: int, message: str) -> None:
        super().__init__(message)
        self.code = code
        self.message = message


class Request:
    """What parse_options collects: one command, the option set, the format, the service.
    (A plain class: the dataclasses module costs `ls` its import of inspect, ast and re.)"""

    def __init__(self) -> None:
        self.cmd: str | None = None
        self.options: set[int] = set()
        self.fmt = 0
        self.key: ServiceKey | None = None
        self.fwmark = 0
        self.af = AF_INET


class _Record(argparse.Action):
    """Keeps every option in command-line order, as popt hands them to ipvsadm."""

    def __call__(self, parser: argparse.ArgumentParser, namespace: argparse.Namespace,
                 values: str | Sequence[Any] | None, option_string: str | None = None) -> None:
        seen = list(getattr(namespace, "ipvsadm_opts", None) or [])
        seen.append((self.const, values, option_string))
        namespace.ipvsadm_opts = seen


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.set_defaults(ipvsadm_opts=[])
    flag: dict[str, Any] = {"action": _Record, "nargs": 0}
    g = parser.add_argument_group("ipvsadm commands (list is the default)")
    g.add_argument("-L", "--list", const="L", help="list the table (-l too)", **flag)
    g.add_argument("-l", const="L", help=argparse.SUPPRESS, **flag)
    g.add_argument("-S", "--save", const="S", help="print rules in the form ipvsadm -R reads",
                   **flag)
    o = parser.add_argument_group("ipvsadm options")
    o.add_argument("-n", "--numeric", const=0, help="numeric addresses and ports", **flag)
    o.add_argument("-c", "--connection", const=1, help="list connections", **flag)
    for opts, code, what in ((("-t", "--tcp-service"), "t", "TCP"),
                             (("-u", "--udp-service"), "u", "UDP"),
                             (("--sctp-service",), "sctp", "SCTP")):
        o.add_argument(*opts, const=code, action=_Record, metavar="HOST[:PORT]",
                       help=f"list only this {what} virtual service")
    o.add_argument("-f", "--fwmark-service", const="f", action=_Record, metavar="FWMARK",
                   help="list only this firewall-mark virtual service")
    o.add_argument("-6", "--ipv6", const="6", help="the fwmark service is IPv6", **flag)
    o.add_argument("--timeout", const=12, help="show tcp tcpfin udp timeouts", **flag)
    o.add_argument("--stats", const=14, help="counters", **flag)
    o.add_argument("--rate", const=15, help="rates", **flag)
    o.add_argument("--thresholds", const=16, help="upper and lower thresholds", **flag)
    o.add_argument("--persistent-conn", const=17, help="persistent connection counts", **flag)
    o.add_argument("--nosort", const=18, help="kernel order, not sorted", **flag)
    o.add_argument("--sort", const="sort", help="does nothing (sorting is the default)", **flag)
    o.add_argument("-X", "--exact", const=20, help="exact numbers, no K/M/G/T", **flag)
    o.add_argument("--tun-info", const=28, help="tunnel information column", **flag)
    parser.add_argument("--services", action="store_true",
                        help="beyond ipvsadm: append the owning Kubernetes namespace/name:port "
                             "to each virtual-server line")


# ---------------------------------------------------------------------------------------------
# Parsing, as ipvsadm.c parse_options does it


def _string_to_number(s: str, lo: int, hi: int) -> int:
    """ipvsadm.c string_to_number: strtol base 10, whole string, in [lo, hi]; else -1."""
    t = s.lstrip(" \t\n\v\f\r")
    body = t[1:] if t[:1] in "+-" else t
    if not body.isascii() or not body.isdigit():
        return -1
    n = int(t)
    return n if lo <= n <= hi else -1


def parse_fwmark(buf: str) -> int:
    """ipvsadm.c parse_fwmark."""
    t = buf.lstrip(" \t\n\v\f\r")
    body = t[1:] if t[:1] in "+-" else t
    if not body.isascii() or not body.isdigit() or not 0 < int(t) <= 0xFFFFFFFF:
        raise IpvsadmExit(2, f"invalid fwmark value `{buf}' specified")
    return int(t)


def _host_to_addr(name: str) -> IPv4Address | None:
    """ipvsadm.c host_to_addr: gethostbyname, IPv4 only."""
    try:
        return IPv4Address(socket.gethostbyname(name))
    except (OSError, UnicodeError, ValueError):
        return None


def _service_to_port(name: str, proto: Protocol) -> int:
    pname = {Protocol.TCP: "tcp", Protocol.UDP: "udp", Protocol.SCTP: "sctp"}.get(proto)
    if pname is None:
        return -1
    try:
        return socket.getservbyname(name, pname)
    except (OSError, UnicodeError):
        return -1


def parse_service(buf: str, proto: Protocol) -> ServiceKey | None:
    """ipvsadm.c parse_service: host[:port] or [v6]:port; None where it returns SERVICE_NONE."""
    if (buf.isascii() and buf.isdigit()) or buf == "":
        return None
    portp: str | None = None
    if buf.startswith("["):
        inner, sep, rest = buf[1:].partition("]")
        if not sep or not rest.startswith(":"):
            return None
        buf, portp = inner, rest[1:]
    addr: IPv4Address | IPv6Address | None
    try:
        addr = IPv6Address(socket.inet_pton(AF_INET6, buf))
    except (OSError, ValueError):
        # Not IPv6: the port is after the last ':' (and a bracketed v4 loses its port).
        portp = None
        if ":" in buf:
            buf, portp = buf.rsplit(":", 1)
        try:
            addr = IPv4Address(socket.inet_aton(buf))
        except (OSError, ValueError):
            addr = _host_to_addr(buf)
        if addr is None:
            return None
    port = 0
    if portp is not None:
        port = _string_to_number(portp, 0, 65535)
        if port == -1:
            port = _service_to_port(portp, proto)
        if port == -1:
            return None
    return ServiceKey.inet(proto, addr, port)


def parse_request(opts: Sequence[tuple[Any, Any, str | None]]) -> Request:
    """ipvsadm.c parse_options + generic_opt_check for the list and save commands."""
    req = Request()

    def set_option(code: int) -> None:
        if code in req.options:
            raise IpvsadmExit(2, f"multiple '{OPTNAMES[code]}' options specified")
        req.options.add(code)
        req.fmt |= OPT_FMT.get(code, 0)

    for code, value, option_string in opts:
        if code in ("L", "S"):
            if req.cmd is not None:  # only the first option may be a command
                raise IpvsadmExit(2, f"invalid option `{option_string}'")
            req.cmd = CMD_LIST if code == "L" else CMD_SAVE
        elif code in ("t", "u", "sctp"):
            set_option(2)
            proto = {"t": Protocol.TCP, "u": Protocol.UDP, "sctp": Protocol.SCTP}[code]
            key = parse_service(str(value), proto)
            if key is None:
                raise IpvsadmExit(2, "illegal virtual server address[:port] specified")
            req.key, req.fwmark, req.af = key, 0, key.af
        elif code == "f":
            set_option(2)
            req.af = AF_INET
            req.fwmark = parse_fwmark(str(value))
            req.key = ServiceKey.mark(req.fwmark, req.af)
        elif code == "6":
            if not req.fwmark:
                raise IpvsadmExit(2, "-6 used before -f\n")
            req.af = AF_INET6
            req.key = ServiceKey.mark(req.fwmark, AF_INET6)
        elif code != "sort":
            set_option(int(code))
    if req.cmd is None:
        req.cmd = CMD_LIST
    row, cmdname = (LIST_ROW, "list") if req.cmd == CMD_LIST else (SAVE_ROW, "save")
    last = -1
    for j in sorted(req.options):
        kind = row.get(j, "x")
        if kind == "x":
            raise IpvsadmExit(2, f"Illegal '{OPTNAMES[j]}' option with the '{cmdname}' command")
        if kind == "1":
            if last == -1:
                last = j
                continue
            raise IpvsadmExit(2, f"The option '{OPTNAMES[j]}' conflicts with the "
                                 f"'{OPTNAMES[last]}' option in the '{cmdname}' command")
    if req.cmd == CMD_LIST and (
            (req.options & {1, 12, 13} and req.options & {14, 15, 16})
            or (req.options & {12, 13} and 17 in req.options)):
        raise IpvsadmExit(2, "options conflicts in the list command")
    if req.cmd == CMD_SAVE:
        req.fmt |= FMT_RULE
    return req


# ---------------------------------------------------------------------------------------------
# Name lookups (the Resolver of ipvsadm_format) and the listing itself


class SystemResolver:
    """gethostbyaddr / getservbyport through the C library, as ipvsadm calls them; cached."""

    def __init__(self) -> None:
        self._hosts: dict[IPv4Address | IPv6Address, str | None] = {}
        self._services: dict[tuple[int, str], str | None] = {}

    def host(self, addr: IPv4Address | IPv6Address) -> str | None:
        if addr not in self._hosts:
            try:
                self._hosts[addr] = socket.gethostbyaddr(str(addr))[0]
            except (OSError, UnicodeError):
                self._hosts[addr] = None
        return self._hosts[addr]

    def service(self, port: int, proto: str) -> str | None:
        if (port, proto) not in self._services:
            try:
                self._services[(port, proto)] = socket.getservbyport(port, proto)
            except (OSError, OverflowError):
                self._services[(port, proto)] = None
        return self._services[(port, proto)]


def render(req: Request, names: dict[ServiceKey, str] | None = None) -> str:
    """Ask the kernel and render; raises IpvsadmExit where ipvsadm exits non-zero."""
    resolver = SystemResolver()
    if 1 in req.options:
        from ipvsproxy.core.ipvsadm_conn import CONN_PROC_FILE, list_conn

        try:
            with open(CONN_PROC_FILE, encoding="latin-1", newline="") as f:
                text = f.read()
        except OSError:
            raise IpvsadmExit(1, f"cannot open file {CONN_PROC_FILE}") from None
        listing = list_conn(text, req.fmt, resolver)
        if listing.rc:
            sys.stdout.write(listing.out)
            raise IpvsadmExit(listing.rc, listing.err.rstrip("\n"))
        return listing.out
    from ipvsproxy.kernel.ipvs import IpvsClient, IpvsUnavailable

    try:
        client = IpvsClient()
    except (OSError, IpvsUnavailable) as exc:
        code = getattr(exc, "errno", None) or errno.ENOPROTOOPT
        raise IpvsadmExit(2, "Can't initialize ipvs: "
                             f"{os.strerror(code)}\n"
                             "Are you sure that IP Virtual Server is built in the kernel "
                             "or as module?") from None
    with client as c:
        if 12 in req.options:
            return list_timeout(c.timeouts())
        if req.key is not None:
            svc = c.get_service(req.key)
            if svc is None:
                raise IpvsadmExit(1, "No such service")
            return list_service(svc, req.fmt, resolver, names)
        info = c.info()
        if is_plain(req.fmt):  # the plain -Ln listing: no objects built per real server
            return _plain_listing(c, info, req.fmt, resolver, names)
        services = c.dump(stats=bool(req.fmt & (FMT_STATS | FMT_RATE)))
        return list_all(info, services, req.fmt, resolver, names)


def _plain_listing(client: IpvsClient, info: IpvsInfo, fmt: int, resolver: SystemResolver,
                   names: dict[ServiceKey, str] | None) -> str:
    """The plain -Ln listing, in two processes where that pays (ipvs_dump.may_fork): the
    virtual servers are listed here, then a forked child reads and formats the real servers of
    the second half while this process does the first half, each on its own CPU (the kernel's
    work for them included), and the blocks are put in ipvsadm's order here."""
    from ipvsproxy.kernel import ipvs_dump

    services = [vs for vs, _ in client.services(False)]
    half = len(services) // 2 if ipvs_dump.may_fork(len(services)) else len(services)

    def blocks(part: list[VirtualServer]) -> Iterator[str]:
        for vs, dests in client.listing_rows(part, fork=False):
            yield plain_block(vs, dests, fmt, resolver, names)

    def theirs() -> Iterator[list[Frame]]:
        frames: list[Frame] = []
        size = 0
        for i, block in enumerate(blocks(services[half:]), start=half):
            frames.append((i, 0, block.encode()))
            size += len(frames[-1][2])
            if size >= ipvs_dump.FORK_COLLECT:
                yield frames
                frames, size = [], 0
        yield frames

    out = [""] * len(services)
    with contextlib.ExitStack() as stack:
        child = stack.enter_context(ipvs_dump.Child(theirs)) if half < len(services) else ()
        out[:half] = blocks(services[:half])
        for i, _, data in child:
            out[i] = data.decode()
    return list_plain(info, services, out, fmt)


def run(args: argparse.Namespace) -> int:
    # A listing allocates a few objects per real server and frees them all at exit: the cyclic
    # garbage collector would only walk them over and over.
    with paused():
        return _run(args)


def _run(args: argparse.Namespace) -> int:
    try:
        req = parse_request(args.ipvsadm_opts)
        if args.services and (req.cmd == CMD_SAVE or req.options & {1, 12}):
            raise IpvsadmExit(2, "--services goes with service listings, not -S, -c or --timeout")
        if args.services:  # only then: the plain listing stays as lean as ipvsadm
            from ipvsproxy import names

            out = render(req, names.read())
        else:
            out = render(req)
    except IpvsadmExit as exc:
        sys.stdout.flush()
        sys.stderr.write(exc.message + "\n")
        return exc.code
    sys.stdout.write(out)
    sys.stdout.flush()
    return 0
