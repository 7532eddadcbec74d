"""`ipvsproxy explain`: the pure part (ipvsproxy.core.explain) and the command with a fake
kernel."""

from __future__ import annotations

import json
from collections.abc import Iterator
from ipaddress import IPv4Address, IPv6Address, ip_address
from typing import Any, ClassVar

import pytest

from ipvsproxy.cli import main
from ipvsproxy.core.explain import (
    client_network,
    explain,
    find_template,
    model_dests,
    parse_client,
    parse_conn_table,
    template_key,
)
from ipvsproxy.core.ipvs import (
    SVC_F_PERSISTENT,
    SVC_F_SCHED1,
    SVC_F_SCHED2,
    DestKey,
    ObservedDest,
    ObservedService,
    Protocol,
    RealServer,
    ServiceKey,
    VirtualServer,
)
from scheduler import Conn, sh

VIP = IPv4Address("10.96.77.1")
KEY = ServiceKey.inet(Protocol.TCP, VIP, 7410)


def od(ip: str, weight: int = 1, active: int = 0, inact: int = 0, port: int = 7000,
       u: int = 0, low: int = 0) -> ObservedDest:
    return ObservedDest(RealServer(DestKey(ip_address(ip), port), weight=weight, u_threshold=u,
                                   l_threshold=low), active, inact)


def service(scheduler: str = "rr", flags: int = 0, dests: tuple[ObservedDest, ...] = (),
            key: ServiceKey = KEY, timeout: int = 0, netmask: int = -1) -> ObservedService:
    return ObservedService(VirtualServer(key, scheduler, flags, timeout, netmask), dests)


PODS = (od("10.244.1.13"), od("10.244.1.12"), od("10.244.1.11"))

CONN_TABLE = (
    "Pro FromIP   FPrt ToIP     TPrt DestIP   DPrt State       Expires PEName PEData\n"
    "TCP 0A4D0001 0000 0A604D01 1CF2 0AF4010C 1B58 NONE            299\n"
    "TCP 0A4D0001 D431 0A604D01 1CF2 0AF4010C 1B58 FIN_WAIT        119\n"
    "IP  0A4D0002 0000 00000007 0000 0AF4010B 0000 ASSURED         250\n"
    "TCP 2001:0db8:0000:0000:0000:0000:0000:0000 0000 fd00:0000:0000:0000:0000:0000:0000:0001 "
    "0050 fd00:0000:0000:0000:0000:0000:0000:000b 1F90 NONE            100\n"
    "garbage line\n"
)


# ------------------------------------------------------------------------------- conn table

def test_parse_conn_table_ipv4_ipv6_and_templates() -> None:
    entries = parse_conn_table(CONN_TABLE)
    assert len(entries) == 4
    t = entries[0]
    assert (t.protocol, t.caddr, t.cport, t.vaddr, t.vport, t.daddr, t.dport) == (
        "TCP", IPv4Address("10.77.0.1"), 0, VIP, 7410, IPv4Address("10.244.1.12"), 7000)
    assert t.is_template and t.expires == 299
    assert not entries[1].is_template
    assert entries[2].is_template and entries[2].vaddr == IPv4Address(7)
    assert entries[3].caddr == IPv6Address("2001:db8::") and entries[3].dport == 8080


def test_template_key_port_fwmark_and_ftp() -> None:
    vs = service().service
    assert template_key(vs, IPv4Address("10.77.0.1")) == ("TCP", IPv4Address("10.77.0.1"),
                                                          VIP, 7410)
    ftp = VirtualServer(ServiceKey.inet(Protocol.TCP, VIP, 21), "rr", SVC_F_PERSISTENT)
    assert template_key(ftp, IPv4Address("10.77.0.1"))[3] == 0
    mark = VirtualServer(ServiceKey.mark(7), "rr", SVC_F_PERSISTENT)
    assert template_key(mark, IPv4Address("10.77.0.2")) == ("IP", IPv4Address("10.77.0.2"),
                                                            IPv4Address(7), 0)
    mark6 = VirtualServer(ServiceKey.mark(7, 10), "rr", SVC_F_PERSISTENT)
    assert template_key(mark6, IPv6Address("2001:db8::1"))[2] == IPv6Address("0:7::")


def test_client_network_masks() -> None:
    vs = service(netmask=0xFFFFFF00).service
    assert client_network(vs, IPv4Address("10.77.0.9")) == IPv4Address("10.77.0.0")
    v6 = VirtualServer(ServiceKey.inet(Protocol.TCP, IPv6Address("fd00::1"), 80), "rr", 1, 60, 64)
    assert client_network(v6, IPv6Address("2001:db8:1:2:3::9")) == IPv6Address("2001:db8:1:2::")
    assert client_network(service().service, IPv4Address("10.77.0.9")) == IPv4Address("10.77.0.9")


def test_find_template_by_client_network() -> None:
    entries = parse_conn_table(CONN_TABLE)
    vs = service(flags=SVC_F_PERSISTENT, timeout=300).service
    assert find_template(entries, vs, IPv4Address("10.77.0.1")) is entries[0]
    assert find_template(entries, vs, IPv4Address("10.77.0.2")) is None
    coarse = service(flags=SVC_F_PERSISTENT, netmask=0xFFFFFF00).service
    assert find_template(entries, coarse, IPv4Address("10.77.0.1")) is None  # key is 10.77.0.0


# ---------------------------------------------------------------------------------- explain

def test_persistence_template_wins_over_the_scheduler() -> None:
    svc = service("rr", SVC_F_PERSISTENT, PODS, timeout=300)
    ans = explain(svc, Conn(IPv4Address("10.77.0.1")), CONN_TABLE)
    assert ans.real_server_text == "10.244.1.12:7000"  # rr from the head would say .13
    assert "template" in ans.reason and "wins" in ans.reason
    js = ans.to_json()
    assert js["template"] == {"client_network": "10.77.0.1", "real_server": "10.244.1.12:7000",
                              "expires": 299, "state": "NONE"}
    assert js["scheduler_pick"]["real_server"] == "10.244.1.13:7000"  # type: ignore[index]
    assert "persistent   300 s; template 10.77.0.1 -> 10.244.1.12:7000" in ans.to_text()


def test_template_of_a_removed_or_quiesced_server_is_invalid() -> None:
    gone = service("rr", SVC_F_PERSISTENT, (od("10.244.1.13"),), timeout=300)
    ans = explain(gone, Conn(IPv4Address("10.77.0.1")), CONN_TABLE)
    assert ans.real_server_text == "10.244.1.13:7000"
    assert any("no longer in the service" in n for n in ans.notes)
    quiet = service("rr", SVC_F_PERSISTENT, (od("10.244.1.12", 0), od("10.244.1.13")),
                    timeout=300)
    # without expire_quiescent_template a weight-0 server keeps its clients
    assert explain(quiet, Conn(IPv4Address("10.77.0.1")), CONN_TABLE).real_server_text == \
        "10.244.1.12:7000"
    ans = explain(quiet, Conn(IPv4Address("10.77.0.1")), CONN_TABLE, True)
    assert ans.real_server_text == "10.244.1.13:7000"
    assert any("expire_quiescent_template" in n for n in ans.notes)


def test_persistent_without_template_and_without_table() -> None:
    svc = service("rr", SVC_F_PERSISTENT, PODS, timeout=300)
    ans = explain(svc, Conn(IPv4Address("10.77.0.9")), CONN_TABLE)
    assert ans.template is None and ans.reason.startswith("no persistence template")
    ans = explain(svc, Conn(IPv4Address("10.77.0.9")), None)
    assert any("could not be read" in n for n in ans.notes)


def test_sh_explain_carries_the_bucket_and_flags() -> None:
    svc = service("sh", SVC_F_SCHED1 | SVC_F_SCHED2, PODS)
    c = Conn(IPv4Address("10.0.0.1"), 1)
    ans = explain(svc, c)
    assert ans.flags == ["sh-fallback", "sh-port"]
    model = sh.schedule(model_dests(PODS)[0], c, sh_port=True, sh_fallback=True)
    assert ans.real_server == model.dest
    js = ans.to_json()
    assert js["scheduler_pick"]["bucket"] == 137  # type: ignore[index]
    assert js["scheduler"] == "sh" and js["real_server"] == str(model.dest)
    assert "bucket 137 of 256" in js["reason"]  # type: ignore[operator]
    assert not ans.notes
    no_port = explain(svc, Conn(IPv4Address("10.0.0.1")))
    assert any("port 0 assumed" in n for n in no_port.notes)


def test_mh_weight_zero_note_and_rr_position_note() -> None:
    mh_ans = explain(service("mh", 0, (od("10.244.1.11", 0), od("10.244.1.12"))),
                     Conn(IPv4Address("10.0.0.1")))
    assert mh_ans.real_server_text == "10.244.1.12:7000"
    assert any("last non-zero weight" in n for n in mh_ans.notes)
    rr_ans = explain(service("rr", 0, PODS), Conn(IPv4Address("10.0.0.1")))
    assert "does not expose its round-robin position" in rr_ans.reason
    assert "upcoming     10.244.1.13:7000, 10.244.1.12:7000, 10.244.1.11:7000" in \
        rr_ans.to_text()


def test_lc_explain_lists_overheads_and_overload_inference() -> None:
    dests = (od("10.244.1.11", active=1, u=2), od("10.244.1.12", inact=3, u=3),
             od("10.244.1.13", active=2, inact=1, u=4, low=2))
    ans = explain(service("lc", 0, dests), Conn(IPv4Address("10.0.0.1")))
    # .12: 3 connections >= u_threshold 3: overloaded. .13: 3 is between 2 and 4: unknown,
    # assumed not. .11: 1 < 2 - 0 = 2... low default 2 - (2 >> 2) = 2: not overloaded.
    assert [d.overloaded for d in ans.dests] == [False, True, False]
    assert any("between its thresholds" in n for n in ans.notes)
    assert ans.real_server_text == "10.244.1.11:7000"  # 257 < 2 * 256 + 3
    text = ans.to_text()
    assert "10.244.1.12:7000 weight 1 active 0 inactive 3 overhead 3 (overloaded, skipped)" in text


def test_unmodelled_scheduler_and_no_destination() -> None:
    ans = explain(service("dh", 0, PODS), Conn(IPv4Address("10.0.0.1")))
    assert ans.real_server is None and "no model" in ans.reason
    none = explain(service("sh", 0, ()), Conn(IPv4Address("10.0.0.1")))
    assert none.to_json()["real_server"] is None


def test_ipv6_real_server_is_bracketed() -> None:
    key = ServiceKey.inet(Protocol.TCP, IPv6Address("fd00::1"), 80)
    svc = service("sh", 0, (od("fd00::b", port=8080),), key=key)
    js = explain(svc, Conn(IPv6Address("2001:db8::1"), 5)).to_json()
    assert js["real_server"] == "[fd00::b]:8080"
    assert js["client"] == "[2001:db8::1]:5"


@pytest.mark.parametrize("text,want", [
    ("10.0.0.1", Conn(IPv4Address("10.0.0.1"), 0)),
    ("10.0.0.1:443", Conn(IPv4Address("10.0.0.1"), 443)),
    ("2001:db8::1", Conn(IPv6Address("2001:db8::1"), 0)),
    ("[2001:db8::1]:53", Conn(IPv6Address("2001:db8::1"), 53)),
    ("[2001:db8::1]", Conn(IPv6Address("2001:db8::1"), 0)),
])
def test_parse_client(text: str, want: Conn) -> None:
    assert parse_client(text) == want


@pytest.mark.parametrize("text", ["10.0.0.1:70000", "nope", "[2001:db8::1]x", "10.0.0.1:x",
                                  "[2001:db8::1"])
def test_parse_client_errors(text: str) -> None:
    with pytest.raises(ValueError, match="invalid client"):
        parse_client(text)


# ---------------------------------------------------------------------------------- command

class FakeIpvs:
    services: ClassVar[dict[ServiceKey, ObservedService]] = {}

    def __enter__(self) -> FakeIpvs:
        return self

    def __exit__(self, *exc: object) -> None:
        pass

    def get_service(self, key: ServiceKey) -> ObservedService | None:
        return self.services.get(key)


@pytest.fixture
def fake_kernel(monkeypatch: pytest.MonkeyPatch, tmp_path: Any) -> Iterator[None]:
    from ipvsproxy.commands import explain as cmd
    from ipvsproxy.kernel import ipvs

    FakeIpvs.services = {KEY: service("sh", SVC_F_SCHED1, PODS)}
    monkeypatch.setattr(ipvs, "IpvsClient", FakeIpvs)
    conn = tmp_path / "ip_vs_conn"
    conn.write_text(CONN_TABLE)
    monkeypatch.setattr(cmd, "CONN_PROC_FILE", str(conn))
    monkeypatch.setattr(cmd, "EXPIRE_QUIESCENT", str(tmp_path / "missing"))
    monkeypatch.setenv("IPVSPROXY_STATE_DIR", str(tmp_path))  # no names published
    yield


def test_command_json(fake_kernel: None, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["explain", "-t", "10.96.77.1:7410", "--client", "10.0.0.1", "-o", "json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["scheduler"] == "sh" and out["flags"] == ["sh-fallback"]
    assert out["real_server"] == str(explain(FakeIpvs.services[KEY],
                                             Conn(IPv4Address("10.0.0.1"))).real_server)
    assert out["reason"].startswith("hash_32(10.0.0.1) -> bucket 39 of 256")


def test_command_text(fake_kernel: None, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["explain", "-t", "10.96.77.1:7410", "--client", "10.0.0.1:5"]) == 0
    out = capsys.readouterr().out
    assert out.startswith("service      TCP 10.96.77.1:7410\nclient       10.0.0.1:5\n"
                          "scheduler    sh (sh-fallback)\nreal server  10.244.1.1")


@pytest.mark.parametrize("argv,err", [
    (["-t", "10.96.77.2:1", "--client", "10.0.0.1"], "no such service: TCP 10.96.77.2:1"),
    (["--client", "10.0.0.1"], "give exactly one of"),
    (["-t", "10.96.77.1:7410", "-u", "10.96.77.1:53", "--client", "10.0.0.1"], "exactly one"),
    (["-t", "10.96.77.1:7410", "-6", "--client", "10.0.0.1"], "-6 goes with -f"),
    (["-t", "10.96.77.1:7410", "--client", "2001:db8::1"], "different families"),
    (["-t", "10.96.77.1:7410", "--client", "x"], "invalid client"),
    (["-t", "nohost.invalid:x", "--client", "10.0.0.1"], "illegal virtual server"),
    (["-f", "0", "--client", "10.0.0.1"], "invalid fwmark"),
    (["--service", "default/web", "--client", "10.0.0.1"], "no virtual server of default/web"),
    (["--service", "web", "--client", "10.0.0.1"], "give namespace/name"),
    (["--service", "a/b", "-t", "10.96.77.1:7410", "--client", "10.0.0.1"], "exactly one"),
])
def test_command_errors(fake_kernel: None, capsys: pytest.CaptureFixture[str],
                        argv: list[str], err: str) -> None:
    assert main(["explain", *argv]) == 2
    assert err in capsys.readouterr().err


def test_command_fwmark_ipv6(fake_kernel: None, capsys: pytest.CaptureFixture[str]) -> None:
    key = ServiceKey.mark(7, 10)
    FakeIpvs.services[key] = service("sh", 0, (od("fd00::b", port=8080),), key=key)
    assert main(["explain", "-f", "7", "-6", "--client", "[2001:db8::1]:5", "-o", "json"]) == 0
    assert json.loads(capsys.readouterr().out)["real_server"] == "[fd00::b]:8080"


def test_command_by_kubernetes_name(fake_kernel: None, capsys: pytest.CaptureFixture[str],
                                    tmp_path: Any) -> None:
    from ipvsproxy import names

    nodeport = ServiceKey.inet(Protocol.TCP, IPv4Address("192.168.1.10"), 30410)
    FakeIpvs.services[nodeport] = service("rr", 0, PODS, key=nodeport)
    other = ServiceKey.inet(Protocol.TCP, IPv4Address("10.96.77.1"), 9100)
    names.write({KEY: "default/web:http", nodeport: "default/web:http",
                 other: "default/web:metrics"}, tmp_path / "services")
    # the port's first published virtual server (its ClusterIP), named in the answer
    assert main(["explain", "--service", "default/web:http", "--client", "10.0.0.1",
                 "-o", "json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["service"] == "TCP 10.96.77.1:7410" and out["scheduler"] == "sh"
    assert out["kubernetes_service"] == "default/web:http"
    assert main(["explain", "-t", "10.96.77.1:7410", "--client", "10.0.0.1"]) == 0
    assert capsys.readouterr().out.startswith(
        "service      TCP 10.96.77.1:7410  (default/web:http)\nclient ")
    assert main(["explain", "--service", "default/web", "--client", "10.0.0.1"]) == 2
    assert ("default/web has several ports, name one: default/web:http, default/web:metrics"
            in capsys.readouterr().err)
    assert main(["explain", "--service", "default/web:http", "--client", "fd00::1"]) == 2
    assert "no virtual server of default/web:http (IPv6)" in capsys.readouterr().err
