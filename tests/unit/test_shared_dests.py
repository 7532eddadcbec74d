"""core/ipvs.py shared_dests: a full sync's read holds the desired RealServer objects where the
real servers it found are all equal to them (the kernel test in tests/kernel/test_ipvs.py checks
the kernel's order and the dump that uses it)."""

from __future__ import annotations

from ipaddress import IPv4Address

from ipvsproxy.core.ipvs import (
    DestKey,
    Fwd,
    ObservedDest,
    RealServer,
    Stats,
    shared_dests,
)


def _rs(i: int, weight: int = 1) -> RealServer:
    return RealServer(DestKey(IPv4Address(0x0AF40000 + i), 8080), Fwd.MASQ, weight)


def _read(want: list[RealServer]) -> tuple[ObservedDest, ...]:
    """What a dump decodes: equal values, objects of its own, counters of their own."""
    return tuple(ObservedDest(RealServer(DestKey(IPv4Address(str(r.key.addr)), int(str(
        r.key.port))), r.fwd, r.weight), i, 2 * i, 3, Stats(conns=i))
        for i, r in enumerate(want))


def test_equal_real_servers_in_either_order_become_the_desired_objects() -> None:
    want = tuple(_rs(i) for i in range(5))
    for order in (list(want), list(reversed(want))):
        found = _read(order)
        got = shared_dests(found, want)
        assert got == found
        assert all(g.dest is w for g, w in zip(got, order, strict=True))
        assert [tuple(g)[1:] for g in got] == [tuple(f)[1:] for f in found]  # counters kept
        assert all(type(g) is ObservedDest for g in got)


def test_anything_else_is_kept_as_read() -> None:
    want = tuple(_rs(i) for i in range(4))
    mixed = _read([want[1], want[0], want[2], want[3]])
    assert shared_dests(mixed, want) is mixed
    heavier = _read([*want[:3], _rs(3, weight=2)])
    assert shared_dests(heavier, want) is heavier
    fewer = _read(list(want[:3]))
    assert shared_dests(fewer, want) is fewer
    assert shared_dests(fewer, None) is fewer
    assert shared_dests((), ()) == ()
