"""Interface addresses over rtnetlink, encoded and decoded here rather than by pyroute2: the
RTM_NEWADDR/RTM_DELADDR messages kube-ipvs0's addresses are bound and unbound with, and the
RTM_GETADDR dump that lists them (kernel/dummy.py) and the node's own addresses
(kernel/host.py). Each is checked against pyroute2's encoder and decoder in
tests/unit/test_addr_codec.py.

Why: pyroute2's addr() costs ~0.2 ms of Python per call, and its get_addr decodes each message
through its asyncio core, ~3 ms per address under the lab's emulation; at 10,000 services
kube-ipvs0 holds 10,000 addresses, listed at every full sync.
"""

from __future__ import annotations

import socket
import struct
from collections.abc import Iterator
from ipaddress import IPv4Address, IPv6Address

from pyroute2.netlink import NLM_F_DUMP, NLM_F_REQUEST
from pyroute2.netlink.rtnl import RTM_GETADDR

from ipvsproxy.kernel import ipvs_codec as c

IPAddress = IPv4Address | IPv6Address

_ADDR_MSG = struct.Struct("=IHHIIBBBBi")  # nlmsghdr + ifaddrmsg
_RTA = struct.Struct("=HH")
_IFADDRMSG = struct.Struct("=BBBBI")  # family, prefixlen, flags, scope, index
_INDEX = struct.Struct("=I")  # ifaddrmsg's index, at offset 4
IFA_ADDRESS, IFA_LOCAL = 1, 2


def encode_addr(idx: int, addr: IPAddress, mtype: int, flags: int, seq: int) -> bytes:
    """RTM_NEWADDR/RTM_DELADDR for one /32 or /128, byte for byte what pyroute2's ifaddrmsg
    encodes (tests/unit/test_addr_codec.py), which costs ~100x as much: 4 ms per address under
    the lab's emulation, where a cold start binds 10,000. IPv4 needs IFA_LOCAL (the address)
    and IFA_ADDRESS (the peer, here the same); IPv6 takes IFA_ADDRESS alone (a differing
    IFA_LOCAL would make it a peer address)."""
    raw = addr.packed
    rta = _RTA.pack(4 + len(raw), IFA_ADDRESS) + raw
    if addr.version == 4:
        rta = _RTA.pack(8, IFA_LOCAL) + raw + rta
    fam = socket.AF_INET if addr.version == 4 else socket.AF_INET6
    return _ADDR_MSG.pack(_ADDR_MSG.size + len(rta), mtype, flags, seq, 0, fam,
                          addr.max_prefixlen, 0, 0, idx) + rta


def addr_dump_request(family: int, seq: int) -> bytes:
    """RTM_GETADDR dump of every address of a family (AF_UNSPEC: all). Without strict checking
    the kernel ignores an ifaddrmsg index in a dump request, so the reader filters by link."""
    return _ADDR_MSG.pack(_ADDR_MSG.size, RTM_GETADDR, NLM_F_REQUEST | NLM_F_DUMP, seq, 0,
                          family, 0, 0, 0, 0)


def link_index(payload: memoryview) -> int:
    """The link of one RTM_NEWADDR, read without decoding the rest."""
    if len(payload) < _IFADDRMSG.size:
        raise c.DecodeError("short ifaddrmsg")
    return int(_INDEX.unpack_from(payload, 4)[0])


def decode_addr_payload(payload: memoryview, idx: int) -> IPAddress | None:
    """The address of one RTM_NEWADDR (ifaddrmsg, then attributes) if it is on link idx (see
    decode_addr); None for another link."""
    if link_index(payload) != idx:
        return None
    got = decode_addr(payload)
    return None if got is None else got[1]


def decode_addr(payload: memoryview) -> tuple[int, IPAddress] | None:
    """The link index and address of one RTM_NEWADDR: its IFA_ADDRESS, as pyroute2's
    get_attr("IFA_ADDRESS") reads it, else IFA_LOCAL; None for a family other than IPv4 and
    IPv6."""
    if len(payload) < _IFADDRMSG.size:
        raise c.DecodeError("short ifaddrmsg")
    family, _plen, _flags, _scope, index = _IFADDRMSG.unpack_from(payload)
    if family not in (socket.AF_INET, socket.AF_INET6):
        return None
    found: dict[int, bytes] = {}
    off, end = _IFADDRMSG.size, len(payload)
    while off + 4 <= end:
        n, t = _RTA.unpack_from(payload, off)
        if n < 4 or off + n > end:
            raise c.DecodeError(f"bad address attribute at offset {off}")
        if t in (IFA_ADDRESS, IFA_LOCAL):
            found.setdefault(t, bytes(payload[off + 4:off + n]))
        off += (n + 3) & ~3
    raw = found.get(IFA_ADDRESS) or found.get(IFA_LOCAL)
    if raw is None:
        return None
    if len(raw) != (4 if family == socket.AF_INET else 16):
        raise c.DecodeError(f"address of {len(raw)} bytes in family {family}")
    return index, IPv4Address(raw) if family == socket.AF_INET else IPv6Address(raw)


def dump(family: int, what: str) -> list[memoryview]:
    """The payloads of one RTM_GETADDR dump (all RTM_NEWADDR); `what` names it in errors."""
    with socket.socket(socket.AF_NETLINK, socket.SOCK_RAW, socket.NETLINK_ROUTE) as sock:
        sock.send(addr_dump_request(family, 1))
        return c.replies(lambda: sock.recv(1 << 20), 1, what)


def addresses(skip: int | None = None) -> Iterator[tuple[int, IPAddress]]:
    """(link index, address) of every address of every link but link `skip`, whose messages
    are passed over unread (kube-ipvs0's 10,000 at 10,000 services)."""
    for p in dump(socket.AF_UNSPEC, "listing the addresses"):
        if skip is not None and link_index(p) == skip:
            continue
        got = decode_addr(p)
        if got is not None:
            yield got
