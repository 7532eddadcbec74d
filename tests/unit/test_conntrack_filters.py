"""Which UDP conntrack entries are stale (core/conntrack_filters.py), decided without a kernel;
and the reading of ctnetlink dump messages (kernel/conntrack.py) on bytes a kernel produced."""

from __future__ import annotations

import socket
from ipaddress import ip_address
from typing import Any

import pytest

from ipvsproxy.core.conntrack_filters import (
    Flow,
    address_family,
    is_stale,
    stale,
    udp_filters,
)
from ipvsproxy.core.ipvs import (
    AF_INET,
    AF_INET6,
    DestKey,
    Protocol,
    RealServer,
    ServiceKey,
)
from ipvsproxy.kernel import conntrack

UDP, TCP = 17, 6
A = ip_address


def rs(addr: str, port: int, weight: int = 1) -> RealServer:
    return RealServer(DestKey(A(addr), port), weight=weight)


def udp(addr: str, port: int) -> ServiceKey:
    return ServiceKey.inet(Protocol.UDP, A(addr), port)


def flow(dst: str, dport: int, rsrc: str, rsport: int, proto: int = UDP) -> Flow:
    return Flow(proto, A(dst), dport, A(rsrc), rsport)


DNS = udp("10.96.0.10", 53)
# A NodePort service has one virtual server per node address (kube-proxy-ipvs.md §1.2)
NP_NODE = udp("192.168.1.10", 30053)
NP_BRIDGE = udp("10.244.1.1", 30053)
DNS6 = udp("fd00:96::10", 53)
DESTS = {
    DNS: (rs("10.244.1.11", 5353), rs("10.244.2.7", 5353)),
    NP_NODE: (rs("10.244.1.11", 5353),),  # externalTrafficPolicy=Local: the local pod only
    NP_BRIDGE: (rs("10.244.1.11", 5353),),
    DNS6: (rs("fd00:244::11", 5353), rs("fd00:244::2:7", 5353)),
}


# ----------------------------------------------------------------------------- udp_filters

def test_filters_of_cluster_ip_node_ports_and_ipv6() -> None:
    f = udp_filters(DESTS, [DNS, NP_NODE, NP_BRIDGE, DNS6])
    assert f == {
        (AF_INET, A("10.96.0.10"), 53): {(A("10.244.1.11"), 5353), (A("10.244.2.7"), 5353)},
        (AF_INET, A("192.168.1.10"), 30053): {(A("10.244.1.11"), 5353)},
        (AF_INET, A("10.244.1.1"), 30053): {(A("10.244.1.11"), 5353)},
        (AF_INET6, A("fd00:96::10"), 53): {(A("fd00:244::11"), 5353),
                                            (A("fd00:244::2:7"), 5353)},
    }
    assert all(isinstance(v, frozenset) for v in f.values())


def test_filters_only_for_the_keys_given() -> None:
    assert set(udp_filters(DESTS, [NP_NODE])) == {(AF_INET, A("192.168.1.10"), 30053)}
    assert udp_filters(DESTS, []) == {}
    assert udp_filters({}, [DNS]) == {}


def test_filters_skip_tcp_sctp_and_fwmark_keys() -> None:
    tcp = ServiceKey.inet(Protocol.TCP, A("10.96.0.10"), 53)
    sctp = ServiceKey.inet(Protocol.SCTP, A("10.96.0.11"), 9)
    mark = ServiceKey.mark(7)
    dests = {k: (rs("10.244.1.11", 5353),) for k in (tcp, sctp, mark)}
    assert udp_filters(dests, [tcp, sctp, mark]) == {}


def test_a_virtual_server_without_real_servers_gets_no_filter() -> None:
    # upstream: "a Service without endpoints does not require to clean the conntrack entries";
    # a deleted service (key absent from the desired state) likewise
    gone = udp("10.96.0.99", 53)
    assert udp_filters({DNS: ()}, [DNS, gone]) == {}


def test_a_real_server_at_weight_zero_is_still_valid() -> None:
    f = udp_filters({DNS: (rs("10.244.1.11", 5353, weight=0),)}, [DNS])
    assert f == {(AF_INET, A("10.96.0.10"), 53): {(A("10.244.1.11"), 5353)}}
    assert not is_stale(flow("10.96.0.10", 53, "10.244.1.11", 5353), f)


# ----------------------------------------------------------------------- is_stale / stale

FILTERS = udp_filters(DESTS, DESTS)


def test_flow_pinned_to_a_removed_real_server_is_stale() -> None:
    assert is_stale(flow("10.96.0.10", 53, "10.244.3.3", 5353), FILTERS)


def test_flow_to_a_current_real_server_is_kept() -> None:
    assert not is_stale(flow("10.96.0.10", 53, "10.244.1.11", 5353), FILTERS)
    assert not is_stale(flow("10.96.0.10", 53, "10.244.2.7", 5353), FILTERS)


def test_same_backend_address_on_another_port_is_stale() -> None:
    # IPVS real servers are address:port; the target port changed (upstream looks at the
    # address only and would keep this flow)
    assert is_stale(flow("10.96.0.10", 53, "10.244.1.11", 5354), FILTERS)


def test_flow_never_translated_to_a_backend_is_stale() -> None:
    # e.g. created before the virtual server existed: its reply comes from the frontend itself
    assert is_stale(flow("10.96.0.10", 53, "10.96.0.10", 53), FILTERS)


def test_flows_to_anything_but_a_filtered_frontend_are_kept() -> None:
    # straight to the removed pod, not through the service
    assert not is_stale(flow("10.244.3.3", 5353, "10.244.3.3", 5353), FILTERS)
    # the service address on another port, another service address, TCP to the service
    assert not is_stale(flow("10.96.0.10", 54, "10.244.3.3", 5353), FILTERS)
    assert not is_stale(flow("10.96.0.11", 53, "10.244.3.3", 5353), FILTERS)
    assert not is_stale(flow("10.96.0.10", 53, "10.244.3.3", 5353, proto=TCP), FILTERS)


def test_node_port_flows_are_judged_per_node_address() -> None:
    # the node-port frontends only have the local pod: a flow to the other pod is stale there
    assert is_stale(flow("192.168.1.10", 30053, "10.244.2.7", 5353), FILTERS)
    assert is_stale(flow("10.244.1.1", 30053, "10.244.2.7", 5353), FILTERS)
    assert not is_stale(flow("192.168.1.10", 30053, "10.244.1.11", 5353), FILTERS)
    # the node port on an address that has no virtual server is none of our business
    assert not is_stale(flow("172.17.0.1", 30053, "10.244.2.7", 5353), FILTERS)


def test_ipv6() -> None:
    assert is_stale(flow("fd00:96::10", 53, "fd00:244::3:3", 5353), FILTERS)
    assert not is_stale(flow("fd00:96::10", 53, "fd00:244::2:7", 5353), FILTERS)
    # the same numbers in the other family never match
    v4only = udp_filters(DESTS, [DNS])
    assert not is_stale(flow("fd00:96::10", 53, "fd00:244::3:3", 5353), v4only)
    assert not is_stale(flow("::ffff:10.96.0.10", 53, "::ffff:10.244.3.3", 5353), v4only)


def test_stale_picks_the_stale_flows_in_order() -> None:
    flows = [
        flow("10.96.0.10", 53, "10.244.3.3", 5353),      # stale
        flow("10.96.0.10", 53, "10.244.1.11", 5353),     # valid
        flow("10.244.3.3", 5353, "10.244.3.3", 5353),    # foreign
        flow("fd00:96::10", 53, "fd00:244::3:3", 5353),  # stale
    ]
    assert stale(flows, FILTERS) == [flows[0], flows[3]]
    assert stale(iter(flows), FILTERS) == [flows[0], flows[3]]


def test_empty_filters_delete_nothing() -> None:
    assert stale([flow("10.96.0.10", 53, "10.244.3.3", 5353)], {}) == []
    assert not is_stale(flow("10.96.0.10", 53, "10.244.3.3", 5353), {})


def test_an_explicit_empty_backend_set_makes_every_flow_to_it_stale() -> None:
    f = {(AF_INET, A("10.96.0.10"), 53): frozenset[tuple[Any, int]]()}
    assert is_stale(flow("10.96.0.10", 53, "10.244.1.11", 5353), f)


def test_address_family_from_af_or_ip_version() -> None:
    assert address_family(4) == address_family(socket.AF_INET) == AF_INET
    assert address_family(6) == address_family(socket.AF_INET6) == AF_INET6
    with pytest.raises(ValueError):
        address_family(0)


# ------------------------------------------------------- kernel/conntrack.py without a kernel

# Dump messages as a 6.18 kernel sent them (IPCTNL_MSG_CT_NEW, NLM_F_MULTI). IPv4: client
# 192.168.1.100:10000 -> 10.96.0.53:53, reply from 10.244.1.12:5353, id 0xce2f35db.
V4_MSG = bytes.fromhex(
    "c00000000001220000010000c83a000002000000340001801400018008000100c0a80164080002000a60"
    "00351c0002800500010011000000060002002710000006000300003500003400028014000180080001000a"
    "f4010c08000200c0a801641c00028005000100110000000600020014e900000600030027100000080003"
    "0000000008080008000000000008000c00ce2f35db08000b0000000001080007000000003b1c00188008"
    "0001000000000008000200000000000800030000000000")
# IPv6 in conntrack zone 7: [fd00::100]:40001 -> [fd00:96::53]:53, reply from
# [fd00:244::11]:5353, id 3474447564.
V6_MSG = bytes.fromhex(
    "f80000000001220000010000973b00000a0000004c0001802c00018014000300fd0000000000000000000000"
    "0000010014000400fd0000960000000000000000000000531c0002800500010011000000060002009c410000"
    "06000300003500004c0002802c00018014000300fd00024400000000000000000000001114000400fd000000"
    "0000000000000000000001001c00028005000100110000000600020014e90000060003009c41000006001200"
    "000700000800030000000008080008000000000008000c00cf17dccc08000b0000000001080007000000003b"
    "1c001880080001000000000008000200000000000800030000000000")


def test_read_ipv4_entry() -> None:
    e = conntrack._read_entry(V4_MSG, 0, len(V4_MSG), conntrack.CTA_IP_V4_SRC,
                              conntrack.CTA_IP_V4_DST)
    assert e is not None
    assert (e.proto, A(e.src), e.sport, A(e.dst), e.dport) == \
        (UDP, A("192.168.1.100"), 10000, A("10.96.0.53"), 53)
    assert (A(e.reply_src), e.reply_sport) == (A("10.244.1.12"), 5353)
    assert (e.ct_id, e.zone) == (0xCE2F35DB, None)


def test_read_ipv6_entry_with_zone_and_at_an_offset() -> None:
    buf = b"\0" * 12 + V6_MSG + b"\xff" * 8  # the message inside a larger receive buffer
    e = conntrack._read_entry(buf, 12, len(V6_MSG), conntrack.CTA_IP_V6_SRC,
                              conntrack.CTA_IP_V6_DST)
    assert e is not None
    assert (A(e.src), e.sport, A(e.dst), e.dport) == (A("fd00::100"), 40001, A("fd00:96::53"), 53)
    assert (A(e.reply_src), e.reply_sport) == (A("fd00:244::11"), 5353)
    assert (e.ct_id, e.zone) == (3474447564, 7)


def test_read_entry_of_the_other_family_is_none() -> None:
    assert conntrack._read_entry(V6_MSG, 0, len(V6_MSG), conntrack.CTA_IP_V4_SRC,
                                 conntrack.CTA_IP_V4_DST) is None


def test_nothing_to_sweep_opens_no_socket(monkeypatch: pytest.MonkeyPatch) -> None:
    def boom(*a: Any, **kw: Any) -> None:
        raise AssertionError("a netlink socket was opened")

    monkeypatch.setattr(conntrack, "NFCTSocket", boom)
    assert conntrack.clear_stale_udp({}, AF_INET) == 0
    only_v6 = udp_filters(DESTS, [DNS6])
    assert conntrack.clear_stale_udp(only_v6, 4) == 0
    assert conntrack.clear_stale_udp(udp_filters(DESTS, [DNS]), AF_INET6) == 0
