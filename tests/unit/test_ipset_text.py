"""ipset text forms: specs, canonical entries, `ipset save` parsing, restore scripts, errors.

The expected strings below were printed by ipset 7.17 (`ipset save`) on a real kernel.
"""

from __future__ import annotations

from ipaddress import IPv4Address, IPv6Address, ip_address, ip_network

import pytest
from hypothesis import given
from hypothesis import strategies as st

from ipvsproxy.core.ipset_text import (
    Family,
    InvalidEntry,
    InvalidSpec,
    MemberDelta,
    SaveParseError,
    SetSpec,
    SetType,
    addr_text,
    canonical_entry,
    diff_members,
    ip_entry,
    ip_port_entry,
    ip_port_ip_entry,
    ip_port_net_entry,
    net_text,
    parse_restore_error,
    parse_save,
    parse_version,
    port_entry,
    render_adds,
    render_create,
    render_dels,
    render_delta,
    temp_name,
)

SAVE = """\
create A hash:ip,port family inet hashsize 1024 maxelem 65536 bucketsize 12 initval 0x383610ba
add A 10.96.0.1,udp:53
add A 10.96.0.1,tcp:80
add A 10.96.0.1,sctp:80
create B hash:ip,port,ip family inet6 hashsize 64 maxelem 1000 comment bucketsize 12 initval 0xa3
add B 2001:db8::1,tcp:443,2001:db8::1 comment "hello world"
create C hash:ip,port,net family inet hashsize 1024 maxelem 65536 bucketsize 12 initval 0xad7e2d6b
add C 1.2.3.4,tcp:80,10.0.0.0/8
add C 1.2.3.4,tcp:80,10.1.2.0/24
add C 1.2.3.4,tcp:80,10.1.2.3
create D hash:ip family inet6 hashsize 1024 maxelem 65536 bucketsize 12 initval 0xf65eb260
add D 2001:db8::1
add D ::ffff:1.2.3.4
create E bitmap:port range 0-65535
add E 0
add E 30080
create F bitmap:port range 0-65535 comment
add F 31000 comment "a b"
create EMPTY hash:ip family inet hashsize 1024 maxelem 65536 bucketsize 12 initval 0x1
"""


# ---- specs -----------------------------------------------------------------------------------

def test_spec_sizes_are_kept_as_the_kernel_keeps_them() -> None:
    assert SetSpec("S", SetType.HASH_IP, hashsize=100).hashsize == 128
    assert SetSpec("S", SetType.HASH_IP, hashsize=10).hashsize == 64
    assert SetSpec("S", SetType.HASH_IP, hashsize=1024).hashsize == 1024
    assert SetSpec("S", SetType.HASH_IP, hashsize=1025).hashsize == 2048


def test_bitmap_port_has_no_family_and_no_hash_options() -> None:
    spec = SetSpec("S", SetType.BITMAP_PORT, Family.INET6, hashsize=4096)
    assert (spec.family, spec.hashsize, spec.maxelem, spec.port_range) == (None, 0, 0, (0, 65535))
    assert spec == SetSpec("S", SetType.BITMAP_PORT)


@pytest.mark.parametrize("kw", [
    {"name": "X" * 32, "type": SetType.HASH_IP},
    {"name": "", "type": SetType.HASH_IP},
    {"name": "A B", "type": SetType.HASH_IP},
    {"name": "S", "type": SetType.HASH_IP, "family": None},
    {"name": "S", "type": SetType.HASH_IP, "maxelem": 0},
    {"name": "S", "type": SetType.BITMAP_PORT, "port_range": (10, 9)},
    {"name": "S", "type": SetType.BITMAP_PORT, "port_range": (0, 65536)},
])
def test_bad_specs_are_refused(kw: dict[str, object]) -> None:
    with pytest.raises(InvalidSpec):
        SetSpec(**kw)  # type: ignore[arg-type]


def test_a_31_character_name_is_allowed() -> None:
    assert SetSpec("KUBE-6-LOAD-BALANCER-SOURCE-CID", SetType.HASH_IP_PORT_NET).name


def test_render_create_matches_what_ipset_save_prints() -> None:
    saved = parse_save(SAVE)
    for name in "ABCDEF":
        spec = saved[name].spec()
        # ipset appends kernel-chosen options (bucketsize, initval) after ours.
        assert next(line for line in SAVE.splitlines()
                    if line.startswith(f"create {name} ")).startswith(render_create(spec))


def test_specs_read_back_from_save() -> None:
    saved = parse_save(SAVE)
    assert saved["A"].spec() == SetSpec("A", SetType.HASH_IP_PORT, Family.INET)
    assert saved["B"].spec() == SetSpec("B", SetType.HASH_IP_PORT_IP, Family.INET6, 64, 1000,
                                        comment=True)
    assert saved["E"].spec() == SetSpec("E", SetType.BITMAP_PORT)
    assert saved["F"].spec() == SetSpec("F", SetType.BITMAP_PORT, comment=True)


def test_spec_refuses_sets_it_does_not_model() -> None:
    saved = parse_save("create L list:set size 8\n"
                       "create T hash:ip family inet hashsize 1024 maxelem 65536 timeout 30\n")
    with pytest.raises(InvalidSpec, match="list:set"):
        saved["L"].spec()
    with pytest.raises(InvalidSpec, match="timeout"):
        saved["T"].spec()


def test_temp_names_are_short_stable_and_distinct() -> None:
    a, b = "KUBE-6-NODE-PORT-LOCAL-SCTP-HAS", "KUBE-6-NODE-PORT-LOCAL-SCTP-HAZ"
    assert temp_name(a) == temp_name(a) != temp_name(b)
    assert len(temp_name(a)) <= 31
    SetSpec(temp_name(a), SetType.HASH_IP)  # a valid name


# ---- canonical entries -----------------------------------------------------------------------

@pytest.mark.parametrize(("given_", "printed"), [
    # what ipset printed for each address it was given
    ("::ffff:1.2.3.4", "::ffff:1.2.3.4"),
    ("::1.2.3.4", "::1.2.3.4"),
    ("::0.1.0.0", "::0.1.0.0"),
    ("::ffff:0:0", "::ffff:0.0.0.0"),
    ("::ffff:0:102:304", "::ffff:0:102:304"),
    ("::1", "::1"),
    ("::2", "::2"),
    ("64:ff9b::1.2.3.4", "64:ff9b::102:304"),
    ("2001:db8:0:0:1:0:0:1", "2001:db8::1:0:0:1"),
    ("2001:0:0:1::1", "2001:0:0:1::1"),
    ("2001:DB8::0001", "2001:db8::1"),
    ("1::", "1::"),
    ("10.96.0.1", "10.96.0.1"),
])
def test_addresses_print_as_ipset_prints_them(given_: str, printed: str) -> None:
    assert addr_text(ip_address(given_)) == printed


@given(st.integers(min_value=0, max_value=2**128 - 1))
def test_ipv6_text_parses_back_to_the_same_address(n: int) -> None:
    a = IPv6Address(n)
    assert IPv6Address(addr_text(a)) == a


def test_networks_print_as_ipset_prints_them() -> None:
    assert net_text(ip_network("10.0.0.0/8")) == "10.0.0.0/8"
    assert net_text(ip_network("10.1.2.3/24", strict=False)) == "10.1.2.0/24"
    assert net_text(ip_network("10.1.2.3/32")) == "10.1.2.3"
    assert net_text(ip_network("2001:db8::1/128")) == "2001:db8::1"
    assert net_text(ip_network("2001:db8::/32")) == "2001:db8::/32"
    with pytest.raises(InvalidEntry, match="/0"):
        net_text(ip_network("0.0.0.0/0"))


def test_builders() -> None:
    v4, v6 = IPv4Address("10.96.0.1"), IPv6Address("2001:db8::1")
    assert ip_entry(v4) == "10.96.0.1"
    assert ip_port_entry(v4, "TCP", 80) == "10.96.0.1,tcp:80"
    assert ip_port_entry(v6, "sctp", 80) == "2001:db8::1,sctp:80"
    assert ip_port_ip_entry(v4, "udp", 53, v4) == "10.96.0.1,udp:53,10.96.0.1"
    assert ip_port_net_entry(IPv4Address("1.2.3.4"), "tcp", 80, ip_network("10.0.0.0/8")) \
        == "1.2.3.4,tcp:80,10.0.0.0/8"
    assert ip_port_net_entry(v6, "tcp", 443, ip_network("fd00::/8")) \
        == "2001:db8::1,tcp:443,fd00::/8"
    assert port_entry(30080) == "30080"


@pytest.mark.parametrize("call", [
    lambda: ip_port_entry(IPv4Address("1.1.1.1"), "icmp", 8),
    lambda: ip_port_entry(IPv4Address("1.1.1.1"), "tcp", 65536),
    lambda: ip_port_ip_entry(IPv4Address("1.1.1.1"), "tcp", 1, IPv6Address("::1")),
    lambda: ip_port_net_entry(IPv4Address("1.1.1.1"), "tcp", 1, ip_network("::/64")),
    lambda: port_entry(-1),
])
def test_builders_refuse_what_ipset_would(call: object) -> None:
    with pytest.raises(InvalidEntry):
        call()  # type: ignore[operator]


V4 = {t: SetSpec("S4", t, Family.INET) for t in SetType}
V6 = {t: SetSpec("S6", t, Family.INET6) for t in SetType}


@pytest.mark.parametrize(("spec", "text", "canon"), [
    (V4[SetType.HASH_IP], "10.0.0.1", "10.0.0.1"),
    (V6[SetType.HASH_IP], "2001:DB8:0::1", "2001:db8::1"),
    (V4[SetType.HASH_IP_PORT], "10.96.0.1,TCP:80", "10.96.0.1,tcp:80"),
    (V6[SetType.HASH_IP_PORT], "::ffff:102:304,sctp:9", "::ffff:1.2.3.4,sctp:9"),
    (V4[SetType.HASH_IP_PORT_IP], "10.0.0.1,tcp:80,10.0.0.1", "10.0.0.1,tcp:80,10.0.0.1"),
    (V6[SetType.HASH_IP_PORT_IP], "2001:db8::0001,tcp:443,2001:DB8:0::1",
     "2001:db8::1,tcp:443,2001:db8::1"),
    (V4[SetType.HASH_IP_PORT_NET], "1.2.3.4,tcp:80,10.1.2.3/24", "1.2.3.4,tcp:80,10.1.2.0/24"),
    (V4[SetType.HASH_IP_PORT_NET], "1.2.3.4,tcp:80,10.1.2.3/32", "1.2.3.4,tcp:80,10.1.2.3"),
    (V4[SetType.HASH_IP_PORT_NET], "1.2.3.4,tcp:80,10.1.2.3", "1.2.3.4,tcp:80,10.1.2.3"),
    (V6[SetType.HASH_IP_PORT_NET], "2001:db8::1,udp:53,fd00::1/8", "2001:db8::1,udp:53,fd00::/8"),
    (V4[SetType.BITMAP_PORT], "030080", "30080"),
])
def test_canonical_entry(spec: SetSpec, text: str, canon: str) -> None:
    assert canonical_entry(spec, text) == canon


@pytest.mark.parametrize(("spec", "text"), [
    (V4[SetType.HASH_IP], "2001:db8::1"),  # wrong family
    (V6[SetType.HASH_IP_PORT], "10.0.0.1,tcp:80"),
    (V4[SetType.HASH_IP_PORT], "10.0.0.1,80"),  # ipset would read tcp: not canonical
    (V4[SetType.HASH_IP_PORT], "10.0.0.1,icmp:8"),
    (V4[SetType.HASH_IP_PORT], "10.0.0.1,tcp:70000"),
    (V4[SetType.HASH_IP_PORT], "10.0.0.1"),
    (V4[SetType.HASH_IP_PORT_NET], "1.2.3.4,tcp:80,0.0.0.0/0"),
    (V4[SetType.HASH_IP_PORT_NET], "1.2.3.4,tcp:80,10.0.0.0/33"),
    (V4[SetType.BITMAP_PORT], "70000"),
    (SetSpec("B", SetType.BITMAP_PORT, port_range=(30000, 32767)), "80"),
    (V4[SetType.HASH_IP], "10.0.0.300"),
])
def test_canonical_entry_refuses(spec: SetSpec, text: str) -> None:
    with pytest.raises(InvalidEntry, match=spec.name):
        canonical_entry(spec, text)


# ---- diff and scripts ------------------------------------------------------------------------

def test_diff_members() -> None:
    d = diff_members({"a", "b", "c"}, {"b", "c", "d"})
    assert d == MemberDelta(add=frozenset({"d"}), delete=frozenset({"a"}))
    assert d
    assert not diff_members({"a"}, {"a"})


def test_restore_scripts_are_sorted_and_delete_first() -> None:
    delta = MemberDelta(add=frozenset({"10.0.0.2,tcp:80", "10.0.0.1,tcp:80"}),
                        delete=frozenset({"10.0.0.9,udp:53"}))
    assert render_delta("KUBE-CLUSTER-IP", delta) == [
        "del KUBE-CLUSTER-IP 10.0.0.9,udp:53",
        "add KUBE-CLUSTER-IP 10.0.0.1,tcp:80",
        "add KUBE-CLUSTER-IP 10.0.0.2,tcp:80",
    ]
    assert render_dels("S", []) == []


def test_comments_are_rendered_quoted_and_checked() -> None:
    assert render_adds("F", ["31000", "30080"], {"31000": "a b"}) == [
        "add F 30080", 'add F 31000 comment "a b"']
    with pytest.raises(InvalidEntry):
        render_adds("F", ["1"], {"1": 'x"y'})
    with pytest.raises(InvalidEntry):
        render_adds("F", ["1"], {"1": "x" * 256})


@pytest.mark.parametrize("evil", ["1.2.3.4\nflush KUBE-X", "1.2.3.4 comment x", "", '"1"'])
def test_entries_cannot_smuggle_commands_into_a_script(evil: str) -> None:
    with pytest.raises(InvalidEntry):
        render_adds("S", [evil])
    with pytest.raises(InvalidEntry):
        render_dels("S", [evil])


def test_script_set_names_are_checked() -> None:
    with pytest.raises(InvalidSpec):
        render_adds("A\nflush", ["1"])


# ---- parsing `ipset save` --------------------------------------------------------------------

def test_parse_save() -> None:
    saved = parse_save(SAVE)
    assert list(saved) == ["A", "B", "C", "D", "E", "F", "EMPTY"]
    assert saved["A"].members == {"10.96.0.1,udp:53", "10.96.0.1,tcp:80", "10.96.0.1,sctp:80"}
    assert saved["A"].type_name == "hash:ip,port"
    assert saved["B"].members == {"2001:db8::1,tcp:443,2001:db8::1"}
    assert saved["B"].comments == {"2001:db8::1,tcp:443,2001:db8::1": "hello world"}
    assert saved["C"].members == {"1.2.3.4,tcp:80,10.0.0.0/8", "1.2.3.4,tcp:80,10.1.2.0/24",
                                  "1.2.3.4,tcp:80,10.1.2.3"}
    assert saved["D"].members == {"2001:db8::1", "::ffff:1.2.3.4"}
    assert saved["E"].members == {"0", "30080"}
    assert saved["F"].comments == {"31000": "a b"}
    assert saved["EMPTY"].members == frozenset()
    assert saved["E"].options == ("range", "0-65535")


def test_parse_save_refuses_what_it_does_not_understand() -> None:
    with pytest.raises(SaveParseError, match="line 1"):
        parse_save("add X 1.2.3.4\n")
    with pytest.raises(SaveParseError, match="line 2"):
        parse_save("create X hash:ip family inet\nswap X Y\n")
    assert parse_save("") == {}


@given(st.sets(st.tuples(st.integers(0, 2**32 - 1), st.sampled_from(["tcp", "udp", "sctp"]),
                         st.integers(0, 65535)), max_size=50))
def test_rendered_entries_parse_back_exactly(raw: set[tuple[int, str, int]]) -> None:
    entries = {ip_port_entry(IPv4Address(a), p, port) for a, p, port in raw}
    spec = SetSpec("S", SetType.HASH_IP_PORT)
    text = "\n".join([render_create(spec), *render_adds("S", entries)])
    assert parse_save(text)["S"].members == entries


# ---- tool output -----------------------------------------------------------------------------

def test_parse_version() -> None:
    assert parse_version("ipset v7.17, protocol version: 7\n") == (7, 17)
    assert parse_version("ipset v6.38, protocol version: 6") == (6, 38)
    with pytest.raises(ValueError):
        parse_version("command not found")


def test_restore_error_with_a_line_number() -> None:
    lines = ["add A 10.96.0.2,tcp:80", "add A 10.96.0.300,tcp:80", "add A 10.0.0.3,tcp:80"]
    f = parse_restore_error("ipset v7.17: Error in line 2: Syntax error: cannot parse "
                            "10.96.0.300: resolving to IPv4 address failed\n", lines)
    assert (f.line_no, f.line, f.set_name) == (2, lines[1], "A")
    assert f.message == "Syntax error: cannot parse 10.96.0.300: resolving to IPv4 address failed"


def test_restore_error_without_a_line_number_finds_the_quoted_value() -> None:
    # ipset prints no line number for an out-of-range port; the value it quotes names the line.
    lines = ["add E 1", "add E 2", "add E 70000", "add E 3"]
    stderr = ("ipset v7.17: Syntax error: '70000' is out of range 0-65535\n"
              "Syntax error: 'tcp' is invalid as number\ncannot parse '70000' as a tcp port\n")
    f = parse_restore_error(stderr, lines)
    assert (f.line_no, f.line, f.set_name) == (3, "add E 70000", "E")
    assert f.message.startswith("Syntax error: '70000' is out of range 0-65535; ")


def test_restore_error_that_names_no_line() -> None:
    f = parse_restore_error("ipset v7.17: Kernel error received: Operation not permitted\n",
                            ["add A 1.1.1.1"])
    assert (f.line_no, f.line, f.set_name) == (None, None, None)
    assert f.message == "Kernel error received: Operation not permitted"
    assert parse_restore_error("", []).message == "ipset restore failed (no message)"
