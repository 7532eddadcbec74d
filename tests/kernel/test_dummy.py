"""The kube-ipvs0 dummy link in a real kernel: created down, addresses added and removed
idempotently in both families, with `ip addr show dev kube-ipvs0` as the oracle."""

from __future__ import annotations

import re
from collections.abc import Iterator
from ipaddress import IPv4Address, IPv6Address, ip_address

import pytest

from ipvsproxy.kernel.dummy import KUBE_IPVS0, DummyLink, DummyLinkError
from tests.kernel.conftest import sh

pytestmark = [pytest.mark.kernel, pytest.mark.lab_cost(20)]  # seconds, balances lab guests


@pytest.fixture
def link() -> Iterator[DummyLink]:
    sh(f"ip link del {KUBE_IPVS0}", check=False)
    with DummyLink() as d:
        try:
            yield d
        finally:
            sh(f"ip link del {KUBE_IPVS0}", check=False)
    assert sh(f"ip link show {KUBE_IPVS0}", check=False) == ""


def oracle() -> set[str]:
    """Addresses as `ip addr show` prints them: {"10.96.0.1/32", "2001:db8::1/128", ...}."""
    out = sh(f"ip -o addr show dev {KUBE_IPVS0}")
    return set(re.findall(r"\binet6? (\S+)", out))


def test_ensure_creates_a_dummy_left_down(link: DummyLink) -> None:
    assert link.index() is None
    idx = link.ensure()
    out = sh(f"ip -d link show {KUBE_IPVS0}")
    assert f"{idx}: {KUBE_IPVS0}:" in out
    assert "dummy" in out
    flags = re.search(r"<([^>]*)>", out)
    assert flags and "UP" not in flags.group(1).split(",")
    assert link.ensure() == idx  # idempotent
    assert link.addresses() == frozenset()


def test_add_list_remove_both_families_idempotent(link: DummyLink) -> None:
    link.ensure()
    v4 = [IPv4Address("10.96.0.1"), IPv4Address("10.96.0.10"), IPv4Address("192.168.7.7")]
    v6 = [IPv6Address("2001:db8::1"), IPv6Address("fd00:10:96::a")]
    link.add(v4 + v6)
    assert oracle() == {"10.96.0.1/32", "10.96.0.10/32", "192.168.7.7/32",
                        "2001:db8::1/128", "fd00:10:96::a/128"}
    assert link.addresses() == frozenset(v4 + v6)
    assert link.addresses(4) == frozenset(v4)
    assert link.addresses(6) == frozenset(v6)

    link.add(v4 + v6)  # again: no error, no duplicates
    link.add([v4[0], v4[0]])
    assert sh(f"ip -o addr show dev {KUBE_IPVS0}").count("10.96.0.1/32") == 1
    assert link.addresses() == frozenset(v4 + v6)

    missing = [IPv4Address("10.96.0.99"), IPv6Address("2001:db8::99")]
    link.remove([v4[1], v6[0], *missing])  # two present, two never there
    assert oracle() == {"10.96.0.1/32", "192.168.7.7/32", "fd00:10:96::a/128"}
    link.remove([v4[1], v6[0]])  # again: no error
    link.remove(v4 + v6)
    assert oracle() == set()
    assert link.addresses() == frozenset()


def test_addresses_put_there_by_others_are_listed_link_local_is_not(link: DummyLink) -> None:
    link.ensure()
    sh(f"ip addr add 10.1.2.3/24 dev {KUBE_IPVS0}")
    sh(f"ip addr add fe80::1/64 dev {KUBE_IPVS0}")
    sh(f"ip addr add 2001:db8::5/128 dev {KUBE_IPVS0}")
    assert link.addresses() == {IPv4Address("10.1.2.3"), IPv6Address("2001:db8::5")}
    with pytest.raises(DummyLinkError, match="link-local"):
        link.add([ip_address("fe80::2")])


def test_missing_link_is_an_error_and_delete_is_idempotent(link: DummyLink) -> None:
    with pytest.raises(DummyLinkError, match="does not exist"):
        link.addresses()
    with pytest.raises(DummyLinkError, match="does not exist"):
        link.add([IPv4Address("10.96.0.1")])
    link.remove([])  # nothing to do needs no link
    link.ensure()
    link.add([IPv4Address("10.96.0.1")])
    assert link.delete() is True
    assert sh(f"ip link show {KUBE_IPVS0}", check=False) == ""
    assert link.delete() is False


def test_a_link_of_that_name_that_is_not_a_dummy_is_refused() -> None:
    name = "ipvsp-br0"
    sh(f"ip link add {name} type bridge")
    try:
        with DummyLink(name) as d, pytest.raises(DummyLinkError, match="bridge"):
            d.ensure()
    finally:
        sh(f"ip link del {name}")


def test_1000_addresses(link: DummyLink) -> None:
    """Correctness at size; the timing next to `ip -batch` is make bench's (kube-ipvs0 row)."""
    link.ensure()
    v4 = [IPv4Address("10.96.0.0") + i + 1 for i in range(1000)]
    v6 = [IPv6Address("fd00:10:96::") + i + 1 for i in range(1000)]
    link.add(v4)
    link.add(v6)
    link.add(v4)  # again: idempotent
    assert link.addresses() == frozenset(v4 + v6)
    assert oracle() == {f"{a}/32" for a in v4} | {f"{a}/128" for a in v6}
    link.remove(v4 + v6)
    assert oracle() == set()


def test_a_batch_fits_whatever_the_default_receive_buffer(link: DummyLink) -> None:
    """A batch's answers wait in the socket's receive buffer until the send returns. On 6.12,
    256 acks overflowed the default 208 KiB (ENOBUFS); on 6.1 they fit it. Only a batch's last
    request asks for an ack now, but each failure is answered: removing addresses that are gone
    answers every one. Here the default is shrunk to 16 KiB, so the batch only fits if the
    socket asks for its own (nlsock.roomy)."""
    link.ensure()
    before = sh("sysctl -n net.core.rmem_default").strip()
    sh("sysctl -qw net.core.rmem_default=16384")
    try:
        addrs = [IPv4Address("10.97.0.0") + i + 1 for i in range(600)]
        link.add(addrs)
        assert link.addresses() == frozenset(addrs)
        link.remove(addrs)
        link.remove(addrs)  # none is there: 600 failures, 600 answers
    finally:
        sh(f"sysctl -qw net.core.rmem_default={before}")
    assert oracle() == set()


def test_host_facts_list_every_address_but_kube_ipvs0s(link: DummyLink) -> None:
    """host_facts reads the dump itself (kernel/addr_codec.py) and passes over kube-ipvs0's
    addresses: it lists what pyroute2 lists, less those, and `ip addr` agrees."""
    from pyroute2 import IPRoute

    from ipvsproxy.kernel.host import host_facts

    link.ensure()
    link.add([IPv4Address("10.96.0.1"), IPv6Address("fd00:10:96::a")])
    sh("ip link add lab-other type dummy && ip link set lab-other up")
    try:
        sh("ip addr add 192.0.2.7/24 dev lab-other && ip addr add 2001:db8:7::7/64 dev lab-other"
           " nodad")
        facts = host_facts()
        with IPRoute() as ipr:
            names = {m["index"]: m.get_attr("IFLA_IFNAME") for m in ipr.get_links()}
            theirs = [(names[m["index"]], ip_address(m.get_attr("IFA_ADDRESS")))
                      for m in ipr.get_addr()]
    finally:
        sh("ip link del lab-other", check=False)
    assert list(facts.addresses) == [(i, a) for i, a in theirs if i != KUBE_IPVS0]
    assert ("lab-other", ip_address("192.0.2.7")) in facts.addresses
    assert ("lab-other", ip_address("2001:db8:7::7")) in facts.addresses
    assert not [a for i, a in facts.addresses if i == KUBE_IPVS0]
