"""The key-sort shortcut gives exactly glibc_qsort's order (ipvsadm's), wrap-around included."""

from __future__ import annotations

from ipaddress import IPv4Address, IPv6Address

from hypothesis import given, settings
from hypothesis import strategies as st

from ipvsproxy.core.ipvs import (
    DestKey,
    ObservedDest,
    ObservedService,
    Protocol,
    RealServer,
    ServiceKey,
    VirtualServer,
)
from ipvsproxy.core.ipvsadm_sort import (
    cmp_dests,
    cmp_services,
    glibc_qsort,
    sort_dests,
    sort_services,
)

narrow4 = st.integers(0x0A000000, 0x0A00FFFF).map(IPv4Address)
wide4 = st.integers(0, 2**32 - 1).map(IPv4Address)
v6 = st.integers(0, 2**128 - 1).map(IPv6Address)
addrs = st.one_of(narrow4, wide4, v6)


@st.composite
def services(draw: st.DrawFn) -> ObservedService:
    if draw(st.integers(0, 9)) == 0:
        key = ServiceKey.mark(draw(st.sampled_from([1, 2, 2**31 + 5, 2**32 - 1])))
    else:
        key = ServiceKey.inet(draw(st.sampled_from([Protocol.TCP, Protocol.UDP])), draw(addrs),
                              draw(st.integers(0, 3)))
    return ObservedService(VirtualServer(key))


@settings(max_examples=300, deadline=None)
@given(st.lists(services(), max_size=25))
def test_service_sort_equals_glibc_qsort(svcs: list[ObservedService]) -> None:
    assert sort_services(svcs) == glibc_qsort(svcs, cmp_services)


@settings(max_examples=300, deadline=None)
@given(st.lists(st.tuples(addrs, st.integers(0, 3)), max_size=25))
def test_dest_sort_equals_glibc_qsort(ds: list[tuple[IPv4Address | IPv6Address, int]]) -> None:
    dests = [ObservedDest(RealServer(DestKey(a, p))) for a, p in ds]
    assert sort_dests(dests) == glibc_qsort(dests, cmp_dests)


def test_narrow_tables_take_the_key_sort_and_agree() -> None:
    addrs = [IPv4Address(0x0A600000 + (i * 7919) % 5000) for i in range(5000)]
    svcs = [ObservedService(VirtualServer(ServiceKey.inet(Protocol.TCP, a, 80))) for a in addrs]
    assert sort_services(svcs) == glibc_qsort(svcs, cmp_services)
