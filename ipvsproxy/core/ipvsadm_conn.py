"""ipvsadm -c: the connection listing, rendered from the text of /proc/net/ip_vs_conn.

Pure: the caller reads the file. Mirrors ipvsadm.c list_conn / print_conn of ipvsadm 1.31,
including its fgets() buffer of 256 bytes and its sscanf() field parsing.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from ipaddress import AddressValueError, IPv4Address, IPv6Address

from ipvsproxy.core.ipvs import Protocol
from ipvsproxy.core.ipvsadm_format import (
    FMT_PERSISTENTCONN,
    NO_RESOLVER,
    addrport_to_anyname,
)

TYPE_CHECKING = False
if TYPE_CHECKING:
    from ipvsproxy.core.ipvsadm_format import Resolver  # a type only

CONN_PROC_FILE = "/proc/net/ip_vs_conn"
_FGETS_SIZE = 256  # list_conn: static char buffer[256]


@dataclass(frozen=True, slots=True)
class ConnListing:
    """What list_conn prints: stdout text, stderr text, exit code (0 unless it gave up)."""

    out: str
    err: str = ""
    rc: int = 0


def fgets_chunks(text: str) -> list[str]:
    """Split as repeated fgets(buf, 256) would: lines, long lines in pieces of 255 chars."""
    chunks: list[str] = []
    pos = 0
    while pos < len(text):
        end = text.find("\n", pos, pos + _FGETS_SIZE - 1)
        stop = end + 1 if end != -1 else min(len(text), pos + _FGETS_SIZE - 1)
        chunks.append(text[pos:stop])
        pos = stop
    return chunks


def _parse_addr(text: str) -> IPv4Address | IPv6Address | None:
    """inet_pton(AF_INET6) then inet_pton(AF_INET); None if neither parses."""
    for cls in (IPv6Address, IPv4Address):
        try:
            return cls(text)
        except (AddressValueError, ValueError):
            continue
    return None


def _strtoul16(text: str) -> int:
    """strtoul(text, NULL, 16) stored in a 32-bit address: the longest hex prefix, 0 if none."""
    s = text.strip()
    neg = s.startswith("-")
    if s[:1] in "+-":
        s = s[1:]
    if s[:2].lower() == "0x" and len(s) > 2 and s[2] in "0123456789abcdefABCDEF":
        s = s[2:]
    digits = ""
    for ch in s:
        if ch not in "0123456789abcdefABCDEF":
            break
        digits += ch
    v = int(digits, 16) if digits else 0
    v = min(v, 0xFFFFFFFFFFFFFFFF)  # ERANGE saturates at ULONG_MAX
    if neg:
        v = -v & 0xFFFFFFFFFFFFFFFF
    return v & 0xFFFFFFFF


_C_SPACE = " \t\n\v\f\r"
_NUMBER = {"h": re.compile(r"[+-]?(?:0[xX](?=[0-9a-fA-F]))?[0-9a-fA-F]+"),
           "d": re.compile(r"[+-]?[0-9]+")}


def _sscanf(buf: str) -> list[str | int] | None:
    """sscanf(buf, "%s %s %hX %s %hX %s %hX %s %d %s %s"): the converted fields, in order,
    up to the first failure; None for sscanf's -1 (input ends before the first conversion)."""
    got: list[str | int] = []
    pos = 0
    for kind in "sshshshsdss":
        while pos < len(buf) and buf[pos] in _C_SPACE:
            pos += 1
        if pos >= len(buf):
            return got or None
        if kind == "s":
            end = pos
            while end < len(buf) and buf[end] not in _C_SPACE:
                end += 1
            got.append(buf[pos:end])
            pos = end
            continue
        m = _NUMBER[kind].match(buf, pos)
        if m is None:
            return got
        text = m.group().replace("0x", "").replace("0X", "")
        value = int(text, 16 if kind == "h" else 10)
        got.append(value & 0xFFFF if kind == "h" else value)  # %hX: unsigned short
        pos = m.end()
    return got


def _addr_of(text: str) -> IPv4Address | IPv6Address:
    a = _parse_addr(text)
    return a if a is not None else IPv4Address(_strtoul16(text))


def print_conn(buf: str, fmt: int, resolver: Resolver = NO_RESOLVER) -> str | None:
    """ipvsadm.c print_conn: one output line, or None where ipvsadm calls exit(1)."""
    f = _sscanf(buf)
    if f is None:
        return None
    n = len(f)
    f += [""] * (11 - n)  # fields sscanf did not reach: ipvsadm reads garbage; we read ""
    protocol, temp1, cport, temp2, vport, temp3, dport, state, expires, pe_name, pe_data = f
    proto = {"TCP": Protocol.TCP, "UDP": Protocol.UDP, "SCTP": Protocol.SCTP}.get(
        str(protocol), 0)
    c = _parse_addr(str(temp1))
    if isinstance(c, IPv6Address):
        v: IPv4Address | IPv6Address = _parse_addr(str(temp2)) or IPv6Address(0)
        if not isinstance(v, IPv6Address):
            v = IPv6Address(0)
    elif isinstance(c, IPv4Address):
        v = _parse_addr(str(temp2)) or IPv4Address(0)
        if not isinstance(v, IPv4Address):
            v = IPv4Address(0)
    else:
        c, v = IPv4Address(_strtoul16(str(temp1))), IPv4Address(_strtoul16(str(temp2)))
    d = _addr_of(str(temp3))
    cname = addrport_to_anyname(c, int(cport or 0), proto, fmt, resolver)
    vname = addrport_to_anyname(v, int(vport or 0), proto, fmt, resolver)
    dname = addrport_to_anyname(d, int(dport or 0), proto, fmt, resolver)
    exp = int(expires or 0) & 0xFFFFFFFF
    expire_str = f"{exp // 60:02d}:{exp % 60:02d}"
    if fmt & FMT_PERSISTENTCONN and n == 11:
        return (f"{protocol!s:<3} {expire_str:<6} {state!s:<11} {cname:<18} {vname:<18} "
                f"{dname:<16} {pe_name!s:<18} {pe_data}")
    return f"{protocol!s:<3} {expire_str:<6} {state!s:<11} {cname:<18} {vname:<18} {dname}"


def list_conn(proc_text: str, fmt: int, resolver: Resolver = NO_RESOLVER) -> ConnListing:
    """ipvsadm.c list_conn, given the whole text of /proc/net/ip_vs_conn."""
    chunks = fgets_chunks(proc_text)
    if not chunks:
        return ConnListing("", f"unexpected input from {CONN_PROC_FILE}\n", 1)
    out = "IPVS connection entries\n"
    if fmt & FMT_PERSISTENTCONN:
        out += (f"pro expire {'state':<11} {'source':<18} {'virtual':<18} "
                f"{'destination':<18} {'pe name':<16} pe_data\n")
    else:
        out += f"pro expire {'state':<11} {'source':<18} {'virtual':<18} destination\n"
    for chunk in chunks[1:]:
        line = print_conn(chunk, fmt, resolver)
        if line is None:
            return ConnListing(out, "", 1)
        out += line + "\n"
    return ConnListing(out)
