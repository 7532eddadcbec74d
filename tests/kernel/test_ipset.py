"""ipsets in a real kernel: every kube-proxy set type, bulk load and delta, atomic replace under
an iptables rule, refusal to destroy a referenced set, and the errors of a failed restore.

The oracle is the ipset tool itself (`ipset save`, `ipset list`), read through sh(), and for
the swap test the packet counter of an iptables rule that matches the set.
"""

from __future__ import annotations

import re
import socket
from collections.abc import Iterator
from ipaddress import IPv4Address, IPv6Address, ip_network

import pytest

from ipvsproxy.core.ipset_text import (
    Family,
    MemberDelta,
    SetSpec,
    SetType,
    ip_entry,
    ip_port_entry,
    ip_port_ip_entry,
    ip_port_net_entry,
    port_entry,
    temp_name,
)
from ipvsproxy.kernel.ipset import (
    IPSets,
    NoSuchSet,
    RestoreError,
    SetExists,
    SetInUse,
    SetMismatch,
    tool_version,
)
from tests.kernel.conftest import sh

pytestmark = [pytest.mark.kernel, pytest.mark.lab_cost(110)]  # seconds, balances lab guests

PREFIX = "IPVSPT-"  # every set these tests create; the fixture destroys them all


class Kernel:
    """The test's handle: the module under test plus bookkeeping for cleanup."""

    def __init__(self, sets: IPSets) -> None:
        self.sets = sets
        self.rules: list[str] = []

    def rule(self, name: str) -> str:
        spec = f"INPUT -m set --match-set {name} dst,dst -j ACCEPT"
        sh(f"iptables -A {spec}")
        self.rules.append(spec)
        return spec

    def unrule(self, spec: str) -> None:
        sh(f"iptables -D {spec}")
        self.rules.remove(spec)


@pytest.fixture
def k() -> Iterator[Kernel]:
    sh("modprobe -a ip_set xt_set", check=False)  # also autoloaded on first use
    with IPSets() as sets:
        kern = Kernel(sets)
        try:
            yield kern
        finally:
            for spec in list(kern.rules):
                kern.unrule(spec)
            for name in sets.names():
                if name.startswith(PREFIX) or name.startswith("ipvsproxy-tmp-"):
                    sets.destroy(name)
    assert not [n for n in sh("ipset list -n").split() if n.startswith(PREFIX)]


def saved_members(name: str) -> set[str]:
    """The oracle: members as `ipset save` prints them, parsed here without the module."""
    out = sh(f"ipset save {name}")
    return {line.split(" ", 3)[2] for line in out.splitlines() if line.startswith("add ")}


def header_line(name: str) -> str:
    return next(line for line in sh(f"ipset save {name}").splitlines()
                if line.startswith("create "))


def references(name: str) -> int:
    m = re.search(r"^References: (\d+)$", sh(f"ipset list -t {name}"), re.M)
    assert m, name
    return int(m.group(1))


V4A, V4B = IPv4Address("10.96.0.1"), IPv4Address("1.2.3.4")
V6A, V6B = IPv6Address("2001:db8::1"), IPv6Address("::ffff:1.2.3.4")
SAMPLES: dict[tuple[SetType, Family], list[str]] = {
    (SetType.HASH_IP_PORT, Family.INET): [
        ip_port_entry(V4A, "tcp", 80), ip_port_entry(V4A, "udp", 53),
        ip_port_entry(V4A, "sctp", 80)],
    (SetType.HASH_IP_PORT, Family.INET6): [
        ip_port_entry(V6A, "tcp", 443), ip_port_entry(V6B, "sctp", 9)],
    (SetType.HASH_IP_PORT_IP, Family.INET): [ip_port_ip_entry(V4A, "tcp", 80, V4A)],
    (SetType.HASH_IP_PORT_IP, Family.INET6): [ip_port_ip_entry(V6A, "tcp", 443, V6A)],
    (SetType.HASH_IP_PORT_NET, Family.INET): [
        ip_port_net_entry(V4B, "tcp", 80, ip_network("10.0.0.0/8")),
        ip_port_net_entry(V4B, "udp", 80, ip_network("10.1.2.3/32")),
        ip_port_net_entry(V4B, "sctp", 80, ip_network("10.1.2.0/24"))],
    (SetType.HASH_IP_PORT_NET, Family.INET6): [
        ip_port_net_entry(V6A, "udp", 53, ip_network("fd00::/8")),
        ip_port_net_entry(V6A, "tcp", 53, ip_network("fd00::7/128"))],
    (SetType.HASH_IP, Family.INET): [ip_entry(V4A), ip_entry(V4B)],
    (SetType.HASH_IP, Family.INET6): [ip_entry(V6A), ip_entry(V6B)],
    (SetType.BITMAP_PORT, Family.INET): [port_entry(0), port_entry(30080), port_entry(65535)],
    (SetType.BITMAP_PORT, Family.INET6): [port_entry(31000)],
}


def test_tool_is_at_least_6_0() -> None:
    assert tool_version() >= (6, 0)
    assert f"v{tool_version()[0]}.{tool_version()[1]}" in sh("ipset --version")


@pytest.mark.parametrize(("stype", "family"), list(SAMPLES), ids=lambda v: str(v))
def test_create_every_type_in_both_families(k: Kernel, stype: SetType, family: Family) -> None:
    name = f"{PREFIX}{stype.value.replace(':', '-').replace(',', '-')}-{family.value}"
    spec = SetSpec(name, stype, family, hashsize=200, maxelem=5000)
    k.sets.create(spec)
    if stype is SetType.BITMAP_PORT:
        assert header_line(name) == f"create {name} bitmap:port range 0-65535"
    else:  # the kernel rounds the hash size up to a power of two
        assert header_line(name).startswith(
            f"create {name} {stype.value} family {family.value} hashsize 256 maxelem 5000 ")
    assert k.sets.header(name).spec == spec
    assert k.sets.read(name).spec() == spec
    k.sets.create(spec)  # exists with the same spec: fine
    with pytest.raises(SetExists):
        k.sets.create(spec, exist_ok=False)
    # Members built by the module's builders are exactly what `ipset save` prints back.
    k.sets.add(name, SAMPLES[stype, family])
    assert saved_members(name) == set(SAMPLES[stype, family])
    assert k.sets.members(name) == set(SAMPLES[stype, family])
    assert name in k.sets.names()


def test_create_refuses_a_different_set_of_the_same_name(k: Kernel) -> None:
    k.sets.create(SetSpec(f"{PREFIX}M", SetType.HASH_IP_PORT))
    with pytest.raises(SetMismatch):
        k.sets.create(SetSpec(f"{PREFIX}M", SetType.HASH_IP))
    with pytest.raises(SetMismatch):
        k.sets.create(SetSpec(f"{PREFIX}M", SetType.HASH_IP_PORT, Family.INET6))
    with pytest.raises(SetMismatch):  # like `ipset create -exist`, maxelem counts
        k.sets.create(SetSpec(f"{PREFIX}M", SetType.HASH_IP_PORT, maxelem=10))


def test_comments(k: Kernel) -> None:
    spec = SetSpec(f"{PREFIX}C", SetType.BITMAP_PORT, comment=True)
    k.sets.create(spec)
    k.sets.add(spec.name, ["30080", "30081"], comments={"30080": "default/web:http"})
    assert 'add IPVSPT-C 30080 comment "default/web:http"' in sh(f"ipset save {spec.name}")
    saved = k.sets.read(spec.name)
    assert saved.members == {"30080", "30081"}
    assert saved.comments == {"30080": "default/web:http"}
    assert k.sets.header(spec.name).spec == spec


def bulk_entries(n: int, base: str = "10.0.0.0") -> list[str]:
    start = IPv4Address(base)
    return [ip_port_entry(start + i // 3, ("tcp", "udp", "sctp")[i % 3], 1000 + i % 20000)
            for i in range(n)]


def test_bulk_load_20000(k: Kernel) -> None:
    """20,000 entries (many netlink messages each way) by both bulk paths (scratch set + swap,
    and create + add), read back by the module and by `ipset save`. How fast they are next to
    `ipset restore`, at 50,000, is a benchmark figure (make bench), not a test."""
    n = 20_000
    entries = bulk_entries(n)
    spec = SetSpec(f"{PREFIX}BULK", SetType.HASH_IP_PORT, hashsize=16384, maxelem=131072)
    fresh = spec.renamed(f"{PREFIX}BULK2")
    k.sets.replace(spec, entries)
    k.sets.create(fresh)
    k.sets.add(fresh.name, entries)
    want = set(entries)
    assert len(want) == n
    assert k.sets.members(spec.name) == want
    assert saved_members(spec.name) == want
    assert saved_members(fresh.name) == want
    assert k.sets.header(spec.name).entries == k.sets.header(fresh.name).entries == n
    assert not k.sets.exists(temp_name(spec.name))


def test_bulk_delta_is_exact(k: Kernel) -> None:
    spec = SetSpec(f"{PREFIX}DELTA", SetType.HASH_IP_PORT, hashsize=4096, maxelem=65536)
    current = bulk_entries(10_000)
    k.sets.replace(spec, current)
    gone, new = set(current[:5000]), set(bulk_entries(5000, base="11.0.0.0"))
    delta = MemberDelta(
        add=frozenset(new | set(current[-500:])),  # 500 already present: -exist
        delete=frozenset(gone | set(bulk_entries(500, base="12.0.0.0"))),  # 500 never there
    )
    k.sets.apply(spec.name, delta)
    want = (set(current) - gone) | new
    assert saved_members(spec.name) == want

    # sync() diffs against what the kernel holds, changes only that, and then converges.
    want2 = set(list(want)[1000:]) | set(bulk_entries(300, base="13.0.0.0"))
    changed = k.sets.sync(spec, want2)
    assert (len(changed.add), len(changed.delete)) == (300, 1000)
    assert saved_members(spec.name) == want2
    assert not k.sets.sync(spec, want2)
    k.sets.delete(spec.name, want2)
    assert saved_members(spec.name) == set()


def rule_packets(name: str) -> int:
    for line in sh("iptables -L INPUT -v -n -x").splitlines():
        if f"match-set {name} " in line:
            return int(line.split()[0])
    raise AssertionError(f"no rule matching {name}")


def send_udp(port: int) -> None:
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        s.sendto(b"x", ("127.0.0.1", port))


def test_replace_swaps_under_a_live_iptables_rule(k: Kernel) -> None:
    sh("ip link set lo up")
    name = f"{PREFIX}SWAP"
    spec = SetSpec(name, SetType.HASH_IP_PORT)
    k.sets.replace(spec, [ip_port_entry(IPv4Address("127.0.0.1"), "udp", 40001)])
    rule = k.rule(name)
    assert references(name) == 1
    send_udp(40002)
    assert rule_packets(name) == 0
    send_udp(40001)
    assert rule_packets(name) == 1
    rules_before = sh("iptables -S INPUT")

    # New content and a bigger hash: the swap carries both in under the same name.
    bigger = SetSpec(name, SetType.HASH_IP_PORT, hashsize=8192, maxelem=100000)
    k.sets.replace(bigger, [ip_port_entry(IPv4Address("127.0.0.1"), "udp", 40002)])

    assert sh("iptables -S INPUT") == rules_before
    assert f"-A {rule}" in rules_before
    assert references(name) == 1
    assert k.sets.header(name).spec == bigger
    assert not k.sets.exists(temp_name(name))
    assert saved_members(name) == {"127.0.0.1,udp:40002"}
    sh("iptables -Z INPUT")
    send_udp(40001)
    assert rule_packets(name) == 0  # the old member no longer matches
    send_udp(40002)
    assert rule_packets(name) == 1  # the rule sees the new content


def test_replace_with_nothing_empties_the_set(k: Kernel) -> None:
    spec = SetSpec(f"{PREFIX}EMPTY", SetType.BITMAP_PORT)
    k.sets.replace(spec, ["30080"])
    k.sets.replace(spec, [])
    assert saved_members(spec.name) == set()
    assert not k.sets.exists(temp_name(spec.name))


def test_replace_refuses_another_type_and_leaves_the_set(k: Kernel) -> None:
    name = f"{PREFIX}TYPE"
    k.sets.replace(SetSpec(name, SetType.HASH_IP), ["10.0.0.1"])
    with pytest.raises(SetMismatch):
        k.sets.replace(SetSpec(name, SetType.HASH_IP_PORT), ["10.0.0.1,tcp:1"])
    with pytest.raises(SetMismatch):
        k.sets.replace(SetSpec(name, SetType.HASH_IP, Family.INET6), ["2001:db8::1"])
    assert saved_members(name) == {"10.0.0.1"}
    assert not k.sets.exists(temp_name(name))


def test_destroy_refuses_while_referenced(k: Kernel) -> None:
    name = f"{PREFIX}REF"
    k.sets.create(SetSpec(name, SetType.HASH_IP_PORT))
    rule = k.rule(name)
    with pytest.raises(SetInUse, match=name):
        k.sets.destroy(name)
    assert name in sh("ipset list -n").split()
    k.unrule(rule)
    assert references(name) == 0
    k.sets.destroy(name)
    assert name not in sh("ipset list -n").split()
    k.sets.destroy(name)  # already gone: fine by default
    with pytest.raises(NoSuchSet):
        k.sets.destroy(name, missing_ok=False)


def test_flush_and_missing_sets(k: Kernel) -> None:
    name = f"{PREFIX}FLUSH"
    k.sets.replace(SetSpec(name, SetType.HASH_IP, Family.INET6), ["2001:db8::1", "fd00::1"])
    assert k.sets.header(name).entries == 2
    k.sets.flush(name)
    assert saved_members(name) == set()
    assert k.sets.header(name).entries == 0
    missing = f"{PREFIX}NOPE"
    assert not k.sets.exists(missing)
    for call in (lambda: k.sets.read(missing), lambda: k.sets.flush(missing),
                 lambda: k.sets.header(missing), lambda: k.sets.swap(name, missing)):
        with pytest.raises(NoSuchSet):
            call()
    assert name in k.sets.read_all()


def test_failed_restore_names_set_line_and_message(k: Kernel) -> None:
    name, bm = f"{PREFIX}ERR", f"{PREFIX}ERRBM"
    k.sets.create(SetSpec(name, SetType.HASH_IP_PORT))
    k.sets.create(SetSpec(bm, SetType.BITMAP_PORT))

    # Line numbers count the script as sent: its line 1 is the set's own `create` line.
    # A parse error: ipset reports the line number itself.
    with pytest.raises(RestoreError) as exc:
        k.sets.add(name, ["10.0.0.1,tcp:80", "2001:db8::1,tcp:80", "10.0.0.2,tcp:80"])
    e = exc.value
    assert (e.set_name, e.line_no, e.line) == (name, 4, f"add {name} 2001:db8::1,tcp:80")
    assert "2001:db8::1" in e.message and "IPv4" in e.message
    assert name in str(e) and "line 4" in str(e)

    # An out-of-range port: ipset prints no line number; the module still finds it.
    with pytest.raises(RestoreError) as exc:
        k.sets.add(bm, ["1", "2", "70000"])
    e = exc.value
    assert (e.set_name, e.line_no, e.line) == (bm, 4, f"add {bm} 70000")
    assert "out of range" in e.message

    # A kernel-side error: a member that does not exist, deleted without -exist.
    lines = [f"add {name} 10.0.0.5,tcp:5", f"del {name} 10.0.0.6,tcp:6"]
    with pytest.raises(RestoreError) as exc:
        k.sets.restore(lines, exist=False)
    assert (exc.value.set_name, exc.value.line_no, exc.value.line) == (name, 2, lines[1])
    assert "it's not added" in exc.value.message

    with pytest.raises(NoSuchSet):
        k.sets.add(f"{PREFIX}NOPE", ["10.0.0.1,tcp:80"])

    # A failed replace leaves the live set as it was and no scratch set behind.
    k.sets.replace(SetSpec(name, SetType.HASH_IP_PORT), ["10.0.0.9,tcp:9"])
    with pytest.raises(RestoreError) as exc:
        k.sets.replace(SetSpec(name, SetType.HASH_IP_PORT), ["10.0.0.1,tcp:1", "10.0.0.300,tcp:1"])
    assert exc.value.set_name == name and exc.value.line_no == 3
    assert exc.value.line == f"add {name} 10.0.0.300,tcp:1"
    assert saved_members(name) == {"10.0.0.9,tcp:9"}
    assert not k.sets.exists(temp_name(name))
