"""The daemon's HTTP servers (daemon/http.py) on real sockets: bind addresses, /healthz and
/livez (counted by code), /metrics, /proxyMode, and silence per request."""

from __future__ import annotations

import json
import socket
import urllib.error
import urllib.request
from collections.abc import Iterator

import pytest

from ipvsproxy.daemon import http
from ipvsproxy.daemon.health import Health
from ipvsproxy.daemon.metrics import Metrics
from tests.unit.test_health import Clock
from tests.unit.test_metrics import samples


def get(url: str) -> tuple[int, dict[str, str], bytes]:
    try:
        with urllib.request.urlopen(url, timeout=5) as r:
            return r.status, dict(r.headers), r.read()
    except urllib.error.HTTPError as e:
        return e.code, dict(e.headers), e.read()


@pytest.mark.parametrize("text,want", [
    ("0.0.0.0:10256", ("0.0.0.0", 10256)),
    ("127.0.0.1:0", ("127.0.0.1", 0)),
    ("[::]:10256", ("::", 10256)),
    ("[fd00:0::1]:10249", ("fd00::1", 10249)),
    (":10256", ("", 10256)),
    (" 10.0.0.1:80 ", ("10.0.0.1", 80)),
    ("[10.0.0.1]:80", ("10.0.0.1", 80)),
])
def test_bind_addresses(text: str, want: tuple[str, int]) -> None:
    assert http.parse_bind_address(text) == want


@pytest.mark.parametrize("text,want", [
    ("10.0.0.1", ("10.0.0.1", 10256)), ("::1", ("::1", 10256)), ("[::]", ("::", 10256))])
def test_a_bare_ip_gets_the_default_port(text: str, want: tuple[str, int]) -> None:
    assert http.parse_bind_address(text, 10256) == want


@pytest.mark.parametrize("text,error", [
    ("", "not IP:PORT"),
    ("10256", "not IP:PORT"),
    ("10.0.0.1", "no port"),
    ("localhost:10256", "not an IP address"),
    ("fd00::1:x", "not an IP address"),
    ("[10.0.0.x]:80", "not an IP address"),
    ("0.0.0.0:65536", "not a port"),
    ("0.0.0.0:-1", "not a port"),
    ("0.0.0.0:", "not a port"),
])
def test_bad_bind_addresses_are_refused_clearly(text: str, error: str) -> None:
    with pytest.raises(ValueError, match=error):
        http.parse_bind_address(text)


@pytest.fixture
def healthz() -> Iterator[tuple[http.Served, Health, Metrics, Clock]]:
    clock = Clock()
    health, metrics = Health((4,), 1.0, clock=clock), Metrics()
    srv = http.start_healthz("127.0.0.1:0", health, metrics)
    yield srv, health, metrics, clock
    srv.stop()


def test_healthz_and_livez_answer_json_and_are_counted(
        healthz: tuple[http.Served, Health, Metrics, Clock]) -> None:
    srv, health, metrics, clock = healthz
    base = f"http://127.0.0.1:{srv.port}"
    health.updated(4)
    code, headers, body = get(base + "/healthz")
    assert code == 200
    assert headers["Content-Type"] == "application/json"
    assert headers["X-Content-Type-Options"] == "nosniff"
    assert body.startswith(b'{"lastUpdated":"') and b" " not in body  # compact, like Go's
    assert json.loads(body)["nodeEligible"] is True
    health.queued_update(4)
    clock.t += 5
    assert get(base + "/healthz")[0] == 503
    assert get(base + "/healthz?verbose")[0] == 503
    code, _, body = get(base + "/livez")
    assert code == 503 and "nodeEligible" not in json.loads(body)
    assert get(base + "/metrics")[0] == 404
    s = samples(metrics.render())
    assert s['kubeproxy_proxy_healthz_total{code="200"}'] == 1
    assert s['kubeproxy_proxy_healthz_total{code="503"}'] == 2
    assert s['kubeproxy_proxy_livez_total{code="503"}'] == 1


def test_the_metrics_server(capfd: pytest.CaptureFixture[str]) -> None:
    metrics = Metrics()
    metrics.virtual_servers.set(3)
    srv = http.start_metrics("127.0.0.1:0", metrics)
    try:
        base = f"http://127.0.0.1:{srv.port}"
        code, headers, body = get(base + "/metrics")
        assert code == 200 and headers["Content-Type"].startswith("text/plain; version=0.0.4")
        assert samples(body)["ipvsproxy_virtual_servers"] == 3
        code, headers, body = get(base + "/proxyMode")
        assert (code, body) == (200, b"ipvs")
        assert headers["X-Content-Type-Options"] == "nosniff"
        assert get(base + "/healthz")[::2] == (200, b"ok")
        assert get(base + "/nothing")[::2] == (404, b"404 page not found\n")
    finally:
        srv.stop()
    out, err = capfd.readouterr()
    assert out == err == ""  # no line per request


def test_a_bad_address_fails_like_a_listener() -> None:
    with pytest.raises(OSError, match="not an IP address"):
        http.start_healthz("nowhere:10256", Health((4,), 30.0), Metrics())


def test_stop_frees_the_port_and_a_taken_port_is_an_oserror() -> None:
    srv = http.start_metrics("127.0.0.1:0", Metrics())
    port = srv.port
    with pytest.raises(OSError, match=f"cannot listen on 127.0.0.1:{port}"):
        http.start_metrics(f"127.0.0.1:{port}", Metrics())
    srv.stop()
    again = http.start_metrics(f"127.0.0.1:{port}", Metrics())
    assert again.port == port
    again.stop()


def ipv6() -> bool:
    try:
        with socket.socket(socket.AF_INET6) as s:
            s.bind(("::1", 0))
        return True
    except OSError:
        return False


@pytest.mark.skipif(not ipv6(), reason="no IPv6 loopback here")
def test_ipv6_and_dual_stack_wildcards() -> None:
    srv = http.start_metrics("[::1]:0", Metrics())
    try:
        assert get(f"http://[::1]:{srv.port}/proxyMode")[::2] == (200, b"ipvs")
    finally:
        srv.stop()
    # a wildcard listens on both families, as Go does for "0.0.0.0" and "::"
    srv = http.start_metrics("0.0.0.0:0", Metrics())
    try:
        assert get(f"http://127.0.0.1:{srv.port}/proxyMode")[0] == 200
        assert get(f"http://[::1]:{srv.port}/proxyMode")[0] == 200
    finally:
        srv.stop()


def test_head_answers_the_headers_of_get_without_the_body(
        healthz: tuple[http.Served, Health, Metrics, Clock]) -> None:
    srv, health, _, _ = healthz
    health.updated(4)
    url = f"http://127.0.0.1:{srv.port}/healthz"
    with urllib.request.urlopen(urllib.request.Request(url, method="HEAD"), timeout=5) as r:
        assert r.status == 200 and r.read() == b""
        assert r.headers["Content-Type"] == "application/json"
        assert int(r.headers["Content-Length"]) == len(get(url)[2])
