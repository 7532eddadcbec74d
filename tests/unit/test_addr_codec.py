"""kube-ipvs0's address messages (kernel/dummy.encode_addr): byte for byte what pyroute2 encodes
for the same address, so the hand-written encoder can replace it on the cold-start hot path."""

from __future__ import annotations

from ipaddress import ip_address

import pytest
from pyroute2.netlink import NLM_F_ACK, NLM_F_CREATE, NLM_F_REPLACE, NLM_F_REQUEST
from pyroute2.netlink.rtnl import RTM_DELADDR, RTM_NEWADDR

from ipvsproxy.kernel.dummy import DummyLink, encode_addr

NEW = NLM_F_REQUEST | NLM_F_ACK | NLM_F_CREATE | NLM_F_REPLACE


@pytest.mark.parametrize("addr", ["10.96.0.1", "0.0.0.0", "255.255.255.255", "fd00::10",
                                  "2001:db8:ffff:ffff:ffff:ffff:ffff:ffff", "::ffff:10.0.0.1"])
@pytest.mark.parametrize(("mtype", "flags"), [(RTM_NEWADDR, NEW),
                                              (RTM_DELADDR, NLM_F_REQUEST | NLM_F_ACK)])
@pytest.mark.parametrize(("idx", "seq"), [(1, 1), (7, 256), (2**31 - 1, 2**31 - 1)])
def test_same_bytes_as_pyroute2(addr: str, mtype: int, flags: int, idx: int, seq: int) -> None:
    a = ip_address(addr)
    msg = DummyLink._msg(idx, a, mtype, flags)
    msg["header"]["sequence_number"] = seq
    msg.encode()
    assert encode_addr(idx, a, mtype, flags, seq) == bytes(msg.data)
