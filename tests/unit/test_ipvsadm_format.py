"""Golden tests of the ipvsadm 1.31 renderer (ipvsproxy.core.ipvsadm_format / ipvsadm_conn).

Expected texts are worked by hand from ipvsadm.c's printf formats; the ones marked "oracle" were
also printed by /usr/sbin/ipvsadm in the lab kernel for the same table. Lines keep ipvsadm's
trailing padding, so the strings below end some lines in spaces on purpose.
"""

from __future__ import annotations

from ipaddress import IPv4Address, IPv6Address, ip_address

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ipvsproxy.commands.ls import IpvsadmExit, parse_request, parse_service
from ipvsproxy.core.ipvs import (
    AF_INET6,
    SVC_F_ONEPACKET,
    SVC_F_PERSISTENT,
    SVC_F_SCHED1,
    SVC_F_SCHED2,
    SVC_F_SCHED3,
    DestKey,
    Fwd,
    IpvsInfo,
    ObservedDest,
    ObservedService,
    Protocol,
    RealServer,
    ServiceKey,
    Stats,
    Timeouts,
    VirtualServer,
)
from ipvsproxy.core.ipvsadm_conn import fgets_chunks, list_conn
from ipvsproxy.core.ipvsadm_format import (
    FMT_EXACT,
    FMT_NOSORT,
    FMT_NUMERIC,
    FMT_PERSISTENTCONN,
    FMT_RATE,
    FMT_RULE,
    FMT_STATS,
    FMT_THRESHOLDS,
    FMT_TUN_INFO,
    NO_RESOLVER,
    inet_ntop,
    largenum,
    list_all,
    list_service,
    list_timeout,
    sched_flags,
)
from ipvsproxy.core.ipvsadm_sort import cmp_services, glibc_qsort

TCP, UDP, SCTP = Protocol.TCP, Protocol.UDP, Protocol.SCTP
INFO = IpvsInfo((1 << 16) | (2 << 8) | 1, 4096)
N = FMT_NUMERIC


def svc(key: ServiceKey, sched: str = "rr", flags: int = 0, timeout: int = 0, netmask: int = -1,
        dests: tuple[ObservedDest, ...] = (), stats: Stats | None = None,
        pe: str = "") -> ObservedService:
    return ObservedService(VirtualServer(key, sched, flags, timeout, netmask, pe), dests,
                           stats or Stats())


def dest(addr: str, port: int, fwd: Fwd = Fwd.MASQ, weight: int = 1, active: int = 0,
         inact: int = 0, persist: int = 0, stats: Stats | None = None, **kw: int) -> ObservedDest:
    return ObservedDest(RealServer(DestKey(ip_address(addr), port), fwd, weight, **kw),
                        active, inact, persist, stats or Stats())


def printf(fmt: str, *args: object) -> str:
    """C's printf for the formats copied from ipvsadm.c (%-28s, %8llu ...; no ll in Python)."""
    return fmt.replace("ll", "") % args


def inet(proto: Protocol, addr: str, port: int) -> ServiceKey:
    return ServiceKey.inet(proto, ip_address(addr), port)


class HostsResolver:
    """A fixed /etc/hosts and /etc/services, standing in for the C library's lookups."""

    def __init__(self, hosts: dict[str, str], services: dict[tuple[int, str], str]) -> None:
        self.hosts = hosts
        self.services = services

    def host(self, addr: IPv4Address | IPv6Address) -> str | None:
        return self.hosts.get(str(addr))

    def service(self, port: int, proto: str) -> str | None:
        return self.services.get((port, proto))


# A table first created with ipvsadm in the lab; its -Ln, --tun-info, -S -n and --nosort
# outputs are the oracle's. The kernel dump order (for --nosort) is the one the lab showed.
LAB_TABLE = [
    svc(inet(UDP, "203.0.113.1", 53), flags=SVC_F_ONEPACKET),
    svc(inet(TCP, "10.0.0.1", 80), "wlc", dests=(
        dest("10.1.0.2", 80, Fwd.TUNNEL, 1, tun_type=1, tun_port=6080, tun_flags=1),
        dest("192.168.5.5", 80, Fwd.ROUTE, 3),
        dest("10.1.0.1", 8080, Fwd.MASQ, 100000))),
    svc(inet(TCP, "192.168.1.10", 80), "mh", SVC_F_SCHED2 | SVC_F_PERSISTENT, 300, 0xFFFF0000),
    svc(inet(TCP, "fd00::1", 443)),
    svc(ServiceKey.mark(2147483649)),
    svc(ServiceKey.mark(7), "sh", SVC_F_SCHED3),
    svc(ServiceKey.mark(8, AF_INET6), flags=SVC_F_PERSISTENT, timeout=60, netmask=64),
    svc(ServiceKey.mark(4294967295)),
]
HEAD = ("IP Virtual Server version 1.2.1 (size=4096)\n"
        "Prot LocalAddress:Port Scheduler Flags\n"
        "  -> RemoteAddress:Port           Forward Weight ActiveConn InActConn\n")

LAB_LN = HEAD + """\
FWM  -1 rr
TCP  192.168.1.10:80 mh (mh-port) persistent 300 mask 255.255.0.0
TCP  10.0.0.1:80 wlc
  -> 192.168.5.5:80               Route   3      0          0         
  -> 10.1.0.1:8080                Masq    100000 0          0         
  -> 10.1.0.2:80                  Tunnel  1      0          0         
UDP  203.0.113.1:53 rr ops
TCP  [fd00::1]:443 rr
FWM  7 sh ()
FWM  8 IPv6 rr persistent 60 mask 64
FWM  -2147483647 rr
"""  # noqa: W291

LAB_TUN = """\
IP Virtual Server version 1.2.1 (size=4096)
Prot LocalAddress:Port Scheduler Flags
  -> RemoteAddress:Port           Forward TunnelInfo    Weight ActiveConn InActConn
FWM  -1 rr
TCP  192.168.1.10:80 mh (mh-port) persistent 300 mask 255.255.0.0
TCP  10.0.0.1:80 wlc
  -> 192.168.5.5:80               Route   n/a           3      0          0         
  -> 10.1.0.1:8080                Masq    n/a           100000 0          0         
  -> 10.1.0.2:80                  Tunnel  gue:6080:+c   1      0          0         
UDP  203.0.113.1:53 rr ops
TCP  [fd00::1]:443 rr
FWM  7 sh ()
FWM  8 IPv6 rr persistent 60 mask 64
FWM  -2147483647 rr
"""  # noqa: W291

LAB_SAVE = """\
-A -f -1 -s rr
-A -t 192.168.1.10:80 -s mh -p 300 -M 255.255.0.0 -b mh-port
-A -t 10.0.0.1:80 -s wlc
-a -t 10.0.0.1:80 -r 192.168.5.5:80 -g -w 3
-a -t 10.0.0.1:80 -r 10.1.0.1:8080 -m -w 100000
-a -t 10.0.0.1:80 -r 10.1.0.2:80 -i -w 1 --tun-type gue --tun-port 6080 --tun-csum
-A -u 203.0.113.1:53 -s rr -o
-A -t [fd00::1]:443 -s rr
-A -f 7 -s sh -b 
-A -f 8 -6 -s rr -p 60 -M 64
-A -f -2147483647 -s rr
"""  # noqa: W291

LAB_SAVE_NAMES = LAB_SAVE.replace(":80 ", ":http ").replace(":8080 ", ":http-alt ").replace(
    ":53 ", ":domain ").replace(":443 ", ":https ")

LAB_NOSORT = HEAD + """\
UDP  203.0.113.1:53 rr ops
TCP  10.0.0.1:80 wlc
  -> 10.1.0.2:80                  Tunnel  1      0          0         
  -> 192.168.5.5:80               Route   3      0          0         
  -> 10.1.0.1:8080                Masq    100000 0          0         
TCP  192.168.1.10:80 mh (mh-port) persistent 300 mask 255.255.0.0
TCP  [fd00::1]:443 rr
FWM  -2147483647 rr
FWM  7 sh ()
FWM  8 IPv6 rr persistent 60 mask 64
FWM  -1 rr
"""  # noqa: W291

SERVICES = HostsResolver({}, {(80, "tcp"): "http", (8080, "tcp"): "http-alt",
                              (53, "udp"): "domain", (443, "tcp"): "https"})


@pytest.mark.parametrize(("fmt", "resolver", "expected"), [
    (N, None, LAB_LN),
    (N | FMT_TUN_INFO, None, LAB_TUN),
    (N | FMT_RULE, None, LAB_SAVE),
    (FMT_RULE, SERVICES, LAB_SAVE_NAMES),
    (N | FMT_NOSORT, None, LAB_NOSORT),
], ids=["Ln", "tun-info", "S-n", "S", "nosort"])
def test_lab_table_as_the_oracle_printed_it(fmt: int, resolver: HostsResolver | None,
                                            expected: str) -> None:
    args = (resolver,) if resolver else ()
    assert list_all(INFO, LAB_TABLE, fmt, *args) == expected


def test_empty_table() -> None:
    assert list_all(INFO, [], N) == HEAD
    assert list_all(INFO, [], N | FMT_RULE) == ""
    assert list_all(INFO, [], N | FMT_STATS) == (
        "IP Virtual Server version 1.2.1 (size=4096)\n"
        "Prot LocalAddress:Port               Conns   InPkts  OutPkts  InBytes OutBytes\n"
        "  -> RemoteAddress:Port\n")


def test_address_comparison_quirk_sorts_192_168_and_203_0_before_10() -> None:
    # ntohl(a) - ntohl(b) stored in an int: 192.168.1.10 - 10.96.0.1 > 2^31, so negative.
    keys = [inet(TCP, "10.96.0.1", 443), inet(TCP, "192.168.1.10", 30080),
            inet(TCP, "10.96.0.10", 53), inet(TCP, "203.0.113.10", 443),
            inet(UDP, "10.96.0.10", 53), ServiceKey.mark(3754)]
    out = list_all(INFO, [svc(k) for k in keys], N)
    assert out == HEAD + (
        "TCP  192.168.1.10:30080 rr\n"
        "TCP  203.0.113.10:443 rr\n"
        "TCP  10.96.0.1:443 rr\n"
        "TCP  10.96.0.10:53 rr\n"
        "UDP  10.96.0.10:53 rr\n"
        "FWM  3754 rr\n")


def test_merge_sort_order_with_a_non_transitive_comparator() -> None:
    # a=10.0.0.1 < b=100.0.0.1 < c=200.0.0.1 pairwise, yet c < a (difference > 2^31).
    a, b, c = (svc(inet(TCP, x, 80)) for x in ("10.0.0.1", "100.0.0.1", "200.0.0.1"))
    assert cmp_services(a, b) < 0 and cmp_services(b, c) < 0 and cmp_services(c, a) < 0
    # glibc msort: [c | a, b] -> left [c], right [a, b] (sorted: a, b); merge c vs a: c <= a.
    assert glibc_qsort([c, a, b], cmp_services) == [c, a, b]
    # [a | b, c]: right half [b, c]; merge a vs b: a first; then b, c.
    assert glibc_qsort([a, b, c], cmp_services) == [a, b, c]
    # [b | c, a] -> right [c, a] sorts to [c, a]; merge b vs c: b; then c, a.
    assert glibc_qsort([b, c, a], cmp_services) == [b, c, a]


def test_dests_sort_by_the_first_entrys_family() -> None:
    # An IPv4 service with an IPv6 tunnel destination (lab oracle: [fd00::5] came first).
    s = svc(inet(TCP, "10.0.0.1", 80), dests=(
        dest("10.1.0.3", 80, Fwd.TUNNEL, tun_type=2, tun_flags=1),
        dest("fd00::5", 80, Fwd.TUNNEL),
        dest("10.1.0.7", 80, Fwd.MASQ, 2147483647, u_threshold=2147483647, l_threshold=5)))
    assert list_service(s, N | FMT_TUN_INFO) == (
        "Prot LocalAddress:Port Scheduler Flags\n"
        "  -> RemoteAddress:Port           Forward TunnelInfo    Weight ActiveConn InActConn\n"
        "TCP  10.0.0.1:80 rr\n"
        "  -> [fd00::5]:80                 Tunnel  ipip          1      0          0         \n"
        "  -> 10.1.0.3:80                  Tunnel  gre:+c        1      0          0         \n"
        + printf("  -> %-28s %-7s %-13s %-6d %-10u %-10u\n", "10.1.0.7:80", "Masq", "n/a",
                 2147483647, 0, 0))
    assert list_service(s, N | FMT_THRESHOLDS).splitlines()[-1] == (
        "  -> 10.1.0.7:80                  2147483647 5          0          0         ")
    assert list_service(s, N | FMT_RULE) == (
        "-A -t 10.0.0.1:80 -s rr\n"
        "-a -t 10.0.0.1:80 -r [fd00::5]:80 -i -w 1 --tun-type ipip\n"
        "-a -t 10.0.0.1:80 -r 10.1.0.3:80 -i -w 1 --tun-type gre --tun-csum\n"
        "-a -t 10.0.0.1:80 -r 10.1.0.7:80 -m -w 2147483647\n")


@pytest.mark.parametrize(("value", "normal", "exact"), [
    (0, "        0", "        0"),
    (99_999_999, " 99999999", " 99999999"),
    (100_000_000, "  100000K", " 100000000"),
    (999_999_999, "  999999K", " 999999999"),
    (1_000_000_000, "    1000M", " 1000000000"),
    (99_999_999_999, "   99999M", " 99999999999"),
    (100_000_000_000, "     100G", " 100000000000"),
    (99_999_999_999_999, "   99999G", " 99999999999999"),
    (100_000_000_000_000, "     100T", " 100000000000000"),
    (2**64 - 1, "18446744T", " 18446744073709551615"),
])
def test_largenum(value: int, normal: str, exact: str) -> None:
    assert largenum(value, 0) == normal
    assert largenum(value, FMT_EXACT) == exact


BIG = Stats(1811023, 151204332, 148877201, 21333222111, 190331442987, 12, 4410, 4301, 612002,
            8120455)
HALF = Stats(905511, 75602166, 74438600, 10666611055, 95165721493, 6, 2205, 2150,
             306001, 123456789)


def _stats_table() -> list[ObservedService]:
    return [svc(inet(TCP, "203.0.113.10", 443), "mh", SVC_F_SCHED1 | SVC_F_SCHED2, stats=BIG,
                dests=(dest("10.244.1.20", 443, stats=HALF),))]


def test_stats_human_and_exact() -> None:
    assert list_all(INFO, _stats_table(), N | FMT_STATS) == (
        "IP Virtual Server version 1.2.1 (size=4096)\n"
        "Prot LocalAddress:Port               Conns   InPkts  OutPkts  InBytes OutBytes\n"
        "  -> RemoteAddress:Port\n"
        "TCP  203.0.113.10:443              1811023  151204K  148877K   21333M     190G\n"
        "  -> 10.244.1.20:443                905511 75602166 74438600   10666M   95165M\n")
    assert list_all(INFO, _stats_table(), N | FMT_STATS | FMT_EXACT).splitlines()[3:] == [
        "TCP  203.0.113.10:443              1811023 151204332 148877201 21333222111 "
        "190331442987",
        "  -> 10.244.1.20:443                905511 75602166 74438600 10666611055 95165721493"]


def test_rate_dest_line_prints_cps_pps_unabridged() -> None:
    assert list_all(INFO, _stats_table(), N | FMT_RATE) == (
        "IP Virtual Server version 1.2.1 (size=4096)\n"
        "Prot LocalAddress:Port                 CPS    InPPS   OutPPS    InBPS   OutBPS\n"
        "  -> RemoteAddress:Port\n"
        "TCP  203.0.113.10:443                   12     4410     4301   612002  8120455\n"
        "  -> 10.244.1.20:443                     6     2205     2150   306001  123456K\n")
    # --stats wins over --rate, --rate over --thresholds (print_title's if/else chain).
    assert list_all(INFO, _stats_table(), N | FMT_STATS | FMT_RATE) == list_all(
        INFO, _stats_table(), N | FMT_STATS)


def test_thresholds_and_persistent_conn() -> None:
    s = svc(inet(UDP, "10.96.0.10", 53), "lblc", SVC_F_PERSISTENT, 10800, dests=(
        dest("10.244.1.5", 53, weight=7, active=3, inact=4, persist=5, u_threshold=100,
             l_threshold=50),))
    assert list_service(s, N | FMT_THRESHOLDS) == (
        "Prot LocalAddress:Port            Uthreshold Lthreshold ActiveConn InActConn \n"
        "  -> RemoteAddress:Port\n"
        "UDP  10.96.0.10:53 lblc persistent 10800\n"
        + printf("  -> %-28s %-10u %-10u %-10u %-10u\n", "10.244.1.5:53", 100, 50, 3, 4))
    assert list_service(s, N | FMT_PERSISTENTCONN) == (
        "Prot LocalAddress:Port            Weight    PersistConn ActiveConn InActConn \n"
        "  -> RemoteAddress:Port\n"
        "UDP  10.96.0.10:53 lblc persistent 10800\n"
        + printf("  -> %-28s %-9u %-11u %-10u %-10u\n", "10.244.1.5:53", 7, 5, 3, 4))


@pytest.mark.parametrize(("sched", "flags", "text"), [
    ("sh", SVC_F_SCHED1 | SVC_F_SCHED2, "sh-fallback,sh-port"),
    ("sh", SVC_F_SCHED2, "sh-port"),
    ("mh", SVC_F_SCHED1, "mh-fallback"),
    ("mh", SVC_F_SCHED3, ""),
    ("wlc", SVC_F_SCHED1 | SVC_F_SCHED2 | SVC_F_SCHED3, "flag-1,flag-2,flag-3"),
    ("rr", SVC_F_SCHED2, "flag-2"),
])
def test_sched_flags(sched: str, flags: int, text: str) -> None:
    assert sched_flags(sched, flags) == text
    line = list_service(svc(inet(TCP, "1.2.3.4", 80), sched, flags), N).splitlines()[2]
    assert line == f"TCP  1.2.3.4:80 {sched} ({text})"
    rule = list_service(svc(inet(TCP, "1.2.3.4", 80), sched, flags), N | FMT_RULE)
    assert rule == f"-A -t 1.2.3.4:80 -s {sched} -b {text}\n"


@pytest.mark.parametrize(("service", "listed", "saved"), [
    (svc(inet(UDP, "10.0.0.2", 5060), flags=SVC_F_PERSISTENT, timeout=30, pe="sip"),
     "UDP  10.0.0.2:5060 rr persistent 30 pe sip", "-A -u 10.0.0.2:5060 -s rr -p 30 --pe sip"),
    (svc(inet(UDP, "10.0.0.3", 5060), pe="sip"),  # pe listed only when persistent
     "UDP  10.0.0.3:5060 rr", "-A -u 10.0.0.3:5060 -s rr --pe sip"),
    (svc(inet(TCP, "10.0.0.4", 0), flags=SVC_F_PERSISTENT, timeout=30, netmask=0xFF00FF00),
     "TCP  10.0.0.4:0 rr persistent 30 mask 255.0.255.0",
     "-A -t 10.0.0.4:0 -s rr -p 30 -M 255.0.255.0"),
    (svc(inet(TCP, "10.0.0.4", 1), flags=SVC_F_PERSISTENT, timeout=30, netmask=0xFFFFFFFF),
     "TCP  10.0.0.4:1 rr persistent 30", "-A -t 10.0.0.4:1 -s rr -p 30"),
    (svc(inet(SCTP, "fd00::9", 9), "fo", SVC_F_PERSISTENT | SVC_F_ONEPACKET, 86400 * 31, 48),
     "SCTP [fd00::9]:9 fo persistent 2678400 mask 48 ops",
     "-A --sctp-service [fd00::9]:9 -s fo -p 2678400 -M 48 -o"),
    (svc(inet(TCP, "fd00::9", 9), flags=SVC_F_PERSISTENT, timeout=5, netmask=128),
     "TCP  [fd00::9]:9 rr persistent 5", "-A -t [fd00::9]:9 -s rr -p 5"),
    (svc(ServiceKey.mark(1, AF_INET6), "nq", SVC_F_ONEPACKET),
     "FWM  1 IPv6 nq ops", "-A -f 1 -6 -s nq -o"),
])
def test_service_line_options(service: ObservedService, listed: str, saved: str) -> None:
    assert list_service(service, N).splitlines()[2] == listed
    assert list_service(service, N | FMT_RULE) == saved + "\n"


@pytest.mark.parametrize(("addr", "text"), [
    ("::1", "::1"), ("::", "::"), ("fd00::1", "fd00::1"), ("1::", "1::"),
    ("::1.2.3.4", "::1.2.3.4"), ("::ffff:1.2.3.4", "::ffff:1.2.3.4"),
    ("::fffe:1.2.3.4", "::fffe:102:304"), ("1:0:2:0:3:0:4:0", "1:0:2:0:3:0:4:0"),
    ("1:0:0:2:0:0:3:4", "1::2:0:0:3:4"), ("2001:db8:0:0:1:0:0:1", "2001:db8::1:0:0:1"),
    ("0:0:1::", "0:0:1::"), ("1:0:0:1:0:0:0:1", "1:0:0:1::1"),
])
def test_inet_ntop_is_glibcs(addr: str, text: str) -> None:
    assert inet_ntop(IPv6Address(addr)) == text


def test_names_cut_at_33_and_28_and_59() -> None:
    long_v4 = "a-very-long-host-name.example.internal"
    long_v6 = "an-even-longer-ipv6-host-name.cluster.example.internal"
    r = HostsResolver({"10.0.0.1": long_v4, "10.0.0.2": long_v4, "fd00::1": long_v6,
                       "fd00::2": long_v6}, {(80, "tcp"): "http"})
    s4 = svc(inet(TCP, "10.0.0.1", 80), dests=(dest("10.0.0.2", 8080),))
    s6 = svc(inet(TCP, "fd00::1", 80), dests=(dest("fd00::2", 80),))
    out = list_all(INFO, [s4, s6], 0, r)
    v6name = f"[{long_v6}]:http"[:59]  # addrport_to_anyname's 60-byte buffer
    assert len(v6name) == 59
    assert out == HEAD + (
        f"TCP  {long_v4}:http"[:33] + " rr\n"  # svc_name[33] = '\\0'
        + printf("  -> %-28s %-7s %-6d %-10u %-10u\n", f"{long_v4}:8080"[:28], "Masq", 1, 0, 0)
        + f"TCP  {v6name} rr\n"
        + printf("  -> %-28s %-7s %-6d %-10u %-10u\n", v6name, "Masq", 1, 0, 0))
    assert out.splitlines()[3] == "TCP  a-very-long-host-name.exampl rr"
    assert list_all(INFO, [s4], FMT_RULE, r) == (
        f"-A -t {long_v4}:http -s rr\n-a -t {long_v4}:http -r {long_v4}:8080 -m -w 1\n")


def test_fwmark_dests_have_numeric_ports_and_udp_uses_udp_names() -> None:
    r = HostsResolver({}, {(53, "udp"): "domain", (53, "tcp"): "domain-tcp",
                           (5060, "sctp"): "sip"})
    fwm = svc(ServiceKey.mark(5), dests=(dest("10.0.0.9", 53),))
    udp = svc(inet(UDP, "10.0.0.8", 53), dests=(dest("10.0.0.9", 53),))
    sctp = svc(inet(SCTP, "10.0.0.7", 5060))
    assert list_all(INFO, [fwm, udp, sctp], FMT_RULE, r) == (
        "-A -u 10.0.0.8:domain -s rr\n"
        "-a -u 10.0.0.8:domain -r 10.0.0.9:domain -m -w 1\n"
        "-A --sctp-service 10.0.0.7:sip -s rr\n"
        "-A -f 5 -s rr\n"
        "-a -f 5 -r 10.0.0.9:53 -m -w 1\n")


def test_kubernetes_names_are_appended_only_when_given() -> None:
    k = inet(TCP, "10.96.0.1", 443)
    table = [svc(k, dests=(dest("192.168.1.10", 6443),))]
    out = list_all(INFO, table, N, names={k: "default/kubernetes:https"})
    assert out.splitlines()[3] == "TCP  10.96.0.1:443 rr  default/kubernetes:https"
    assert list_all(INFO, table, N, names={}) == list_all(INFO, table, N)


def test_timeout_and_version_line() -> None:
    assert list_timeout(Timeouts(900, 120, 300)) == "Timeout (tcp tcpfin udp): 900 120 300\n"
    assert list_all(IpvsInfo((1 << 16) | (3 << 8) | 7, 1 << 20), [], N).splitlines()[0] == (
        "IP Virtual Server version 1.3.7 (size=1048576)")


def test_unknown_forwarding_and_tunnel_codes_print_like_glibc() -> None:
    s = svc(inet(TCP, "1.1.1.1", 1), dests=(
        dest("2.2.2.2", 1, Fwd.LOCALNODE), dest("2.2.2.3", 1, Fwd.BYPASS),
        dest("2.2.2.4", 1, Fwd.TUNNEL, tun_type=7)))
    assert list_service(s, N).splitlines()[3:] == [
        "  -> 2.2.2.2:1                    Local   1      0          0         ",
        "  -> 2.2.2.3:1                    (null)  1      0          0         ",
        "  -> 2.2.2.4:1                    Tunnel  1      0          0         "]
    assert list_service(s, N | FMT_RULE).splitlines()[1:] == [
        "-a -t 1.1.1.1:1 -r 2.2.2.2:1 -g -w 1", "-a -t 1.1.1.1:1 -r 2.2.2.3:1 (null) -w 1",
        "-a -t 1.1.1.1:1 -r 2.2.2.4:1 -i -w 1"]


# ------------------------------------------------------------------------------ ipvsadm -c

PROC_HEAD = "Pro FromIP   FPrt ToIP     TPrt DestIP   DPrt State       Expires PEName PEData\n"
PROC = PROC_HEAD + (
    "TCP 0A4D0064 EB58 0A4D0064 0050 0A4D0102 1F90 CLOSE             8\n"
    "TCP 0A0001FE D1A2 0A600001 01BB 0A0A0A0A 01BB ESTABLISHED     899\n"
    "UDP fd00:0000:0000:0000:0000:0000:0000:0009 0035 fd00:0000:0000:0000:0000:0000:0000:0001"
    " 0035 fd00:0000:0000:0000:0000:0000:0000:0002 0035 UDP             299\n"
    "UDP 0A000002 13C4 0A000001 13C4 0A000003 13C4 UDP              59 sip 3ec5a2@host\n"
    "TCP 0A000002 13C4 0A000001 13C4 2001:0db8:0000:0000:0000:0000:0000:0001 13C4 NONE"
    "          6000\n")


def test_connections_numeric() -> None:
    res = list_conn(PROC, N)
    assert (res.rc, res.err) == (0, "")
    assert res.out == (
        "IPVS connection entries\n"
        "pro expire state       source             virtual            destination\n"
        "TCP 00:08  CLOSE       10.77.0.100:60248  10.77.0.100:80     10.77.1.2:8080\n"
        "TCP 14:59  ESTABLISHED 10.0.1.254:53666   10.96.0.1:443      10.10.10.10:443\n"
        "UDP 04:59  UDP         [fd00::9]:53       [fd00::1]:53       [fd00::2]:53\n"
        "UDP 00:59  UDP         10.0.0.2:5060      10.0.0.1:5060      10.0.0.3:5060\n"
        "TCP 100:00 NONE        10.0.0.2:5060      10.0.0.1:5060      [2001:db8::1]:5060\n")


def test_connections_persistent_conn_columns_only_with_pe_data() -> None:
    lines = list_conn(PROC, N | FMT_PERSISTENTCONN).out.splitlines()
    assert lines[1] == ("pro expire state       source             virtual            "
                        "destination        pe name          pe_data")
    assert lines[2] == "TCP 00:08  CLOSE       10.77.0.100:60248  10.77.0.100:80     10.77.1.2:8080"
    assert lines[5] == printf(
        "%-3s %-6s %-11s %-18s %-18s %-16s %-18s %s", "UDP", "00:59", "UDP", "10.0.0.2:5060",
        "10.0.0.1:5060", "10.0.0.3:5060", "sip", "3ec5a2@host")


def test_connections_with_names_and_errors() -> None:
    r = HostsResolver({"10.77.0.100": "vip"}, {(80, "tcp"): "http"})
    assert list_conn(PROC, 0, r).out.splitlines()[2] == (
        "TCP 00:08  CLOSE       vip:60248          vip:http           10.77.1.2:8080")
    assert list_conn("", N).rc == 1
    assert list_conn("", N).err == "unexpected input from /proc/net/ip_vs_conn\n"
    assert list_conn(PROC_HEAD, N).out == (
        "IPVS connection entries\n"
        "pro expire state       source             virtual            destination\n")
    # A blank line makes sscanf return -1 and ipvsadm exit(1) after what it printed.
    res = list_conn(PROC_HEAD + "\n", N)
    assert res.rc == 1 and res.out.count("\n") == 2


def test_fgets_splits_long_lines_at_255() -> None:
    assert fgets_chunks("a\n" + "x" * 300 + "\nb") == ["a\n", "x" * 255, "x" * 45 + "\n", "b"]


# ------------------------------------------------------------------------ option parsing


def opts(*items: tuple[object, object, str]) -> list[tuple[object, object, str]]:
    return list(items)


@pytest.mark.parametrize(("argv", "fmt"), [
    (["-Ln"], N),
    (["-L", "-n", "--stats", "--exact"], N | FMT_STATS | FMT_EXACT),
    (["-Sn"], N | FMT_RULE),
    (["--save"], FMT_RULE),
    (["-l", "--rate", "--nosort", "--sort"], FMT_RATE | FMT_NOSORT),
    (["--list", "--numeric", "--thresholds"], N | FMT_THRESHOLDS),
    (["-Ln", "--persistent-conn", "-X"], N | FMT_PERSISTENTCONN | FMT_EXACT),
    ([], 0),
])
def test_cli_formats(argv: list[str], fmt: int) -> None:
    from ipvsproxy.cli import build_parser

    args = build_parser().parse_args(["ls", *argv])
    assert parse_request(args.ipvsadm_opts).fmt == fmt


@pytest.mark.parametrize(("argv", "key"), [
    (["-Ln", "-t", "10.0.0.1:80"], inet(TCP, "10.0.0.1", 80)),
    (["-Lnt10.0.0.1:80"], inet(TCP, "10.0.0.1", 80)),
    (["-Ln", "-u", "[fd00::1]:53"], inet(UDP, "fd00::1", 53)),
    (["-Ln", "--sctp-service", "10.0.0.1"], inet(SCTP, "10.0.0.1", 0)),
    (["-Ln", "-t", "[10.0.0.1]:80"], inet(TCP, "10.0.0.1", 0)),  # parse_service quirk
    (["-Ln", "-t", "::1"], inet(TCP, "::1", 0)),
    (["-Ln", "-t", "127.0.0.1:http"], inet(TCP, "127.0.0.1", 80)),
    (["-Ln", "-f", "7"], ServiceKey.mark(7)),
    (["-Ln", "-f", "4294967295", "-6"], ServiceKey.mark(4294967295, AF_INET6)),
])
def test_cli_service_argument(argv: list[str], key: ServiceKey) -> None:
    from ipvsproxy.cli import build_parser

    args = build_parser().parse_args(["ls", *argv])
    assert parse_request(args.ipvsadm_opts).key == key


@pytest.mark.parametrize(("argv", "code", "message"), [
    (["-Ln", "-6"], 2, "-6 used before -f\n"),
    (["-Ln", "-n"], 2, "multiple 'numeric' options specified"),
    (["-L", "-S"], 2, "invalid option `-S'"),
    (["-Ln", "-f", "0"], 2, "invalid fwmark value `0' specified"),
    (["-Ln", "-f", "4294967296"], 2, "invalid fwmark value `4294967296' specified"),
    (["-Ln", "-t", "1234"], 2, "illegal virtual server address[:port] specified"),
    (["-Ln", "-t", "[::1]"], 2, "illegal virtual server address[:port] specified"),
    (["-Ln", "-t", "1.2.3.4:99999"], 2, "illegal virtual server address[:port] specified"),
    (["-Ln", "-t", "1.2.3.4:5", "-u", "1.2.3.4:5"], 2,
     "multiple 'service-address' options specified"),
    (["-Sn", "--stats"], 2, "Illegal 'stats' option with the 'save' command"),
    (["-S", "--nosort"], 2, "Illegal 'nosort' option with the 'save' command"),
    (["-Ln", "-c", "--timeout"], 2,
     "The option 'timeout' conflicts with the 'connection' option in the 'list' command"),
    (["-Ln", "-t", "1.2.3.4:5", "-c"], 2,
     "The option 'service-address' conflicts with the 'connection' option in the 'list' "
     "command"),
    (["-Ln", "--timeout", "--persistent-conn"], 2, "options conflicts in the list command"),
    (["-Lnc", "--stats"], 2, "options conflicts in the list command"),
])
def test_cli_errors_are_ipvsadms(argv: list[str], code: int, message: str) -> None:
    from ipvsproxy.cli import build_parser

    args = build_parser().parse_args(["ls", *argv])
    with pytest.raises(IpvsadmExit) as exc:
        parse_request(args.ipvsadm_opts)
    assert (exc.value.code, exc.value.message) == (code, message)


def test_parse_service_none_cases() -> None:
    assert parse_service("", TCP) is None
    assert parse_service("[::1]x80", TCP) is None
    assert parse_service("1.2.3.4:nosuchservice-xyz", TCP) is None


# The -Ln real-server lines have a fast path (_plain_numeric_lines); it must print what the
# general one (sort_dests + _dest_line) prints, for any table.
_addrs = st.one_of(st.integers(0, 2**32 - 1).map(IPv4Address),
                   st.integers(0, 2**128 - 1).map(IPv6Address))
_dests = st.builds(
    lambda a, p, f, w, act, inact: ObservedDest(RealServer(DestKey(a, p), f, w), act, inact),
    _addrs, st.integers(0, 65535), st.sampled_from(list(Fwd)), st.integers(0, 2**32 - 1),
    st.integers(0, 2**32 - 1), st.integers(0, 2**32 - 1))


@settings(max_examples=400, deadline=None)
@given(st.lists(_dests, max_size=12, unique_by=lambda d: d.dest.key), st.booleans(),
       st.booleans())
def test_plain_numeric_lines_equal_the_general_ones(ds: list[ObservedDest], v4_only: bool,
                                                     nosort: bool) -> None:
    from ipvsproxy.core.ipvsadm_format import _dest_line, _plain_numeric_lines
    from ipvsproxy.core.ipvsadm_sort import sort_dests

    if v4_only:
        ds = [d for d in ds if d.dest.key.addr.version == 4]
    fmt = N | (FMT_NOSORT if nosort else 0)
    want = [_dest_line("-", d, TCP, fmt, NO_RESOLVER) for d in (ds if nosort else sort_dests(ds))]
    assert _plain_numeric_lines(ds, TCP, fmt, NO_RESOLVER) == want


_u32 = st.integers(0, 2**32 - 1)
_listing_row = st.tuples(st.one_of(_u32, st.integers(0x0A000000, 0x0A00FFFF)),
                         st.integers(0, 65535), st.integers(0, 7), _u32, _u32, _u32)


@settings(max_examples=300, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 2**32 - 1), st.sampled_from([TCP, UDP]),
                          st.integers(0, 65535), st.lists(_listing_row, max_size=8),
                          st.booleans()),
                min_size=0, max_size=8, unique_by=lambda s: (s[0], s[1], s[2])),
       st.sampled_from([FMT_NUMERIC, FMT_NUMERIC | FMT_NOSORT, FMT_NUMERIC | FMT_EXACT]),
       st.booleans())
def test_the_plain_listing_from_rows_is_the_listing_from_objects(
        services: list[tuple[int, Protocol, int, list[tuple[int, ...]], bool]], fmt: int,
        named: bool) -> None:
    """list_plain over listing rows (what the kernel layer reads for ls -Ln without building
    objects) prints what list_all prints for the same real servers as ObservedDests, whatever
    the address spread (the comparison quirk), forwarding code, weight or order."""
    from ipvsproxy.core.ipvsadm_format import is_plain, list_plain, plain_block
    from ipvsproxy.kernel.ipvs_shapes import _FWDS

    assert is_plain(fmt)
    observed, entries = [], []
    for addr, proto, port, rows, as_objects in services:
        rows = list({(r[0], r[1]): r for r in rows}.values())  # a real server once
        vs = VirtualServer(ServiceKey.inet(proto, IPv4Address(addr), port), "wrr")
        dests = tuple(ObservedDest(RealServer(DestKey(IPv4Address(n), p), _FWDS[f], w), a, i)
                      for n, p, f, w, a, i in rows)
        observed.append(ObservedService(vs, dests))
        entries.append((vs, dests if as_objects else rows))
    names = {s.service.key: f"ns/svc{i}:http" for i, s in enumerate(observed)} if named else None
    blocks = [plain_block(vs, dests, fmt, NO_RESOLVER, names) for vs, dests in entries]
    assert list_plain(INFO, [vs for vs, _ in entries], blocks, fmt) == \
        list_all(INFO, observed, fmt, NO_RESOLVER, names)
