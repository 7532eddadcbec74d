"""The published service names (ipvsproxy/names.py): the file format round-trips every kind of
virtual server, a damaged file costs only its bad lines, writes are atomic and not world
writable, and `namespace/name[:port]` finds a service port's virtual servers."""

from __future__ import annotations

import stat
from ipaddress import ip_address
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from ipvsproxy import names
from ipvsproxy.core.ipvs import AF_INET, AF_INET6, Protocol, ServiceKey

WEB = ServiceKey.inet(Protocol.TCP, ip_address("10.96.0.10"), 80)
WEB_NP = ServiceKey.inet(Protocol.TCP, ip_address("192.168.1.10"), 30080)
WEB6 = ServiceKey.inet(Protocol.TCP, ip_address("fd00::10"), 80)
WEB_METRICS = ServiceKey.inet(Protocol.TCP, ip_address("10.96.0.10"), 9100)
DNS = ServiceKey.inet(Protocol.UDP, ip_address("10.96.0.53"), 53)
OWNERS = {WEB: "default/web:http", WEB_NP: "default/web:http", WEB6: "default/web:http",
          WEB_METRICS: "default/web:metrics", DNS: "kube-system/kube-dns:dns",
          ServiceKey.mark(7): "x/fw", ServiceKey.mark(8, AF_INET6): "x/fw6"}

keys = st.one_of(
    st.builds(ServiceKey.inet, st.sampled_from([Protocol.TCP, Protocol.UDP, Protocol.SCTP]),
              st.one_of(st.ip_addresses(v=4), st.ip_addresses(v=6)),
              st.integers(0, 65535)),
    st.builds(ServiceKey.mark, st.integers(1, 2**32 - 1), st.sampled_from([AF_INET, AF_INET6])))
owners = st.from_regex(r"[a-z0-9-]{1,20}/[a-z0-9.-]{1,30}(:[a-z0-9-]{1,15})?", fullmatch=True)


@given(st.dictionaries(keys, owners, max_size=20))
def test_the_file_round_trips(d: dict[ServiceKey, str]) -> None:
    assert names.parse(names.render(d)) == d


def test_the_format_is_one_readable_line_per_virtual_server() -> None:
    text = names.render(OWNERS)
    assert text.splitlines()[:2] == ["TCP 10.96.0.10:80\tdefault/web:http",
                                     "TCP 192.168.1.10:30080\tdefault/web:http"]
    assert "TCP [fd00::10]:80\tdefault/web:http\n" in text
    assert "FWM 7\tx/fw\n" in text and "FWM 8 IPv6\tx/fw6\n" in text
    assert list(names.parse(text)) == list(OWNERS)  # order kept: ClusterIP first


def test_damaged_lines_are_skipped() -> None:
    text = ("TCP 10.96.0.10:80\tdefault/web:http\n"
            "garbage\n" "TCP 10.96.0.999:80\tx/y\n" "ICMP 1.2.3.4:1\tx/y\n" "FWM x\tx/y\n"
            "TCP 10.96.0.11\tx/y\n" "FWM 7 IPv4\tx/y\n" "UDP 10.96.0.53:53\t\n"
            "UDP 10.96.0.53:53\tkube-system/kube-dns:dns\n")
    assert names.parse(text) == {WEB: "default/web:http", DNS: "kube-system/kube-dns:dns"}


def test_write_is_atomic_and_not_world_writable(tmp_path: Path) -> None:
    where = tmp_path / "run" / "ipvsproxy" / "services"
    names.write(OWNERS, where)
    assert names.read(where) == OWNERS
    assert stat.S_IMODE(where.stat().st_mode) == 0o644
    assert stat.S_IMODE(where.parent.stat().st_mode) & 0o022 == 0
    names.write({DNS: "kube-system/kube-dns:dns"}, where)
    assert names.read(where) == {DNS: "kube-system/kube-dns:dns"}
    assert [p.name for p in where.parent.iterdir()] == ["services"]  # no temporary left
    names.remove(where)
    names.remove(where)  # twice is fine
    assert names.read(where) == {}


def test_the_state_dir_comes_from_the_environment(monkeypatch: pytest.MonkeyPatch,
                                                  tmp_path: Path) -> None:
    monkeypatch.delenv("IPVSPROXY_STATE_DIR", raising=False)
    assert names.path() == Path("/run/ipvsproxy/services")
    monkeypatch.setenv("IPVSPROXY_STATE_DIR", str(tmp_path))
    assert names.path() == tmp_path / "services"


def test_publisher_writes_only_changes(tmp_path: Path) -> None:
    where = tmp_path / "services"
    pub = names.Publisher(where)
    assert pub.publish(OWNERS) is True
    where.unlink()
    assert pub.publish(dict(OWNERS)) is False and not where.exists()
    assert pub.publish({WEB: "default/web:http"}) is True
    assert names.read(where) == {WEB: "default/web:http"}


@pytest.mark.parametrize(("query", "af", "want"), [
    ("default/web:http", None, [WEB, WEB_NP, WEB6]),
    ("default/web:http", AF_INET, [WEB, WEB_NP]),
    ("default/web:http", AF_INET6, [WEB6]),
    ("default/web:80", AF_INET, [WEB, WEB_NP]),  # a port number: the port it serves on
    ("default/web:30080", AF_INET, [WEB, WEB_NP]),  # ... or its node port
    ("default/web:9100", AF_INET, [WEB_METRICS]),
    ("default/web", AF_INET, [WEB, WEB_NP, WEB_METRICS]),  # every port
    ("default/web:nope", None, []),
    ("default/we", None, []),  # no prefix matches
    ("x/fw", AF_INET, [ServiceKey.mark(7)]),
])
def test_lookup(query: str, af: int | None, want: list[ServiceKey]) -> None:
    assert names.lookup(OWNERS, query, af) == want
