"""ipset's text forms, pure: set specs, canonical entries, `ipset save` parsing, restore scripts.

This module owns the words the ipset layer speaks. An entry is a plain string in exactly the form
`ipset save` prints it ("10.96.0.1,tcp:80", "10.0.0.1,tcp:80,10.0.0.1",
"1.2.3.4,tcp:80,10.0.0.0/8", "30080", "2001:db8::1,sctp:80"), so desired and observed member sets
are compared with plain set operations, and 50,000 entries cost nothing to diff. The builders
below produce that form from ipaddress values; `canonical_entry` checks and normalises untrusted
text. No subprocesses or sockets here: ipvsproxy.kernel.ipset runs the tool.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Iterable, Mapping, Sequence, Set
from dataclasses import dataclass, field
from enum import StrEnum
from ipaddress import (
    IPv4Address,
    IPv4Network,
    IPv6Address,
    IPv6Network,
    ip_address,
    ip_network,
)

IPAddress = IPv4Address | IPv6Address
IPNetwork = IPv4Network | IPv6Network

MAX_NAME_LEN = 31  # IPSET_MAXNAMELEN is 32 with the trailing NUL
MAX_COMMENT_LEN = 255  # IPSET_MAX_COMMENT_SIZE
MIN_HASHSIZE = 64  # the kernel raises smaller hash sizes to this, then rounds to a power of 2
PROTOCOLS = frozenset({"tcp", "udp", "sctp"})  # the only protocols kube-proxy puts in sets
# kube-proxy creates every set with maxelem 65536 (pkg/proxy/ipvs/ipset.go), and a cluster with
# more ClusterIP:port pairs than that fails to sync ("Hash is full, cannot add more elements").
# We keep 65536 as the floor (a set kube-proxy made is taken over as it is) and size larger sets
# from the desired state, see capacity().
DEFAULT_MAXELEM = 65536


class SetType(StrEnum):
    HASH_IP_PORT = "hash:ip,port"
    HASH_IP_PORT_IP = "hash:ip,port,ip"
    HASH_IP_PORT_NET = "hash:ip,port,net"
    HASH_IP = "hash:ip"
    BITMAP_PORT = "bitmap:port"


class Family(StrEnum):
    INET = "inet"
    INET6 = "inet6"


class InvalidSpec(ValueError):
    """A set spec ipset would refuse, or a header this module does not model."""


class InvalidEntry(ValueError):
    """An entry that is not in a set type's canonical form (or not valid at all)."""


class SaveParseError(ValueError):
    """`ipset save` printed a line this parser does not understand."""


@dataclass(frozen=True, slots=True)
class SetSpec:
    """What `create` is given. Sizes are stored as the kernel keeps them, so a spec read back
    from `ipset save` compares equal to the one that created the set."""

    name: str
    type: SetType
    family: Family | None = Family.INET
    hashsize: int = 1024
    maxelem: int = DEFAULT_MAXELEM
    port_range: tuple[int, int] = (0, 65535)
    comment: bool = False  # the per-entry comment extension

    def __post_init__(self) -> None:
        check_name(self.name)
        set_ = object.__setattr__  # normalise in place: frozen, but this is construction
        set_(self, "type", SetType(self.type))
        if self.type is SetType.BITMAP_PORT:
            # bitmap:port has no family (ipset prints none); the hash options do not apply.
            set_(self, "family", None)
            set_(self, "hashsize", 0)
            set_(self, "maxelem", 0)
            lo, hi = self.port_range
            if not 0 <= lo <= hi <= 65535:
                raise InvalidSpec(f"{self.name}: bad port range {lo}-{hi}")
            return
        if self.family is None:
            raise InvalidSpec(f"{self.name}: {self.type} needs a family")
        set_(self, "family", Family(self.family))
        set_(self, "port_range", (0, 0))
        if self.hashsize < 1 or self.maxelem < 1:
            raise InvalidSpec(f"{self.name}: hashsize and maxelem must be positive")
        set_(self, "hashsize", max(MIN_HASHSIZE, 1 << (self.hashsize - 1).bit_length()))

    @property
    def is_hash(self) -> bool:
        return self.type is not SetType.BITMAP_PORT

    def options(self) -> list[str]:
        """The create options after the type, as `ipset save` orders them."""
        if self.is_hash:
            assert self.family is not None
            opts = ["family", self.family.value, "hashsize", str(self.hashsize),
                    "maxelem", str(self.maxelem)]
        else:
            opts = ["range", f"{self.port_range[0]}-{self.port_range[1]}"]
        return [*opts, "comment"] if self.comment else opts

    def renamed(self, name: str) -> SetSpec:
        return SetSpec(name, self.type, self.family, self.hashsize, self.maxelem,
                       self.port_range, self.comment)


def check_name(name: str) -> str:
    if not 0 < len(name) <= MAX_NAME_LEN or not name.isascii() or not name.isprintable() \
            or any(c in name for c in " \"'"):
        raise InvalidSpec(f"bad ipset name {name!r} (1-{MAX_NAME_LEN} printable characters)")
    return name


def capacity(members: int) -> int:
    """The maxelem to create a hash set with for `members` entries: kube-proxy's 65536 up to
    half of it, past that the power of two at least twice the count. The headroom means a set
    that has just been resized takes years of ordinary growth, not one more Service, before it
    needs resizing again (a resize refills the whole set)."""
    return max(DEFAULT_MAXELEM, 1 << (2 * members - 1).bit_length())


def temp_name(name: str) -> str:
    """The name of the scratch set used to replace `name`: stable (a crashed run's leftover is
    found again), unique per set, and within the 31-character limit even for long names."""
    return "ipvsproxy-tmp-" + hashlib.sha1(name.encode()).hexdigest()[:16]


# ---- canonical entries -----------------------------------------------------------------------

def addr_text(addr: IPAddress) -> str:
    """An address as ipset prints it (glibc inet_ntop). Python compresses IPv6 the same way
    except for the two embedded-IPv4 forms, which inet_ntop prints dotted."""
    if addr.version == 4:
        return str(addr)
    p = addr.packed
    if p[:10] == bytes(10):
        if p[10:12] == b"\xff\xff":
            return "::ffff:" + str(IPv4Address(p[12:]))
        if p[10:12] == b"\0\0" and p[12:14] != b"\0\0":  # ::a.b.c.d, but ::1 and ::2 stay hex
            return "::" + str(IPv4Address(p[12:]))
    return str(addr)


def net_text(net: IPNetwork) -> str:
    """A network as ipset prints it: host bits cleared, and a full-length prefix left off."""
    if net.prefixlen == 0:
        raise InvalidEntry(f"{net}: ipset hash:*net* sets cannot hold a /0 (split it in two)")
    base = addr_text(net.network_address)
    return base if net.prefixlen == net.max_prefixlen else f"{base}/{net.prefixlen}"


def _proto_port(proto: str, port: int) -> str:
    p = proto.lower()
    if p not in PROTOCOLS:
        raise InvalidEntry(f"protocol {proto!r} is not one of {sorted(PROTOCOLS)}")
    if not 0 <= port <= 65535:
        raise InvalidEntry(f"port {port} out of range 0-65535")
    return f"{p}:{port}"


def ip_entry(ip: IPAddress) -> str:
    """hash:ip"""
    return addr_text(ip)


def ip_port_entry(ip: IPAddress, proto: str, port: int) -> str:
    """hash:ip,port"""
    return f"{addr_text(ip)},{_proto_port(proto, port)}"


def ip_port_ip_entry(ip: IPAddress, proto: str, port: int, ip2: IPAddress) -> str:
    """hash:ip,port,ip"""
    if ip.version != ip2.version:
        raise InvalidEntry(f"{ip} and {ip2} are of different families")
    return f"{addr_text(ip)},{_proto_port(proto, port)},{addr_text(ip2)}"


def ip_port_net_entry(ip: IPAddress, proto: str, port: int, net: IPNetwork) -> str:
    """hash:ip,port,net"""
    if ip.version != net.version:
        raise InvalidEntry(f"{ip} and {net} are of different families")
    return f"{addr_text(ip)},{_proto_port(proto, port)},{net_text(net)}"


def port_entry(port: int) -> str:
    """bitmap:port"""
    if not 0 <= port <= 65535:
        raise InvalidEntry(f"port {port} out of range 0-65535")
    return str(port)


def canonical_entry(spec: SetSpec, text: str) -> str:
    """Check untrusted entry text against a set's type and family; return its canonical form."""
    try:
        parts = text.split(",")
        want = {SetType.HASH_IP: 1, SetType.HASH_IP_PORT: 2, SetType.HASH_IP_PORT_IP: 3,
                SetType.HASH_IP_PORT_NET: 3, SetType.BITMAP_PORT: 1}[spec.type]
        if len(parts) != want:
            raise InvalidEntry(f"{spec.type} entries have {want} part(s)")
        if spec.type is SetType.BITMAP_PORT:
            port = int(parts[0])
            lo, hi = spec.port_range
            if not lo <= port <= hi:
                raise InvalidEntry(f"port {port} outside the set's range {lo}-{hi}")
            return port_entry(port)
        ip = ip_address(parts[0])
        if (ip.version == 6) != (spec.family is Family.INET6):
            raise InvalidEntry(f"{ip} is not of family {spec.family}")
        if spec.type is SetType.HASH_IP:
            return ip_entry(ip)
        proto, sep, port_s = parts[1].partition(":")
        if not sep:
            raise InvalidEntry("the port needs its protocol, e.g. tcp:80")
        if spec.type is SetType.HASH_IP_PORT:
            return ip_port_entry(ip, proto, int(port_s))
        if spec.type is SetType.HASH_IP_PORT_IP:
            return ip_port_ip_entry(ip, proto, int(port_s), ip_address(parts[2]))
        return ip_port_net_entry(ip, proto, int(port_s), ip_network(parts[2], strict=False))
    except InvalidEntry as exc:
        raise InvalidEntry(f"{spec.name}: entry {text!r}: {exc}") from None
    except ValueError as exc:
        raise InvalidEntry(f"{spec.name}: entry {text!r}: {exc}") from None


# ---- diff ------------------------------------------------------------------------------------

@dataclass(frozen=True, slots=True)
class MemberDelta:
    add: frozenset[str] = frozenset()
    delete: frozenset[str] = frozenset()

    def __bool__(self) -> bool:
        return bool(self.add or self.delete)


def diff_members(current: Set[str], desired: Set[str]) -> MemberDelta:
    """What turns `current` into `desired`. Exact only for canonical entries."""
    return MemberDelta(add=frozenset(desired - current), delete=frozenset(current - desired))


# ---- restore scripts -------------------------------------------------------------------------

# A cheap guard on the bulk path (full parsing would cost more than ipset itself): no entry may
# carry a space, quote or newline, which would smuggle a second command into the script.
_ENTRY_CHARS = re.compile(r"[0-9A-Za-z.:,/-]+")


def _checked(name: str, entries: Iterable[str]) -> list[str]:
    out = sorted(entries)  # deterministic scripts: readable errors, reproducible tests
    for e in out:
        if not _ENTRY_CHARS.fullmatch(e):
            raise InvalidEntry(f"{name}: entry {e!r} contains characters ipset entries never do")
    return out


def _comment(text: str) -> str:
    if len(text) > MAX_COMMENT_LEN or '"' in text or not text.isprintable():
        raise InvalidEntry(f"comment {text!r}: printable, no '\"', at most {MAX_COMMENT_LEN}")
    return f' comment "{text}"'


def render_create(spec: SetSpec) -> str:
    return " ".join(["create", spec.name, spec.type.value, *spec.options()])


def render_adds(name: str, entries: Iterable[str],
                comments: Mapping[str, str] | None = None) -> list[str]:
    check_name(name)
    if comments:
        return [f"add {name} {e}" + (_comment(comments[e]) if e in comments else "")
                for e in _checked(name, entries)]
    return [f"add {name} {e}" for e in _checked(name, entries)]


def render_dels(name: str, entries: Iterable[str]) -> list[str]:
    check_name(name)
    return [f"del {name} {e}" for e in _checked(name, entries)]


def render_delta(name: str, delta: MemberDelta,
                 comments: Mapping[str, str] | None = None) -> list[str]:
    # Deletes first, so a full set (maxelem) has room for the adds.
    return render_dels(name, delta.delete) + render_adds(name, delta.add, comments)


# ---- `ipset save` output ---------------------------------------------------------------------

_VALUE_OPTIONS = frozenset({"family", "hashsize", "maxelem", "range", "bucketsize", "initval",
                            "timeout", "netmask", "markmask", "size"})
_KERNEL_CHOSEN = frozenset({"bucketsize", "initval"})  # not part of what we ask for
_COMMENT = re.compile(r'(?:^| )comment "([^"]*)"')


@dataclass(frozen=True)
class SavedSet:
    """One set as `ipset save` printed it: any type, not only the ones this project creates."""

    name: str
    type_name: str
    options: tuple[str, ...]  # the create options exactly as printed
    members: frozenset[str]
    comments: Mapping[str, str] = field(default_factory=dict, compare=False)

    def spec(self) -> SetSpec:
        """The spec that creates this set; InvalidSpec if it uses features not modelled here."""
        try:
            stype = SetType(self.type_name)
        except ValueError:
            raise InvalidSpec(f"{self.name}: type {self.type_name} is not modelled") from None
        vals: dict[str, str] = {}
        flags: set[str] = set()
        toks = iter(self.options)
        for tok in toks:
            if tok in _VALUE_OPTIONS:
                vals[tok] = next(toks, "")
            else:
                flags.add(tok)
        extra = (set(vals) - _KERNEL_CHOSEN - {"family", "hashsize", "maxelem", "range"}) \
            | (flags - {"comment"})
        if extra:
            raise InvalidSpec(f"{self.name}: options {sorted(extra)} are not modelled")
        if stype is SetType.BITMAP_PORT:
            lo, _, hi = vals.get("range", "").partition("-")
            return SetSpec(self.name, stype, None, port_range=(int(lo), int(hi)),
                           comment="comment" in flags)
        return SetSpec(self.name, stype, Family(vals["family"]), int(vals["hashsize"]),
                       int(vals["maxelem"]), comment="comment" in flags)


def parse_save(text: str) -> dict[str, SavedSet]:
    """Parse `ipset save` (or `ipset list -o save`) output: every set, its header and members.

    Written for speed on large sets: one split per line, members collected per set in order."""
    heads: dict[str, tuple[str, tuple[str, ...]]] = {}
    members: dict[str, set[str]] = {}
    comments: dict[str, dict[str, str]] = {}
    cur_name, cur = "", set[str]()
    for lineno, line in enumerate(text.splitlines(), 1):
        if line.startswith("add "):
            parts = line.split(" ", 3)
            if len(parts) < 3:
                raise SaveParseError(f"line {lineno}: {line!r}")
            if parts[1] != cur_name:
                if parts[1] not in members:
                    raise SaveParseError(f"line {lineno}: member of unknown set: {line!r}")
                cur_name, cur = parts[1], members[parts[1]]
            cur.add(parts[2])
            if len(parts) == 4 and (m := _COMMENT.search(parts[3])):
                comments[cur_name][parts[2]] = m.group(1)
        elif line.startswith("create "):
            parts = line.split()
            if len(parts) < 3:
                raise SaveParseError(f"line {lineno}: {line!r}")
            heads[parts[1]] = (parts[2], tuple(parts[3:]))
            members[parts[1]], comments[parts[1]] = set(), {}
        elif line.strip():
            raise SaveParseError(f"line {lineno}: {line!r}")
    return {name: SavedSet(name, t, opts, frozenset(members[name]), comments[name])
            for name, (t, opts) in heads.items()}


# ---- tool output -----------------------------------------------------------------------------

_VERSION = re.compile(r"ipset v(\d+)\.(\d+)")
_LINE = re.compile(r"Error in line (\d+): ")
_PREFIX = re.compile(r"^ipset v[\d.]+: ")
_QUOTED = re.compile(r"'([^']+)'")


def parse_version(text: str) -> tuple[int, int]:
    """`ipset --version` -> (major, minor), e.g. "ipset v7.17, protocol version: 7" -> (7, 17)."""
    m = _VERSION.search(text)
    if not m:
        raise ValueError(f"not an ipset version string: {text.strip()!r}")
    return int(m.group(1)), int(m.group(2))


@dataclass(frozen=True, slots=True)
class RestoreFailure:
    line_no: int | None  # 1-based, in the script that was sent
    line: str | None
    set_name: str | None
    message: str  # ipset's own words


def _entry_parts(line: str) -> list[str]:
    words = line.split()
    return re.split(r"[,:/]", words[2]) if len(words) > 2 else []


def parse_restore_error(stderr: str, lines: Sequence[str]) -> RestoreFailure:
    """Name the line, the set and ipset's message of a failed `ipset restore`.

    ipset says "Error in line N" for most errors. A few (an out-of-range port) come from a code
    path that prints no line number, only the offending value in quotes; then the first line
    holding that value in its entry is the one."""
    msg_lines = [_PREFIX.sub("", s).strip() for s in stderr.strip().splitlines()]
    message = "; ".join(s for s in msg_lines if s) or "ipset restore failed (no message)"
    line_no: int | None = None
    if m := _LINE.search(message):
        line_no = int(m.group(1))
        message = message[m.end():]
    else:
        for token in _QUOTED.findall(message):
            line_no = next((i for i, s in enumerate(lines, 1) if token in _entry_parts(s)), None)
            if line_no is not None:
                break
    line = lines[line_no - 1] if line_no is not None and 0 < line_no <= len(lines) else None
    set_name = line.split()[1] if line and len(line.split()) > 1 else None
    return RestoreFailure(line_no, line, set_name, message)
