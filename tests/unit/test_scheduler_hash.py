"""sh and mh models (scheduler.sh, scheduler.mh, scheduler.siphash) against hand-worked cases
from the kernel's C code, the kernel's own siphash test vectors, and properties."""

from __future__ import annotations

import collections
from ipaddress import IPv4Address, IPv6Address, ip_address

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from scheduler import AF_INET, AF_INET6, SVC_F_SCHED1, SVC_F_SCHED2, Conn, Dest, mh, predict, sh
from scheduler.common import addr_fold
from scheduler.siphash import hsiphash_u32, siphash_1_3


def d(last: int, weight: int = 1, port: int = 80, **kw: object) -> Dest:
    return Dest(IPv4Address(f"10.0.0.{last}"), port, weight, **kw)  # type: ignore[arg-type]


def client(addr: str, port: int = 0) -> Conn:
    return Conn(ip_address(addr), port)


# ------------------------------------------------------------------------------------ siphash

# lib/test_siphash.c:55-81 (64-bit): hsiphash of the bytes 0, 1, ..., i-1 under the key
# 00 01 .. 0f; the first 16 of its 64 vectors.
KERNEL_KEY = (0x0706050403020100, 0x0F0E0D0C0B0A0908)
KERNEL_VECTORS = [
    0x050FC4DC, 0x7D57CA93, 0x4DC7D44D, 0xE7DDF7FB, 0x88D38328, 0x49533B67, 0xC59F22A7,
    0x9BB11140, 0x8D299A8E, 0x6C063DE4, 0x92FF097F, 0xF94DC352, 0x57B4D9A2, 0x1229FFA7,
    0xC0F95D34, 0x2A519956,
]


@pytest.mark.parametrize("length", range(len(KERNEL_VECTORS)))
def test_siphash_1_3_matches_the_kernel_self_test_vectors(length: int) -> None:
    assert siphash_1_3(bytes(range(length)), KERNEL_KEY) & 0xFFFFFFFF == KERNEL_VECTORS[length]


def test_hsiphash_of_one_u32_is_the_kernel_vector_for_four_bytes() -> None:
    # The bytes 00 01 02 03 read as a little-endian u32.
    assert hsiphash_u32(0x03020100, KERNEL_KEY) == 0x88D38328


@given(st.integers(0, 0xFFFFFFFF), st.integers(0, 2**64 - 1), st.integers(0, 2**64 - 1))
def test_hsiphash_u32_is_siphash_1_3_of_the_value_in_memory(v: int, k0: int, k1: int) -> None:
    assert hsiphash_u32(v, (k0, k1)) == siphash_1_3(v.to_bytes(4, "little"), (k0, k1)) & 0xFFFFFFFF


# ------------------------------------------------------------------------------ address fold

def test_addr_fold_ipv4_is_the_address_and_ipv6_xors_its_words() -> None:
    assert addr_fold(AF_INET, IPv4Address("10.0.0.1")) == 0x0A000001
    assert addr_fold(AF_INET6, IPv4Address("10.0.0.1")) == 0x0A000001
    assert addr_fold(AF_INET6, IPv6Address("2001:db8::1")) == 0x20010DB8 ^ 1
    fold = 0x10002 ^ 0x30004 ^ 0x50006 ^ 0x70008
    assert addr_fold(AF_INET6, IPv6Address("1:2:3:4:5:6:7:8")) == fold
    # an IPv6 destination of an IPv4 service: the kernel reads addr->ip, the first word
    assert addr_fold(AF_INET, IPv6Address("2001:db8::1")) == 0x20010DB8


# ------------------------------------------------------------------------------------------ sh

def test_sh_hash_hand_worked() -> None:
    # hash_32(v, 8) = (v * 0x61C88647 mod 2^32) >> 24.
    # 10.0.0.1 = 0x0A000001: 0x61C88647 + (0x0A * 0x47 mod 256 = 0xC6) << 24 = 0x27C88647 -> 0x27
    assert sh.hashkey(AF_INET, client("10.0.0.1"), 0, 0) == 39
    # 0.0.0.1 -> 0x61
    assert sh.hashkey(AF_INET, client("0.0.0.1"), 0, 0) == 97
    # with sh-port, port 1 is added: 0x0A000002 -> 0xC3910C8E + 0xC6000000 = 0x89910C8E -> 0x89
    assert sh.hashkey(AF_INET, client("10.0.0.1", 1), 1, 0) == 137
    # the offset is added after hashing, modulo 256
    assert sh.hashkey(AF_INET, client("10.0.0.1"), 0, 250) == (39 + 250) % 256


def test_sh_table_weights_in_list_order_and_weight_zero_takes_one_bucket() -> None:
    # ip_vs_sh_reassign: A (weight 2) takes 2 buckets, B (1) one, C (0) one (++d_count >= 0).
    table = sh.build_table([d(1, 2), d(2, 1), d(3, 0)])
    assert len(table) == 256
    assert table[:9] == (0, 0, 1, 2, 0, 0, 1, 2, 0)
    assert collections.Counter(table) == {0: 128, 1: 64, 2: 64}


def test_sh_table_large_weights_fill_in_runs() -> None:
    table = sh.build_table([d(1, 200), d(2, 100)])
    assert table == (0,) * 200 + (1,) * 56


def test_sh_empty_service_has_empty_buckets_and_picks_nothing() -> None:
    assert sh.build_table([]) == (None,) * 256
    pick = sh.schedule([], client("10.0.0.1"), sh_fallback=True)
    assert pick.dest is None and pick.entry is None


def test_sh_weight_zero_bucket_without_and_with_fallback() -> None:
    dests = [d(1, 2), d(2, 1), d(3, 0)]
    # 10.0.0.1 -> bucket 39; 39 % 4 = 3: C, weight 0.
    pick = sh.schedule(dests, client("10.0.0.1"))
    assert (pick.bucket, pick.entry, pick.dest) == (39, dests[2], None)
    # sh-fallback: offset 0 -> roffset 39 -> bucket (39 + 39) % 256 = 78; 78 % 4 = 2: B.
    pick = sh.schedule(dests, client("10.0.0.1"), sh_fallback=True)
    assert pick.dest == dests[1]
    assert pick.fallback_buckets == (78,)
    assert predict("sh", dests, client("10.0.0.1"), SVC_F_SCHED1).dest == dests[1]


def test_sh_fallback_walks_on_from_twice_the_bucket() -> None:
    # A weight 1, B overloaded weight 3: buckets A B B B A B B B ...
    dests = [d(1, 1), d(2, 3, overloaded=True)]
    # 10.0.0.1 -> 39 (39 % 4 = 3: B). Scan: 78 (B), 79 (B), 80 (A).
    pick = sh.schedule(dests, client("10.0.0.1"), sh_fallback=True)
    assert pick.dest == dests[0]
    assert pick.fallback_buckets == (78, 79, 80)
    assert "overloaded" in pick.reason


def test_sh_port_changes_the_bucket() -> None:
    dests = [d(i) for i in range(1, 5)]
    no_port = sh.schedule(dests, client("10.0.0.1", 1))
    with_port = sh.schedule(dests, client("10.0.0.1", 1), sh_port=True)
    assert (no_port.bucket, with_port.bucket) == (39, 137)
    assert (no_port.dest, with_port.dest) == (dests[39 % 4], dests[137 % 4])
    assert predict("sh", dests, client("10.0.0.1", 1), SVC_F_SCHED2).dest == dests[1]


def test_sh_no_usable_destination_anywhere() -> None:
    pick = sh.schedule([d(1, 0), d(2, 0)], client("10.0.0.1"), sh_fallback=True)
    assert pick.dest is None
    assert len(pick.fallback_buckets) == 256


def test_sh_ipv6_client_hashes_its_folded_address() -> None:
    dests = [Dest(IPv6Address(f"fd00::{i}"), 80) for i in range(1, 4)]
    v6 = sh.schedule(dests, client("2001:db8::1"))
    # the fold 0x20010DB9 is 32.1.13.185
    assert v6.bucket == sh.hashkey(AF_INET, client("32.1.13.185"), 0, 0)
    assert v6.to_json()["real_server"] == f"[fd00::{v6.bucket % 3 + 1}]:80"


@settings(max_examples=100)
@given(st.lists(st.integers(0, 300), min_size=1, max_size=20))
def test_sh_table_runs_follow_the_weights(weights: list[int]) -> None:
    table = sh.build_table([d(i % 250 + 1, w, port=i) for i, w in enumerate(weights)])
    # rebuild by the rule: runs of max(w, 1) buckets, in list order, cycling
    expected: list[int] = []
    i = 0
    while len(expected) < 256:
        expected.extend([i] * max(weights[i], 1))
        i = (i + 1) % len(weights)
    assert table == tuple(expected[:256])


@settings(max_examples=50)
@given(st.lists(st.tuples(st.integers(0, 5), st.booleans()), min_size=1, max_size=8),
       st.integers(0, 0xFFFFFFFF), st.integers(0, 65535), st.booleans(), st.booleans())
def test_sh_pick_is_usable_and_is_the_bucket_unless_it_is_not(
        spec: list[tuple[int, bool]], addr: int, port: int, use_port: bool,
        fallback: bool) -> None:
    dests = [d(i + 1, w, overloaded=o) for i, (w, o) in enumerate(spec)]
    pick = sh.schedule(dests, Conn(IPv4Address(addr), port), sh_port=use_port,
                       sh_fallback=fallback)
    if pick.entry is not None and pick.entry.weight > 0 and not pick.entry.overloaded:
        assert pick.dest == pick.entry and not pick.fallback_buckets
    elif pick.dest is not None:
        assert fallback and pick.dest.weight > 0 and not pick.dest.overloaded
    else:
        assert not fallback or all(w == 0 or o for w, o in spec)


# ------------------------------------------------------------------------------------------ mh

def test_mh_table_size_and_keys_of_debian_6_1() -> None:
    assert mh.TAB_SIZE == 4093 and mh.TAB_BITS == 6
    assert mh.HASH1 == (2654435761, 2654435761) and mh.HASH2 == (2654446892, 2654446892)


def test_mh_populate_hand_worked() -> None:
    # Size 7. A: offset 3, skip 2, turns 1. B: offset 0, skip 3, turns 2.
    # A takes 3. B takes 0, then 0+3=3 (taken) -> 6. A: 3 taken -> 5. B: 6 -> 9-7=2; then
    # 2 -> 5 (taken) -> 8-7=1. A: 5 -> 7-7=0 (taken) -> 2 (taken) -> 4. Full.
    table = mh.populate([mh.Setup(3, 2, 1), mh.Setup(0, 3, 2)], size=7)
    assert table == (1, 1, 1, 0, 0, 0, 1)


def test_mh_populate_skips_zero_turns_and_empty_setup() -> None:
    table = mh.populate([mh.Setup(1, 1, 0), mh.Setup(2, 1, 1)], size=5)
    assert table == (1,) * 5
    assert mh.populate([], size=5) == (None,) * 5


def test_mh_turns_from_gcd_and_shift() -> None:
    # gcd 4: 4/4 = 1, 8/4 = 2, weight 0 -> 0 turns; max 2 -> fls 2 - 6 < 0: no shift
    setups = mh.permutate([d(1, 4), d(2, 8), d(3, 0)], AF_INET)
    assert [s.turns for s in setups] == [1, 2, 0]
    # gcd 1, max 1000: fls(1000) = 10, shift 4: 1 >> 4 = 0 -> (lw != 0) = 1; 1000 >> 4 = 62
    assert mh.shift_weight([d(1, 1), d(2, 1000)], 1) == 4
    assert [s.turns for s in mh.permutate([d(1, 1), d(2, 1000)], AF_INET)] == [1, 62]
    # no positive weight: no permutation, an empty table
    assert mh.permutate([d(1, 0)], AF_INET) == ()
    assert mh.build_table([d(1, 0)], AF_INET) == (None,) * 4093


def test_mh_offset_and_skip_are_hsiphash_of_the_destination() -> None:
    dest = d(1, port=8080)
    (setup,) = mh.permutate([dest], AF_INET)
    v = 8080 + 0x0A000001
    assert setup.offset == hsiphash_u32(v, mh.HASH1) % 4093
    assert setup.skip == hsiphash_u32(v, mh.HASH2) % 4092 + 1


def test_mh_lookup_is_hsiphash_of_the_client() -> None:
    dests = [d(i, port=8080) for i in range(1, 6)]
    table = mh.build_table(dests, AF_INET)
    pick = mh.schedule(dests, client("192.168.7.9", 4000))
    assert pick.index == hsiphash_u32(0xC0A80709, mh.HASH1) % 4093
    assert pick.dest is not None and pick.dest == dests[table[pick.index] or 0]
    with_port = mh.schedule(dests, client("192.168.7.9", 4000), mh_port=True)
    assert with_port.index == hsiphash_u32(0xC0A80709 + 4000, mh.HASH1) % 4093


@settings(max_examples=30, deadline=None)
@given(st.lists(st.integers(0, 20), min_size=1, max_size=6))
def test_mh_entries_per_destination_follow_turns(weights: list[int]) -> None:
    dests = [d(i + 1, w) for i, w in enumerate(weights)]
    setups = mh.permutate(dests, AF_INET)
    table = mh.build_table(dests, AF_INET)
    if not any(weights):
        assert table == (None,) * 4093
        return
    counts = collections.Counter(table)
    total_turns = sum(s.turns for s in setups)
    full_rounds = 4093 // total_turns
    for i, s in enumerate(setups):
        # every full round gives each destination `turns` entries; the last round is partial
        assert full_rounds * s.turns <= counts.get(i, 0) <= (full_rounds + 1) * s.turns


def test_mh_quiesced_destination_keeps_its_entries() -> None:
    # weight set to 0 after being 3: last_weight stays 3, so its entries stay; a client
    # whose entry is there gets no server without mh-fallback, another with it.
    dests = [d(1, 1), d(2, 0, last_weight=3), d(3, 1)]
    table = mh.build_table(dests, AF_INET)
    assert 1 in table
    for last in range(1, 250):
        c = client(f"172.16.0.{last}")
        pick = mh.schedule(dests, c, table=table)
        if pick.entry == dests[1]:
            assert pick.dest is None
            fb = mh.schedule(dests, c, mh_fallback=True, table=table)
            assert fb.dest in (dests[0], dests[2])
            assert fb.fallback_indexes[0] == hsiphash_u32(
                (pick.index + 0xAC100000 + last) & 0xFFFFFFFF, mh.HASH1) % 4093
            assert predict("mh", dests, c).dest is None
            assert predict("mh", dests, c, SVC_F_SCHED1).dest == fb.dest
            break
    else:  # pragma: no cover
        pytest.fail("no client hashed to the quiesced destination")


def test_mh_to_json() -> None:
    dests = [d(1), d(2)]
    out = mh.schedule(dests, client("10.1.2.3")).to_json()
    assert out["scheduler"] == "mh" and out["table_size"] == 4093
    assert out["real_server"] in ("10.0.0.1:80", "10.0.0.2:80")
    assert out["table_entry"] == out["real_server"]
