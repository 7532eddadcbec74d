"""kube-ipvs0's address messages (kernel/dummy.encode_addr): byte for byte what pyroute2 encodes
for the same address, so the hand-written encoder can replace it on the cold-start hot path."""

from __future__ import annotations

import socket
from ipaddress import IPv4Address, IPv6Address, ip_address
from typing import Any

import pytest
from pyroute2.netlink import NLM_F_ACK, NLM_F_CREATE, NLM_F_REPLACE, NLM_F_REQUEST
from pyroute2.netlink.rtnl import RTM_DELADDR, RTM_NEWADDR
from pyroute2.netlink.rtnl.ifaddrmsg import ifaddrmsg

from ipvsproxy.kernel.dummy import encode_addr

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
