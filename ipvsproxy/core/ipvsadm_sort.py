"""ipvsadm 1.31's sort order for services and real servers, quirks included.

libipvs.c ipvs_cmp_services / ipvs_cmp_dests subtract address words as uint32 and store the
result in an int, so addresses 2^31 or more apart compare backwards (192.168.x.x sorts before
10.x.x.x) and the comparison is not a total order; ipvsadm sorts with glibc 2.36's qsort, a
merge sort, which this copies step for step. Where every column spans less than 2^31 a plain
key sort gives the same order, and is used instead (tests/unit/test_ipvsadm_sort.py).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from ipaddress import IPv4Address, IPv6Address
from typing import TypeVar

from ipvsproxy.core.ipvs import AF_INET6, ObservedDest, ObservedService

T = TypeVar("T")

IPAddress = IPv4Address | IPv6Address


def int32(v: int) -> int:
    """The C conversion of an unsigned 32-bit difference to int: wraps into -2^31..2^31-1."""
    v &= 0xFFFFFFFF
    return v - (1 << 32) if v & 0x80000000 else v


def _words(addr: IPAddress | None) -> tuple[int, int, int, int]:
    """union nf_inet_addr as four host-order words; IPv4 fills the first, fwmark none."""
    if addr is None:
        return (0, 0, 0, 0)
    if addr.version == 4:
        return (int(addr), 0, 0, 0)
    v = int(addr)
    return (v >> 96, (v >> 64) & 0xFFFFFFFF, (v >> 32) & 0xFFFFFFFF, v & 0xFFFFFFFF)


def _cmp_addr(af1: int, a1: IPAddress | None, a2: IPAddress | None) -> int:
    # Each word is subtracted as uint32 and stored in an int: addresses 2^31 or more apart
    # compare backwards (192.168.x.x sorts before 10.x.x.x). Only the first entry's af counts.
    w1, w2 = _words(a1), _words(a2)
    if af1 == AF_INET6:
        r = 0
        for i in range(4):
            r = int32(w1[i] - w2[i])
            if r:
                break
        return r
    return int32(w1[0] - w2[0])


def cmp_services(s1: ObservedService, s2: ObservedService) -> int:
    """libipvs.c ipvs_cmp_services: fwmark, af, protocol, address, port."""
    k1, k2 = s1.service.key, s2.service.key
    r = int32(k1.fwmark - k2.fwmark)
    if r:
        return r
    r = k1.af - k2.af
    if r:
        return r
    r = int(k1.protocol) - int(k2.protocol)
    if r:
        return r
    r = _cmp_addr(k1.af, k1.addr, k2.addr)
    if r:
        return r
    return k1.port - k2.port


def cmp_dests(d1: ObservedDest, d2: ObservedDest) -> int:
    """libipvs.c ipvs_cmp_dests: address (by the first one's family), then port."""
    k1, k2 = d1.dest.key, d2.dest.key
    r = _cmp_addr(d1.dest.af, k1.addr, k2.addr)
    if r:
        return r
    return k1.port - k2.port


def glibc_qsort(items: Sequence[T], cmp: Callable[[T, T], int]) -> list[T]:
    """glibc 2.36 qsort: msort_with_tmp, a top-down merge sort (n/2 on the left) that takes
    the left element when cmp <= 0. Copied step for step because cmp is not transitive."""
    n = len(items)
    if n <= 1:
        return list(items)
    left = glibc_qsort(items[:n // 2], cmp)
    right = glibc_qsort(items[n // 2:], cmp)
    out: list[T] = []
    i = j = 0
    while i < len(left) and j < len(right):
        if cmp(left[i], right[j]) <= 0:
            out.append(left[i])
            i += 1
        else:
            out.append(right[j])
            j += 1
    out.extend(left[i:])
    out.extend(right[j:])
    return out


WRAP = 1 << 31


def _consistent(columns: Sequence[Sequence[int]]) -> bool:
    """True when every column spans less than 2^31: then each wrapped difference has the sign of
    the true difference, the comparator is a total order, and any stable sort agrees with
    glibc's merge sort."""
    return all(not col or max(col) - min(col) < WRAP for col in columns)


def sort_services(services: Sequence[ObservedService]) -> list[ObservedService]:
    """ipvsadm's service order: a key sort when that is provably the same, else glibc_qsort."""
    keys = [(s.service.key.fwmark, s.service.key.af, int(s.service.key.protocol),
             *_words(s.service.key.addr), s.service.key.port) for s in services]
    cols = [[k[i] for k in keys] for i in (0, 3, 4, 5, 6)]
    if not _consistent(cols):
        return glibc_qsort(services, cmp_services)
    order = sorted(range(len(services)), key=keys.__getitem__)
    return [services[i] for i in order]


def sort_dests(dests: Sequence[ObservedDest]) -> list[ObservedDest]:
    """ipvsadm's real-server order, by the same rule as sort_services."""
    if len(dests) < 2:
        return list(dests)
    keys4 = [(int(k.addr), k.port) for k in [d.dest.key for d in dests]
             if type(k.addr) is IPv4Address]
    if len(keys4) == len(dests):  # all IPv4, the common case: one address word to compare
        first = [k[0] for k in keys4]
        if max(first) - min(first) < WRAP:
            order = sorted(range(len(dests)), key=keys4.__getitem__)
            return [dests[i] for i in order]
        return glibc_qsort(dests, cmp_dests)
    if len({d.dest.af for d in dests}) > 1:  # the first one's family decides each comparison
        return glibc_qsort(dests, cmp_dests)
    keys = [(*_words(d.dest.key.addr), d.dest.key.port) for d in dests]
    if not _consistent([[k[i] for k in keys] for i in range(4)]):
        return glibc_qsort(dests, cmp_dests)
    order = sorted(range(len(dests)), key=keys.__getitem__)
    return [dests[i] for i in order]
