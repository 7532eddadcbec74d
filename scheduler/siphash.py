"""hsiphash() of the kernel on 64-bit machines: SipHash-1-3 with a 32-bit result.

lib/siphash.c:229-231: "on 64-bit, we make HalfSipHash1-3 actually be SipHash1-3". The mh
scheduler hashes one 32-bit value (net/netfilter/ipvs/ip_vs_mh.c:100-101,
`hsiphash(&v, sizeof(v), key)`), so only a 4-byte message is modelled:

- include/linux/siphash.h:131-137: hsiphash() calls __hsiphash_unaligned() on x86-64
  (CONFIG_HAVE_EFFICIENT_UNALIGNED_ACCESS); ___hsiphash_aligned() would call hsiphash_1u32()
  (siphash.h:107-111, lib/siphash.c:316-321). Both compute the same value for 4 bytes.
- lib/siphash.c:22-31 (PREAMBLE): v0..v3 from the SipHash constants (siphash.h:152-155) and the
  key, b = len << 56.
- lib/siphash.c:279-307 (__hsiphash_unaligned): no full 8-byte word; the 4 bytes are read
  little-endian into b (case 4, `get_unaligned_le32`). On x86 the value's bytes in memory are
  little-endian, so b gets the value itself.
- lib/siphash.c:236-244 (HPOSTAMBLE): v3 ^= b, one round, v0 ^= b, v2 ^= 0xff, three rounds,
  and (v0 ^ v1) ^ (v2 ^ v3) returned as u32 (its low 32 bits).
- include/linux/siphash.h:146-150: SIPHASH_PERMUTATION, the round.

The 32-bit (HalfSipHash-1-3, lib/siphash.c:385 onwards) variant is not modelled: the lab and
every Kubernetes node this project targets are 64-bit.
"""

from __future__ import annotations

M64 = 0xFFFFFFFFFFFFFFFF

SIPHASH_CONST_0 = 0x736F6D6570736575
SIPHASH_CONST_1 = 0x646F72616E646F6D
SIPHASH_CONST_2 = 0x6C7967656E657261
SIPHASH_CONST_3 = 0x7465646279746573


def _rol64(x: int, b: int) -> int:
    return ((x << b) | (x >> (64 - b))) & M64


def _round(v0: int, v1: int, v2: int, v3: int) -> tuple[int, int, int, int]:
    """SIPHASH_PERMUTATION (include/linux/siphash.h:146-150)."""
    v0 = (v0 + v1) & M64
    v1 = _rol64(v1, 13) ^ v0
    v0 = _rol64(v0, 32)
    v2 = (v2 + v3) & M64
    v3 = _rol64(v3, 16) ^ v2
    v0 = (v0 + v3) & M64
    v3 = _rol64(v3, 21) ^ v0
    v2 = (v2 + v1) & M64
    v1 = _rol64(v1, 17) ^ v2
    v2 = _rol64(v2, 32)
    return v0, v1, v2, v3


def hsiphash_u32(value: int, key: tuple[int, int]) -> int:
    """hsiphash(&value, 4, key) on x86-64: the 32-bit result for one u32 `value` and a key of
    two unsigned longs."""
    k0, k1 = key[0] & M64, key[1] & M64
    v0 = SIPHASH_CONST_0 ^ k0
    v1 = SIPHASH_CONST_1 ^ k1
    v2 = SIPHASH_CONST_2 ^ k0
    v3 = SIPHASH_CONST_3 ^ k1
    b = (4 << 56) | (value & 0xFFFFFFFF)
    v3 ^= b
    v0, v1, v2, v3 = _round(v0, v1, v2, v3)
    v0 ^= b
    v2 ^= 0xFF
    for _ in range(3):
        v0, v1, v2, v3 = _round(v0, v1, v2, v3)
    return (v0 ^ v1 ^ v2 ^ v3) & 0xFFFFFFFF


def siphash_1_3(data: bytes, key: tuple[int, int]) -> int:
    """Reference SipHash-1-3 (64-bit output) of any message, in the shape of the SipHash paper;
    used to cross-check hsiphash_u32 (a 4-byte message gives the same low 32 bits)."""
    k0, k1 = key[0] & M64, key[1] & M64
    v0 = SIPHASH_CONST_0 ^ k0
    v1 = SIPHASH_CONST_1 ^ k1
    v2 = SIPHASH_CONST_2 ^ k0
    v3 = SIPHASH_CONST_3 ^ k1
    full = len(data) - len(data) % 8
    for i in range(0, full, 8):
        m = int.from_bytes(data[i:i + 8], "little")
        v3 ^= m
        v0, v1, v2, v3 = _round(v0, v1, v2, v3)
        v0 ^= m
    b = ((len(data) & 0xFF) << 56) | int.from_bytes(data[full:], "little")
    v3 ^= b
    v0, v1, v2, v3 = _round(v0, v1, v2, v3)
    v0 ^= b
    v2 ^= 0xFF
    for _ in range(3):
        v0, v1, v2, v3 = _round(v0, v1, v2, v3)
    return v0 ^ v1 ^ v2 ^ v3
