"""The daemon's HTTP servers (daemon/http.py) under abuse (issue 23): idle connections beyond
the cap, slowloris, huge requests, slow readers, bodies and pipelining on real loopback sockets;
the server keeps answering /healthz with one thread and a bounded number of connections.
Deadlines are made short through Limits; nothing here asserts a duration."""

from __future__ import annotations

import select
import socket
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from ipvsproxy.daemon import http
from ipvsproxy.daemon.health import Health
from ipvsproxy.daemon.metrics import Metrics
from tests.unit.test_http import get

GOOD = b"GET /healthz HTTP/1.1\r\nHost: node\r\nConnection: close\r\n\r\n"


def wait_for(what: str, cond: Callable[[], bool], timeout: float = 10.0) -> None:
    end = time.monotonic() + timeout
    while not cond():
        if time.monotonic() > end:
            raise AssertionError(f"never: {what}")
        time.sleep(0.01)


def connect(port: int) -> socket.socket:
    return socket.create_connection(("127.0.0.1", port), timeout=10)


def read_all(s: socket.socket) -> bytes:
    """Everything until the server closes (a reset after a lingering close counts as closed)."""
    out = b""
    try:
        while chunk := s.recv(65536):
            out += chunk
    except ConnectionResetError:
        pass
    return out


def exchange(port: int, data: bytes) -> bytes:
    with connect(port) as s:
        s.sendall(data)
        return read_all(s)


def closed_by_server(s: socket.socket) -> bool:
    """The server closed s (EOF or reset), without waiting."""
    if not select.select([s], [], [], 0)[0]:
        return False
    try:
        return s.recv(1, socket.MSG_PEEK) == b""
    except ConnectionResetError:
        return True


@pytest.fixture
def server() -> Iterator[Callable[..., http.Served]]:
    """start_healthz as the daemon does, with the Limits a test asks for."""
    started: list[http.Served] = []

    def start(**limits: Any) -> http.Served:
        health = Health((4,), 30.0)
        health.updated(4)
        srv = http.start_healthz("127.0.0.1:0", health, Metrics(), http.Limits(**limits))
        started.append(srv)
        return srv

    yield start
    for srv in started:
        srv.stop()


def test_idle_connections_beyond_the_cap_do_not_keep_healthz_from_answering(
        server: Callable[..., http.Served]) -> None:
    srv = server()  # the daemon's own limits
    cap = http.LIMITS.connections
    idle = [connect(srv.port) for _ in range(cap + 100)]
    try:
        wait_for("the idle connections beyond the cap evicted",
                 lambda: sum(closed_by_server(s) for s in idle) >= 100)
        assert len(srv.server.conns) <= cap
        assert get(f"http://127.0.0.1:{srv.port}/healthz")[0] == 200
        # the oldest went first: the newest idle ones are still held
        assert not any(closed_by_server(s) for s in idle[-cap // 2:])
    finally:
        for s in idle:
            s.close()


def test_one_thread_per_server_whatever_the_clients_do(
        server: Callable[..., http.Served]) -> None:
    srv = server(connections=64)
    threads = set(threading.enumerate())  # pytest's own may end meanwhile (the kernel lab's)
    socks = [connect(srv.port) for _ in range(200)]
    try:
        for s in socks[::2]:
            s.sendall(b"GET /healthz HTTP/1.1\r\nX-Slow: ")  # half slowloris, half idle
        wait_for("the cap reached", lambda: len(srv.server.conns) == 64)
        assert set(threading.enumerate()) <= threads
        assert exchange(srv.port, GOOD).startswith(b"HTTP/1.1 200 OK\r\n")
        assert len(srv.server.conns) <= 64
    finally:
        for s in socks:
            s.close()


def test_slowloris_is_cut_at_the_request_deadline(server: Callable[..., http.Served]) -> None:
    # a byte well within any per-recv timeout, forever: only a whole-request deadline ends it
    srv = server(request_timeout=0.3)
    with connect(srv.port) as s:
        s.sendall(b"GET /healthz HTTP/1.1\r\n")
        for _ in range(500):
            if closed_by_server(s):
                break
            try:
                s.sendall(b"X-a: b\r\n")
            except (BrokenPipeError, ConnectionResetError):
                break
            time.sleep(0.02)
        else:
            raise AssertionError("a slowloris client is still being heard")
        assert read_all(s) == b""  # cut, not answered
    wait_for("the server forgot it", lambda: not srv.server.conns)
    assert exchange(srv.port, GOOD).startswith(b"HTTP/1.1 200 OK\r\n")


def test_an_idle_keepalive_connection_is_closed_too(server: Callable[..., http.Served]) -> None:
    srv = server(request_timeout=0.3)
    with connect(srv.port) as s:
        s.sendall(b"GET /livez HTTP/1.1\r\n\r\n")
        first = s.recv(65536)
        assert first.startswith(b"HTTP/1.1 200 OK\r\n") and b"Connection: close" not in first
        assert read_all(s) == b""


@pytest.mark.parametrize("request_bytes", [
    b"GET /healthz HTTP/1.1\r\n" + b"X-Big: " + b"a" * 100_000 + b"\r\n\r\n",
    b"GET /healthz HTTP/1.1\r\n" + b"X-Many: a\r\n" * 2000 + b"\r\n",
    b"GET /" + b"a" * 100_000 + b" HTTP/1.1\r\n\r\n",
])
def test_a_huge_request_is_refused_and_closed(server: Callable[..., http.Served],
                                              request_bytes: bytes) -> None:
    srv = server()
    answer = exchange(srv.port, request_bytes)
    assert answer.startswith(b"HTTP/1.1 431 Request Header Fields Too Large\r\n")
    assert b"Connection: close\r\n" in answer
    wait_for("the server forgot it", lambda: not srv.server.conns)


def test_a_request_just_under_the_header_cap_is_answered(
        server: Callable[..., http.Served]) -> None:
    srv = server(header_bytes=1024)
    head = b"GET /healthz HTTP/1.1\r\nConnection: close\r\nX-Pad: "
    padded = head + b"a" * (1024 - len(head) - 2) + b"\r\n"
    assert len(padded) == 1024
    assert exchange(srv.port, padded + b"\r\n").startswith(b"HTTP/1.1 200 OK\r\n")
    assert exchange(srv.port, padded[:-2] + b"aa\r\n\r\n").startswith(b"HTTP/1.1 431 ")


def test_a_body_is_not_read_and_its_connection_is_closed(
        server: Callable[..., http.Served]) -> None:
    srv = server()
    body = b"x" * 20_000
    answer = exchange(srv.port, b"GET /healthz HTTP/1.1\r\nContent-Length: %d\r\n\r\n" % len(body)
                      + body)
    assert answer.startswith(b"HTTP/1.1 200 OK\r\n") and b"Connection: close\r\n" in answer
    answer = exchange(srv.port, b"POST /healthz HTTP/1.1\r\nContent-Length: 3\r\n\r\nabc")
    assert answer.startswith(b"HTTP/1.1 501 ")
    # a client streaming a body forever is cut after a few bytes or the linger time
    with connect(srv.port) as s:
        s.sendall(b"PUT /healthz HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n")
        try:
            for _ in range(10_000):
                s.sendall(b"1000\r\n" + b"y" * 4096 + b"\r\n")
            raise AssertionError("an endless body is still being read")
        except (BrokenPipeError, ConnectionResetError):
            pass


def test_a_client_that_does_not_read_its_answer_is_cut(
        server: Callable[..., http.Served]) -> None:
    srv = http.serve("127.0.0.1", 0, {"/big": lambda: (200, {}, b"z" * 20_000_000)}, "big",
                     limits=http.Limits(write_timeout=0.3))
    try:
        with connect(srv.port) as s:
            s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
            s.sendall(b"GET /big HTTP/1.1\r\n\r\n")
            wait_for("the slow reader cut", lambda: not srv.server.conns)
    finally:
        srv.stop()


def test_keepalive_and_pipelining_are_answered_in_order_and_limited(
        server: Callable[..., http.Served]) -> None:
    srv = server(keepalive_requests=3)
    with connect(srv.port) as s:
        s.sendall(b"GET /healthz HTTP/1.1\r\n\r\nHEAD /livez HTTP/1.1\r\n\r\n"
                  b"GET /nothing HTTP/1.1\r\n\r\nGET /healthz HTTP/1.1\r\n\r\n")
        answers = read_all(s)  # the third answer closes the connection: the fourth is dropped
    parts = answers.split(b"HTTP/1.1 ")[1:]
    assert [p[:3] for p in parts] == [b"200", b"200", b"404"]
    assert b"Connection: close" not in parts[0] + parts[1]
    assert parts[1].endswith(b"\r\n\r\n")  # HEAD: no body
    assert parts[2].endswith(b"Connection: close\r\n\r\n404 page not found\n")


def test_http_1_0_is_answered_and_closed(server: Callable[..., http.Served]) -> None:
    srv = server()
    answer = exchange(srv.port, b"GET /healthz HTTP/1.0\r\n\r\n")
    assert answer.startswith(b"HTTP/1.1 200 OK\r\n") and b"Connection: close\r\n" in answer


@pytest.mark.parametrize("request_bytes,status", [
    (b"GET /healthz\r\n\r\n", b"400"),
    (b"GET  /healthz HTTP/1.1\r\n\r\n", b"400"),
    (b"GET /healthz HTTP/2.0\r\n\r\n", b"505"),
    (b"GET /healthz SPDY/3\r\n\r\n", b"400"),
    (b"GET /healthz HTTP/1.1\r\nno colon\r\n\r\n", b"400"),
    (b"GET /healthz HTTP/1.1\r\n folded: x\r\n\r\n", b"400"),
    (b"GET /healthz HTTP/1.1\r\nContent-Length: -1\r\n\r\n", b"400"),
    (b"\x16\x03\x01\x02\x00\x01\x00\x01\xfc\x03\x03\r\n\r\n", b"400"),  # TLS on a plain port
    (b"DELETE /healthz HTTP/1.1\r\n\r\n", b"501"),
])
def test_a_bad_request_is_refused_and_closed(server: Callable[..., http.Served],
                                             request_bytes: bytes, status: bytes) -> None:
    srv = server()
    answer = exchange(srv.port, request_bytes)
    assert answer.startswith(b"HTTP/1.1 " + status + b" ")
    assert b"Connection: close\r\n" in answer


def test_lf_only_lines_and_blank_lines_before_a_request_are_accepted(
        server: Callable[..., http.Served]) -> None:
    srv = server()
    answer = exchange(srv.port, b"\r\n\r\nGET /healthz HTTP/1.1\nConnection: close\n\n")
    assert answer.startswith(b"HTTP/1.1 200 OK\r\n")


def test_a_failing_route_answers_500_and_the_server_goes_on() -> None:
    def boom() -> tuple[int, dict[str, str], bytes]:
        raise RuntimeError("boom")

    srv = http.serve("127.0.0.1", 0, {"/boom": boom, "/ok": lambda: (200, {}, b"ok")}, "t")
    try:
        assert get(f"http://127.0.0.1:{srv.port}/boom")[0] == 500
        assert get(f"http://127.0.0.1:{srv.port}/ok")[::2] == (200, b"ok")
    finally:
        srv.stop()


def test_stop_closes_the_connections_it_holds(server: Callable[..., http.Served]) -> None:
    srv = server()
    with connect(srv.port) as s:
        wait_for("the connection held", lambda: len(srv.server.conns) == 1)
        srv.stop()
        assert read_all(s) == b""


@pytest.mark.parametrize("head,want", [
    (b"GET /healthz HTTP/1.1", http.Request("GET", "/healthz", True)),
    (b"HEAD /x?y HTTP/1.1\r\nHost: a", http.Request("HEAD", "/x?y", True)),
    (b"GET / HTTP/1.0", http.Request("GET", "/", False)),
    (b"GET / HTTP/1.1\r\nConnection: keep-alive, Close", http.Request("GET", "/", False)),
    (b"GET / HTTP/1.1\r\nContent-Length: 0", http.Request("GET", "/", True)),
    (b"GET / HTTP/1.1\r\nContent-Length: 1", http.Request("GET", "/", False, True)),
    (b"GET / HTTP/1.1\r\nTransfer-Encoding: chunked", http.Request("GET", "/", False, True)),
    (b"GET / HTTP/1.1\r\nContent-Length: 1x", 400),
    (b"", 400),
    (b"POST / HTTP/1.1", 501),
])
def test_parse_request(head: bytes, want: http.Request | int) -> None:
    assert http.parse_request(head) == want
