"""Interface address messages (kernel/addr_codec.py: kube-ipvs0's and the host's addresses):
byte for byte what pyroute2 encodes for the same address, so the hand-written encoder can
replace it on the cold-start hot path; the address dump (addr_dump_request, decode_addr) reads
what pyroute2's decoder reads; and host_facts reads the host's addresses as pyroute2 lists them,
kube-ipvs0's left out."""

from __future__ import annotations

import socket
from ipaddress import IPv4Address, IPv6Address, ip_address
from typing import Any

import pytest
from pyroute2.netlink import NLM_F_ACK, NLM_F_CREATE, NLM_F_REPLACE, NLM_F_REQUEST
from pyroute2.netlink.rtnl import RTM_DELADDR, RTM_NEWADDR
from pyroute2.netlink.rtnl.ifaddrmsg import ifaddrmsg

from ipvsproxy.kernel.addr_codec import (
    addr_dump_request,
    decode_addr,
    decode_addr_payload,
    encode_addr,
)
from ipvsproxy.kernel.ipvs_codec import DecodeError

NEW = NLM_F_REQUEST | NLM_F_ACK | NLM_F_CREATE | NLM_F_REPLACE


def pyroute2_msg(idx: int, addr: IPv4Address | IPv6Address, mtype: int, flags: int) -> Any:
    """The message as pyroute2 builds it (what DummyLink sent before encode_addr)."""
    msg = ifaddrmsg()
    msg["family"] = socket.AF_INET if addr.version == 4 else socket.AF_INET6
    msg["prefixlen"] = addr.max_prefixlen
    msg["index"] = idx
    text = str(addr)
    msg["attrs"] = [("IFA_LOCAL", text), ("IFA_ADDRESS", text)] if addr.version == 4 \
        else [("IFA_ADDRESS", text)]
    msg["header"]["type"] = mtype
    msg["header"]["flags"] = flags
    return msg


@pytest.mark.parametrize("addr", ["10.96.0.1", "0.0.0.0", "255.255.255.255", "fd00::10",
                                  "2001:db8:ffff:ffff:ffff:ffff:ffff:ffff", "::ffff:10.0.0.1"])
@pytest.mark.parametrize(("mtype", "flags"), [(RTM_NEWADDR, NEW),
                                              (RTM_DELADDR, NLM_F_REQUEST | NLM_F_ACK)])
@pytest.mark.parametrize(("idx", "seq"), [(1, 1), (7, 256), (2**31 - 1, 2**31 - 1)])
def test_same_bytes_as_pyroute2(addr: str, mtype: int, flags: int, idx: int, seq: int) -> None:
    a = ip_address(addr)
    msg = pyroute2_msg(idx, a, mtype, flags)
    msg["header"]["sequence_number"] = seq
    msg.encode()
    assert encode_addr(idx, a, mtype, flags, seq) == bytes(msg.data)


# ---- the address dump (kernel/dummy.decode_addr_payload), against pyroute2's decoder


def pyroute2_dump_msg(idx: int, addr: IPv4Address | IPv6Address, peer: str | None = None,
                      extra: bool = True) -> bytes:
    """An RTM_NEWADDR as the kernel sends it in a dump, encoded by pyroute2: IFA_ADDRESS (the
    peer, when there is one) and IFA_LOCAL for IPv4, IFA_ADDRESS alone for IPv6, with the
    attributes the kernel adds (label, flags, cacheinfo) around them."""
    msg = ifaddrmsg()
    msg["family"] = socket.AF_INET if addr.version == 4 else socket.AF_INET6
    msg["prefixlen"] = addr.max_prefixlen
    msg["index"] = idx
    text = str(addr)
    attrs: list[tuple[str, Any]] = [("IFA_ADDRESS", peer or text)]
    if addr.version == 4 or peer:
        attrs.append(("IFA_LOCAL", text))
    if extra:
        attrs = [("IFA_FLAGS", 0x80), *attrs, ("IFA_LABEL", "kube-ipvs0"),
                 ("IFA_CACHEINFO", {"ifa_preferred": 2**32 - 1, "ifa_valid": 2**32 - 1,
                                    "cstamp": 1234, "tstamp": 5678})]
    msg["attrs"] = attrs
    msg["header"]["type"] = RTM_NEWADDR
    msg["header"]["flags"] = 2  # NLM_F_MULTI
    msg["header"]["sequence_number"] = 1
    msg.encode()
    return bytes(msg.data)


@pytest.mark.parametrize("addr", ["10.96.0.1", "169.254.1.1", "fd00::10", "fe80::1",
                                  "2001:db8:ffff:ffff:ffff:ffff:ffff:ffff", "::ffff:10.0.0.1"])
@pytest.mark.parametrize("extra", [True, False])
@pytest.mark.parametrize("peer", [None, "peer"])
def test_dump_decodes_as_pyroute2_does(addr: str, extra: bool, peer: str | None) -> None:
    a = ip_address(addr)
    peer_text = None if peer is None else ("192.0.2.9" if a.version == 4 else "2001:db8::9")
    raw = pyroute2_dump_msg(7, a, peer_text, extra)
    theirs = ifaddrmsg(raw)
    theirs.decode()
    payload = memoryview(raw)[16:]
    assert decode_addr_payload(payload, 7) == ip_address(theirs.get_attr("IFA_ADDRESS"))
    assert decode_addr_payload(payload, 8) is None  # another link's address
    assert decode_addr(payload) == (7, ip_address(theirs.get_attr("IFA_ADDRESS")))


def test_dump_request_and_bad_messages() -> None:
    from pyroute2.netlink import NLM_F_DUMP
    from pyroute2.netlink.rtnl import RTM_GETADDR

    msg = ifaddrmsg()
    msg["family"] = socket.AF_INET6
    msg["header"]["type"] = RTM_GETADDR
    msg["header"]["flags"] = NLM_F_REQUEST | NLM_F_DUMP
    msg["header"]["sequence_number"] = 5
    msg.encode()
    assert addr_dump_request(socket.AF_INET6, 5) == bytes(msg.data)
    good = memoryview(pyroute2_dump_msg(3, ip_address("10.0.0.1")))[16:]
    with pytest.raises(DecodeError):
        decode_addr_payload(good[:5], 3)  # truncated ifaddrmsg
    with pytest.raises(DecodeError):
        decode_addr_payload(good[:len(good) - 2], 3)  # last attribute overruns
    # a family other than IPv4 and IPv6 is not an address of ours
    assert decode_addr_payload(memoryview(bytes([17]) + bytes(good[1:])), 3) is None


def test_host_facts_reads_this_hosts_addresses_as_pyroute2_does() -> None:
    """On the host running the tests (the lab's kernel test adds kube-ipvs0 to this)."""
    from pyroute2 import IPRoute

    from ipvsproxy.kernel.host import host_facts

    with IPRoute() as ipr:
        names = {m["index"]: m.get_attr("IFLA_IFNAME") for m in ipr.get_links()}
        theirs = [(names[m["index"]], ip_address(m.get_attr("IFA_ADDRESS")))
                  for m in ipr.get_addr() if m.get_attr("IFA_ADDRESS")]
    assert theirs, "no address on this host at all"
    assert list(host_facts().addresses) == theirs
