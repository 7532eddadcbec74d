"""Maglev hashing (`mh`): net/netfilter/ipvs/ip_vs_mh.c of Linux 6.1.

- Table size (ip_vs_mh.c:49-59): primes[CONFIG_IP_VS_MH_TAB_INDEX - 8]. Debian's 6.1 config has
  CONFIG_IP_VS_MH_TAB_INDEX=12 (the default), so the table has primes[4] = 4093 entries (not
  65521: the Kconfig help lists the primes, the index picks the fifth). IP_VS_MH_TAB_BITS is
  12 / 2 = 6.
- Hash keys (generate_hash_secret, ip_vs_mh.c:70-78): fixed constants, not random:
  hash1 = {2654435761, 2654435761}, hash2 = {2654446892, 2654446892}. So the table and every
  lookup are predictable from the destinations alone.
- Hash (ip_vs_mh_hashkey, ip_vs_mh.c:88-102): hsiphash of the u32
  `offset + ntohs(port) + ntohl(addr_fold)` (see scheduler.siphash).
- Weights (ip_vs_mh_gcd_weight, ip_vs_mh_shift_weight, ip_vs_mh.c:322-370): from each
  destination's `last_weight` (its latest non-zero weight, ip_vs_ctl.c:919-921), not its
  weight: gcd of the positive ones, and rshift = fls(max / gcd) - 6 when positive.
- Permutation (ip_vs_mh_permutate, ip_vs_mh.c:122-157): per destination, in list order,
  offset = hash1(dest addr, dest port) % size, skip = hash2(...) % (size - 1) + 1, and
  turns = (last_weight / gcd) >> rshift, or 1 if that is 0 and last_weight is not.
- Population (ip_vs_mh_populate, ip_vs_mh.c:159-231): destinations in list order each take
  `turns` entries in a row, each entry the next free one on its own permutation
  (perm += skip mod size), round and round until the table is full.
- Picking (ip_vs_mh_get, ip_vs_mh_get_fallback, ip_vs_mh.c:234-285): entry
  hash1(client addr, port) % size; without mh-fallback none if that destination has weight 0
  or is overloaded; with mh-fallback, for offset 0..size-1 the entry
  hash1(client, port, offset=(offset + ihash) % size) % size, the first usable one.
- mh-port (ip_vs_mh.c:35-36, 486-487): the client's source port is hashed too; else port 0.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from functools import lru_cache

from scheduler.common import U32, Conn, Dest, IPAddress, Pick, addr_fold, af_of, fls, gcd, usable
from scheduler.siphash import hsiphash_u32

PRIMES = (251, 509, 1021, 2039, 4093, 8191, 16381, 32749, 65521, 131071)  # ip_vs_mh.c:50-51
CONFIG_TAB_INDEX = 12  # Debian 6.1: CONFIG_IP_VS_MH_TAB_INDEX=12 (ip_vs_mh.c:54-56 default)
TAB_SIZE = PRIMES[CONFIG_TAB_INDEX - 8]  # ip_vs_mh.c:58-59: 4093
TAB_BITS = CONFIG_TAB_INDEX // 2  # ip_vs_mh.c:57: 6

HASH1 = (2654435761, 2654435761)  # ip_vs_mh.c:73-74
HASH2 = (2654446892, 2654446892)  # ip_vs_mh.c:76-77


def hashkey(af: int, addr: IPAddress, port: int, key: tuple[int, int], offset: int) -> int:
    """ip_vs_mh_hashkey (ip_vs_mh.c:88-102); the caller takes it modulo the table size."""
    return hsiphash_u32((offset + port + addr_fold(af, addr)) & U32, key)


def weights_gcd(dests: Sequence[Dest]) -> int:
    """ip_vs_mh_gcd_weight (ip_vs_mh.c:322-338): gcd of the positive last weights, 0 if none."""
    g = 0
    for dest in dests:
        weight = dest.effective_last_weight
        if weight > 0:
            g = gcd(weight, g) if g > 0 else weight
    return g


def shift_weight(dests: Sequence[Dest], g: int, tab_bits: int = TAB_BITS) -> int:
    """ip_vs_mh_shift_weight (ip_vs_mh.c:343-370)."""
    if g < 1:
        return 0
    weight = max((d.effective_last_weight for d in dests), default=0)
    weight = max(weight, 0)
    shift = fls(weight // g) - tab_bits
    return shift if shift >= 0 else 0


@dataclass(frozen=True, slots=True)
class Setup:
    """struct ip_vs_mh_dest_setup (ip_vs_mh.c:42-47) of one destination, before population."""

    offset: int
    skip: int
    turns: int


def permutate(dests: Sequence[Dest], af: int, size: int = TAB_SIZE,
              tab_bits: int = TAB_BITS) -> tuple[Setup, ...]:
    """ip_vs_mh_permutate (ip_vs_mh.c:122-157), with the gcd and shift of the destinations."""
    g = weights_gcd(dests)
    if g < 1:  # ip_vs_mh.c:134-135
        return ()
    rshift = shift_weight(dests, g, tab_bits)
    out = []
    for dest in dests:
        offset = hashkey(af, dest.addr, dest.port, HASH1, 0) % size
        skip = hashkey(af, dest.addr, dest.port, HASH2, 0) % (size - 1) + 1
        lw = dest.effective_last_weight
        # C division of ints truncates toward zero; last weights are never negative.
        turns = ((lw // g) >> rshift) or int(lw != 0)
        out.append(Setup(offset, skip, turns))
    return tuple(out)


def populate(setups: Sequence[Setup], size: int = TAB_SIZE) -> tuple[int | None, ...]:
    """ip_vs_mh_populate (ip_vs_mh.c:159-231): for each entry, the index of its destination
    (list order); all None when no destination has a positive last weight."""
    if not setups:  # ip_vs_mh.c:172-175
        return (None,) * size
    table: list[int | None] = [None] * size
    taken = bytearray(size)
    perm = [s.offset for s in setups]
    n = 0
    dt_count = 0
    i = 0  # the list position p; len(setups) stands for the list head
    count = len(setups)
    while n < size:  # ip_vs_mh.c:184
        if i == count:  # ip_vs_mh.c:185-186
            i = 0
        while i < count:  # ip_vs_mh.c:189
            setup = setups[i]
            if setup.turns < 1:  # ip_vs_mh.c:191-195
                i += 1
                continue
            c = perm[i]
            skip = setup.skip
            while taken[c]:  # ip_vs_mh.c:198-204
                c += skip
                if c >= size:
                    c -= size
            perm[i] = c
            taken[c] = 1
            table[c] = i
            n += 1
            if n == size:  # ip_vs_mh.c:217-218
                return tuple(table)
            dt_count += 1
            if dt_count >= setup.turns:  # ip_vs_mh.c:220-224
                dt_count = 0
                i += 1
    return tuple(table)  # pragma: no cover - the loop returns when the table is full


@lru_cache(maxsize=16)
def _table(key: tuple[tuple[IPAddress, int, int], ...], af: int,
           size: int, tab_bits: int) -> tuple[int | None, ...]:
    dests = [Dest(addr, port, weight=lw) for addr, port, lw in key]
    return populate(permutate(dests, af, size, tab_bits), size)


def build_table(dests: Sequence[Dest], af: int, size: int = TAB_SIZE,
                tab_bits: int = TAB_BITS) -> tuple[int | None, ...]:
    """The lookup table the kernel holds for these destinations (ip_vs_mh_reassign,
    ip_vs_mh.c:288-320, after ip_vs_mh_dest_changed, ip_vs_mh.c:431-441): for each entry the
    index in `dests` of its destination. Cached: it depends only on addresses, ports and last
    weights."""
    key = tuple((d.addr, d.port, d.effective_last_weight) for d in dests)
    return _table(key, af, size, tab_bits)


@dataclass(frozen=True, slots=True)
class MhPick(Pick):
    """An mh pick: the client's table entry, the destination there, and with mh-fallback the
    entries tried after it (in order, the last one the pick)."""

    index: int = 0
    table_size: int = TAB_SIZE
    hashed_port: int = 0
    entry: Dest | None = None
    fallback_indexes: tuple[int, ...] = ()
    fallback: bool = False

    def to_json(self) -> dict[str, object]:
        out = Pick.to_json(self)
        out.update({
            "table_index": self.index,
            "table_size": self.table_size,
            "hashed_port": self.hashed_port,
            "table_entry": None if self.entry is None else str(self.entry),
            "fallback": self.fallback,
            "fallback_indexes": list(self.fallback_indexes),
        })
        return out


def _state(dest: Dest) -> str:
    return "has weight 0" if dest.weight <= 0 else "is overloaded"


def schedule(dests: Sequence[Dest], conn: Conn, *, mh_port: bool = False,
             mh_fallback: bool = False, af: int | None = None,
             table: Sequence[int | None] | None = None) -> MhPick:
    """ip_vs_mh_schedule (ip_vs_mh.c:473-508) for a new connection from `conn`.

    `dests` in kernel list order (a netlink dump's order); `af` is the service's address family
    (default: the client's); `table` a precomputed build_table(dests, af)."""
    family = af_of(conn.addr) if af is None else af
    tab = build_table(dests, family) if table is None else table
    size = len(tab)
    port = conn.port if mh_port else 0
    ihash = hashkey(family, conn.addr, port, HASH1, 0) % size
    idx = tab[ihash]
    entry = None if idx is None else dests[idx]
    with_port = f"port {port} + " if mh_port else ""
    hashed = f"hsiphash({with_port}{conn.addr}) -> entry {ihash} of {size}"

    def pick(dest: Dest | None, reason: str, tried: Sequence[int] = ()) -> MhPick:
        return MhPick("mh", dest, f"{hashed}, which {reason}", index=ihash, table_size=size,
                      hashed_port=port, entry=entry, fallback_indexes=tuple(tried),
                      fallback=mh_fallback)

    if entry is None:
        return pick(None, "is empty (no destination has a non-zero weight)")
    if usable(entry):
        return pick(entry, f"holds {entry}")
    if not mh_fallback:
        return pick(None, f"holds {entry}; it {_state(entry)} and without mh-fallback no other "
                          "server is tried")
    tried: list[int] = []
    for offset in range(size):  # ip_vs_mh.c:269-282
        roffset = (offset + ihash) % size
        index = hashkey(family, conn.addr, port, HASH1, roffset) % size
        tried.append(index)
        idx = tab[index]
        if idx is None:  # pragma: no cover - a populated table has no empty entry
            break
        dest = dests[idx]
        if usable(dest):
            return pick(dest, f"holds {entry}; it {_state(entry)}, so mh-fallback rehashed "
                              f"{len(tried)} time(s) and took {dest} at entry {index}", tried)
    return pick(None, f"holds {entry}; it {_state(entry)} and mh-fallback found no usable "
                      "server", tried)
