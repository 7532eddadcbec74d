"""Address objects for the IPVS dump decoder: made fast, and shared within a dump and with
the dump before it (a node's pods serve many services, so one object per address, not per real
server)."""

from __future__ import annotations

from _socket import ntohl  # (not socket: see core/ipvs.py AF_INET)
from collections.abc import Callable, Iterable
from ipaddress import IPv4Address, IPv6Address
from itertools import filterfalse
from operator import attrgetter
from typing import Any


def _ipv4_makers() -> tuple[Callable[[int], IPv4Address],
                             Callable[[Iterable[int]], list[IPv4Address]]]:
    """IPv4Address(ntohl(n)) for an IPv4 address read as a native u32 n (and for many such n),
    without the constructor's Python-level checks: the object is made as
    IPv4Address.__init__ makes it, its one slot `_ip` set. A dump makes one per real server;
    this halves the cost. It is checked here against the real constructor (and the class's
    slots); if this Python's ipaddress differs, the real constructor is used."""
    new = object.__new__

    def make(n: int) -> IPv4Address:
        addr = new(IPv4Address)
        addr._ip = ntohl(n)  # type: ignore[attr-defined]
        return addr

    def make_many(ns: Iterable[int]) -> list[IPv4Address]:
        out: list[IPv4Address] = []
        append = out.append
        for n in ns:
            addr = new(IPv4Address)
            addr._ip = ntohl(n)  # type: ignore[attr-defined]
            append(addr)
        return out

    def make_slowly(n: int) -> IPv4Address:
        return IPv4Address(ntohl(n))

    def make_many_slowly(ns: Iterable[int]) -> list[IPv4Address]:
        return [IPv4Address(ntohl(n)) for n in ns]

    slots = {s for cls in IPv4Address.__mro__ for s in cls.__dict__.get("__slots__", ())}
    try:
        real = IPv4Address("192.168.10.1")
        same = slots == {"_ip", "__weakref__"} and all(
            probe == real and hash(probe) == hash(real) and str(probe) == str(real)
            and probe.packed == real.packed
            for probe in (make(0x010AA8C0), *make_many([0x010AA8C0])))
    except Exception:  # any surprise means: use the real constructor
        same = False
    return (make, make_many) if same else (make_slowly, make_many_slowly)


ipv4, ipv4_many = _ipv4_makers()  # native u32(s) -> IPv4Address(es)
# An IPv4Address's number, read from its slot (as _ipv4 writes it) where that was checked above;
# else through the Python-level int().
ipv4_number: Callable[[IPv4Address], int] = \
    attrgetter("_ip") if ipv4.__name__ == "make" else int


class Addrs(dict["Any", "IPv4Address | IPv6Address"]):
    """An address as a shape reads it (a native u32 for IPv4, 16 bytes for IPv6) -> its object.
    A miss takes the object of the dump before, else makes one; dict calls __missing__ from C,
    so a hit runs no Python code."""

    __slots__ = ("before",)

    def __init__(self, before: dict[Any, IPv4Address | IPv6Address] | None = None) -> None:
        super().__init__()
        self.before = before if before is not None else {}

    def add_ipv4(self, raws: Iterable[int]) -> None:
        """Hold the objects of these IPv4 addresses (native u32s), made in one go: before a
        decode of many real servers, which then only looks them up."""
        # (filterfalse/filter with __contains__, not set.difference: a set's difference with
        # a dict subclass walks the whole dict, every call.)
        need = set(filterfalse(self.__contains__, raws))
        before = self.before
        reuse = list(filter(before.__contains__, need)) if before else []
        if reuse:
            self.update(zip(reuse, map(before.__getitem__, reuse), strict=True))
            need.difference_update(reuse)
        if need:
            self.update(zip(need, ipv4_many(need), strict=True))

    def __missing__(self, raw: int | bytes) -> IPv4Address | IPv6Address:
        addr = self.before.get(raw)
        if addr is None:
            addr = ipv4(raw) if type(raw) is int else IPv6Address(raw)
        self[raw] = addr
        return addr
