"""IPVS kernel objects as frozen values: virtual servers, real servers, stats, info, timeouts.

These are the words every other part speaks: the desired state produces them, the kernel layer
observes and applies them, the ipvsadm renderer prints them. Constants follow
include/uapi/linux/ip_vs.h.

Every value here is a NamedTuple, not a dataclass: a tuple type is built in C (a frozen
dataclass sets each field through object.__setattr__, about 8x slower), hashes in C (ServiceKey
is the key of every diff), and importing dataclasses pulls in inspect, ast and re, which costs
`ipvsproxy ls` a fifth of a second under emulation. They are immutable all the same; change a
field with `_replace` (not dataclasses.replace). Unlike dataclasses they compare equal to a
plain tuple of the same values, and order as tuples do (ServiceKey: af, protocol, addr, port,
fwmark, which is what the dataclass's order=True compared too).
"""

from __future__ import annotations

# AF_INET, AF_INET6: plain ints (2, 10), which compare and print the same everywhere. From
# _socket, the C module, as everywhere on the `ls` path: the Python `socket` module converts all
# of its constants to enums on import, ~0.15 s of each `ipvsproxy ls` under emulation.
from _socket import AF_INET as AF_INET
from _socket import AF_INET6 as AF_INET6
from collections.abc import Sequence
from enum import IntEnum
from ipaddress import IPv4Address, IPv6Address
from itertools import repeat
from operator import itemgetter
from typing import NamedTuple

IPAddress = IPv4Address | IPv6Address

# Service flags (ip_vs.h IP_VS_SVC_F_*).
SVC_F_PERSISTENT = 0x0001
SVC_F_HASHED = 0x0002  # set by the kernel on every service; never part of desired state
SVC_F_ONEPACKET = 0x0004
SVC_F_SCHED1 = 0x0008  # sh-fallback / mh-fallback
SVC_F_SCHED2 = 0x0010  # sh-port / mh-port
SVC_F_SCHED3 = 0x0020

# Destination connection flags: the forwarding method is the low 3 bits (IP_VS_CONN_F_FWD_MASK).
CONN_F_FWD_MASK = 0x0007


class Protocol(IntEnum):
    NONE = 0  # fwmark services have no protocol
    TCP = 6
    UDP = 17
    SCTP = 132


class Fwd(IntEnum):
    MASQ = 0
    LOCALNODE = 1
    TUNNEL = 2
    ROUTE = 3  # direct routing ("gatewaying" in ipvsadm)
    BYPASS = 4


# The forwarding method of a dumped real server, by the low 3 bits of its conn_flags: the kernel
# only sets 0-4 (ip_vs.h IP_VS_CONN_F_*); anything else reads as masquerading.
FWD_BY_CODE = (Fwd.MASQ, Fwd.LOCALNODE, Fwd.TUNNEL, Fwd.ROUTE, Fwd.BYPASS, Fwd.MASQ, Fwd.MASQ,
               Fwd.MASQ)


class ServiceKey(NamedTuple):
    """What identifies a virtual server: (af, protocol, addr, port) or (af, fwmark)."""

    af: int
    protocol: Protocol
    addr: IPAddress | None
    port: int
    fwmark: int = 0

    @staticmethod
    def inet(protocol: Protocol, addr: IPAddress, port: int) -> ServiceKey:
        return ServiceKey(AF_INET6 if addr.version == 6 else AF_INET, protocol, addr, port)

    @staticmethod
    def mark(fwmark: int, af: int = AF_INET) -> ServiceKey:
        return ServiceKey(af, Protocol.NONE, None, 0, fwmark)

    def __str__(self) -> str:
        if self.fwmark:
            return f"FWM {self.fwmark}" + (" IPv6" if self.af == AF_INET6 else "")
        host = f"[{self.addr}]" if self.af == AF_INET6 else str(self.addr)
        return f"{self.protocol.name} {host}:{self.port}"


class VirtualServer(NamedTuple):
    """A virtual server as configured (no counters). flags never include SVC_F_HASHED."""

    key: ServiceKey
    scheduler: str = "rr"
    flags: int = 0
    timeout: int = 0  # persistence timeout in seconds (with SVC_F_PERSISTENT)
    # Persistence granularity as the kernel holds it: for IPv4 the 32-bit mask as an integer
    # (0xFFFFFFFF = per client address), for IPv6 the prefix length (1..128). -1 = the default.
    netmask: int = -1
    pe_name: str = ""

    @property
    def effective_netmask(self) -> int:
        if self.netmask >= 0:
            return self.netmask
        return 128 if self.key.af == AF_INET6 else 0xFFFFFFFF


class DestKey(NamedTuple):
    """What identifies a real server within its virtual server."""

    addr: IPAddress
    port: int

    def __str__(self) -> str:
        host = f"[{self.addr}]" if self.addr.version == 6 else str(self.addr)
        return f"{host}:{self.port}"


class RealServer(NamedTuple):
    """A real server (destination) of a virtual server, as configured (no counters)."""

    key: DestKey
    fwd: Fwd = Fwd.MASQ
    weight: int = 1
    u_threshold: int = 0
    l_threshold: int = 0
    tun_type: int = 0
    tun_port: int = 0
    tun_flags: int = 0

    @property
    def af(self) -> int:
        return AF_INET6 if self.key.addr.version == 6 else AF_INET


class Stats(NamedTuple):
    """IPVS counters (64-bit) and rates, as the kernel's IPVS_*_ATTR_STATS64 carries them."""

    conns: int = 0
    inpkts: int = 0
    outpkts: int = 0
    inbytes: int = 0
    outbytes: int = 0
    cps: int = 0
    inpps: int = 0
    outpps: int = 0
    inbps: int = 0
    outbps: int = 0


class ObservedDest(NamedTuple):
    """A real server as the kernel reports it: configuration, connection counts, counters."""

    dest: RealServer
    active_conns: int = 0
    inact_conns: int = 0
    persist_conns: int = 0
    stats: Stats = Stats()


class ObservedService(NamedTuple):
    """A virtual server as the kernel reports it, with its real servers and counters.

    as_desired: its real servers were read and are exactly the desired ones, as the kernel
    lists them (a full sync's read of the steady state, DumpDecoder.many_settled); `dests` is
    then empty, not read into objects: nothing about them is to change."""

    service: VirtualServer
    dests: tuple[ObservedDest, ...] = ()
    stats: Stats = Stats()
    as_desired: bool = False


_fields = tuple(map(itemgetter, range(len(ObservedDest._fields))))


def shared_dests(found: tuple[ObservedDest, ...], want: tuple[RealServer, ...] | None
                 ) -> tuple[ObservedDest, ...]:
    """`found` (a virtual server's real servers as read) holding `want`'s RealServer objects
    instead of its own where they are all equal: in the desired order or in its reverse, which is
    the kernel's after it added them in that order (ip_vs_ctl.c __ip_vs_update_dest puts a new
    dest at the head of the list). A full sync's read of 500,000 real servers otherwise holds a
    RealServer, a DestKey and most ports twice over while it diffs (~110 MB at 50,000 services);
    the diff then meets equal objects by identity. Any other order: `found` as it is. Built in
    C (map, zip): no Python frame per real server."""
    if not want or len(found) != len(want):
        return found
    got = list(map(_fields[0], found))
    if got == list(want):
        rs: Sequence[RealServer] = want
    elif got == list(reversed(want)):
        rs = want[::-1]
    else:
        return found
    return tuple(map(tuple.__new__, repeat(ObservedDest),
                     zip(rs, *(map(f, found) for f in _fields[1:]), strict=True)))


class IpvsInfo(NamedTuple):
    """IPVS_CMD_GET_INFO: the IPVS version and the connection hash table size."""

    version: int  # (major << 16) | (minor << 8) | patch
    conn_tab_size: int

    @property
    def version_str(self) -> str:
        v = self.version
        return f"{v >> 16}.{(v >> 8) & 0xFF}.{v & 0xFF}"


class Timeouts(NamedTuple):
    """Connection timeouts in seconds (ipvsadm --set tcp tcpfin udp)."""

    tcp: int
    tcp_fin: int
    udp: int


class OpKind(IntEnum):
    ADD_SERVICE = 1
    EDIT_SERVICE = 2
    DEL_SERVICE = 3
    ADD_DEST = 5
    EDIT_DEST = 6
    DEL_DEST = 7
    SET_TIMEOUTS = 12
    ZERO = 16
    FLUSH = 17


class IpvsOp(NamedTuple):
    """One IPVS change. The values of OpKind are the generic-netlink command numbers. (A
    NamedTuple: a cold start makes one per real server, and a frozen dataclass costs three
    times as much to build.)"""

    kind: OpKind
    service: VirtualServer | None = None
    dest: RealServer | None = None
    timeouts: Timeouts | None = None

    def __str__(self) -> str:
        what = str(self.service.key) if self.service else ""
        if self.dest:
            what += f" -> {self.dest.key}"
        return f"{self.kind.name.lower()} {what}".strip()
