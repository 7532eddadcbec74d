"""What every scheduler model speaks: destinations, a connection, a pick, and the kernel's
address folding.

Sources cited in this package are Debian's linux-source-6.1 6.1.192-2, the source of the lab
kernel linux-image-6.1.0-56-amd64 (`apt-get download linux-source-6.1=6.1.192-2`); paths are
relative to its top directory and line numbers are that file's.

The kernel keeps a service's destinations on a list, `svc->destinations`, and every scheduler
walks that list. A new destination is put at the head of the list
(net/netfilter/ipvs/ip_vs_ctl.c:989, `list_add_rcu(&dest->n_list, &svc->destinations)`), and a
netlink dump of the destinations walks it from the head (ip_vs_ctl.c:3440): so a dump lists the
destinations in the kernel's order, the most recently added first. Every model here takes its
destinations in that order.
"""

from __future__ import annotations

from dataclasses import dataclass
from ipaddress import IPv4Address, IPv6Address

IPAddress = IPv4Address | IPv6Address

AF_INET = 2
AF_INET6 = 10

U32 = 0xFFFFFFFF

# include/uapi/linux/ip_vs.h:24-29: the scheduler flags of a service.
SVC_F_SCHED1 = 0x0008  # sh-fallback, mh-fallback
SVC_F_SCHED2 = 0x0010  # sh-port, mh-port


@dataclass(frozen=True, slots=True)
class Dest:
    """A destination (real server) as a scheduler sees it.

    `activeconns` and `inactconns` are what a netlink dump (and `ipvsadm -Ln`) reports;
    the kernel's `totalconns` is their sum (include/net/ip_vs.h:1758-1763:
    `inactconns = max(totalconns - activeconns, 0)`, and every active connection is counted in
    totalconns, net/netfilter/ipvs/ip_vs_conn.c:632-635).

    `overloaded` is the kernel's IP_VS_DEST_F_OVERLOAD flag (include/net/ip_vs.h:37).

    `last_weight` is the kernel's `dest->last_weight`, the latest non-zero weight
    (net/netfilter/ipvs/ip_vs_ctl.c:919-921); only `mh` reads it, and no dump shows it. None
    means "the same as weight", which is right unless the destination was set to weight 0
    after having had a non-zero weight.
    """

    addr: IPAddress
    port: int
    weight: int = 1
    activeconns: int = 0
    inactconns: int = 0
    overloaded: bool = False
    last_weight: int | None = None

    @property
    def totalconns(self) -> int:
        return self.activeconns + self.inactconns

    @property
    def effective_last_weight(self) -> int:
        return self.weight if self.last_weight is None else self.last_weight

    def __str__(self) -> str:
        return addr_port(self.addr, self.port)


@dataclass(frozen=True, slots=True)
class Conn:
    """The first packet of a connection, as far as a scheduler looks at it: the client's
    (source) address and port."""

    addr: IPAddress
    port: int = 0

    def __str__(self) -> str:
        return addr_port(self.addr, self.port)


@dataclass(frozen=True, slots=True)
class Pick:
    """What a scheduler returns: the destination (None: the kernel drops the connection or
    bypasses, "no destination available"), and why, in words."""

    scheduler: str
    dest: Dest | None
    reason: str

    def to_json(self) -> dict[str, object]:
        """JSON-ready data: the pick and the reasoning data of this scheduler."""
        return {
            "scheduler": self.scheduler,
            "real_server": None if self.dest is None else str(self.dest),
            "reason": self.reason,
        }


def find_dest(dests: list[Dest], addr: IPAddress, port: int) -> int:
    """The index of the destination addr:port in a kernel-ordered list (KeyError if none)."""
    for i, d in enumerate(dests):
        if d.addr == addr and d.port == port:
            return i
    raise KeyError(f"no destination {addr} port {port}")


def addr_port(addr: IPAddress, port: int) -> str:
    """IP:PORT, or [IP]:PORT for IPv6."""
    return f"[{addr}]:{port}" if addr.version == 6 else f"{addr}:{port}"


def af_of(addr: IPAddress) -> int:
    return AF_INET6 if addr.version == 6 else AF_INET


def addr_fold(af: int, addr: IPAddress) -> int:
    """`ntohl(addr_fold)` of ip_vs_sh_hashkey (ip_vs_sh.c:87-94) and ip_vs_mh_hashkey
    (ip_vs_mh.c:93-100): the address itself for IPv4, the XOR of its four 32-bit words for
    IPv6, as a host-order 32-bit integer (XOR commutes with byte order).

    `af` is the service's family, which decides how the kernel reads the 16-byte
    `union nf_inet_addr`: an IPv4 address sits in its first word with the rest zero, so an IPv4
    address folds to itself either way; an IPv6 address read as IPv4 (a mixed-family
    destination) is its first word.
    """
    value = int(addr)
    if addr.version == 4:
        return value
    words = [(value >> shift) & U32 for shift in (96, 64, 32, 0)]
    if af == AF_INET:
        return words[0]
    return words[0] ^ words[1] ^ words[2] ^ words[3]


def usable(dest: Dest) -> bool:
    """The `is_unavailable` test of sh and mh, negated (ip_vs_sh.c:74-78, ip_vs_mh.c:81-85):
    a positive weight and not overloaded. rr, lc and wlc test the same two things inline."""
    return dest.weight > 0 and not dest.overloaded


def overload_state(u_threshold: int, l_threshold: int, totalconns: int) -> bool | None:
    """Whether the kernel has IP_VS_DEST_F_OVERLOAD set, from what a dump shows; None when the
    dump cannot tell.

    ip_vs_ctl.c:872-892 (__ip_vs_dest_update_overload), called when totalconns reaches
    u_threshold (ip_vs_conn.c:635-637) and when it drops below the low threshold
    (ip_vs_conn.c:728-730): the flag is set at u_threshold and cleared below the low threshold
    (l_threshold, or u_threshold minus a quarter, ip_vs_ctl.c:973-976). Between the two it keeps
    its last value, which the dump does not show.
    """
    if not u_threshold:
        return False
    low = l_threshold or (u_threshold - (u_threshold >> 2))
    if totalconns >= u_threshold:
        return True
    if totalconns < low:
        return False
    return None


def gcd(a: int, b: int) -> int:
    """lib/math/gcd.c gcd() of two positive ints (any correct gcd gives the same value)."""
    while b:
        a, b = b, a % b
    return a


def fls(x: int) -> int:
    """fls(): the 1-based position of the most significant set bit, 0 for 0."""
    return x.bit_length()
