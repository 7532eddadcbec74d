"""Issue 32, item 9 (the HTTP half): request headers are parsed by RFC 9110/9112's grammar
(daemon/http_wire.py parse_request), and nothing a client sends makes the daemon log a
traceback, or more than a bounded amount: `Content-Length: ²` (a byte that str.isdigit()
accepts and int() refuses) logged a full traceback per request before."""

from __future__ import annotations

import contextlib
import json
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import structlog
from hypothesis import given, settings
from hypothesis import strategies as st

from ipvsproxy.daemon import http, http_loop
from ipvsproxy.daemon.health import Health
from ipvsproxy.daemon.http_wire import parse_request
from ipvsproxy.daemon.metrics import Metrics
from tests.unit.test_http_abuse import read_all

ROOT = Path(__file__).resolve().parents[2]
TCHAR = b"!#$%&'*+-.^_`|~0123456789abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ"
FIELD_VCHAR = bytes(range(0x21, 0x7F)) + bytes(range(0x80, 0x100))
CTL = bytes(b for b in range(0x20) if b not in (0x09, 0x0A)) + b"\x7f"  # LF ends the line
NOT_DIGITS = "²³¹¼٣۳߃३০੩૩୩௩౩೩൩๓໓༣၃႓០᠓᥉᧓᭓᮳᱃᱓꘣꣓꤃꧓꩓꯳０"  # each .isdigit() or .isnumeric()


def head(*fields: bytes, line: bytes = b"GET /healthz HTTP/1.1") -> bytes:
    return b"\r\n".join([line, *fields])


@pytest.mark.parametrize("request_head,want", [
    # the attack, and numbers Python reads that the RFC's DIGIT is not
    (head("Content-Length: ²".encode("latin-1")), 400),
    (head("Content-Length: ²".encode()), 400),
    (head("Content-Length: \uff13".encode()), 400),  # a fullwidth 3
    (head(b"Content-Length: " + b"9" * 5000), 400),  # int() refuses > 4300 digits
    (head(b"Content-Length: 9223372036854775808"), 400),  # beyond int64, as Go
    (head(b"Content-Length: 9223372036854775807"), http.Request("GET", "/healthz", False, True)),
    (head(b"Content-Length: " + b"0" * 100), http.Request("GET", "/healthz", True)),
    (head(b"Content-Length: +1"), 400),
    (head(b"Content-Length: 1 1"), 400),
    (head(b"Content-Length: 1, 1"), 400),
    (head(b"Content-Length:"), 400),
    (head(b"Content-Length: 1", b"Content-Length: 2"), 400),
    (head(b"Content-Length: 1", b"content-length:  1 "), http.Request("GET", "/healthz", False,
                                                                      True)),
    # field names are tokens, right before the colon
    (head(b"X Y: z"), 400),
    (head(b"X-Y : z"), 400),
    (head(b"X-Y\t: z"), 400),
    (head(b": z"), 400),
    (head(b"X(Y): z"), 400),
    (head(b"X-\xff: z"), 400),
    (head(b"X-Y: z", b" folded"), 400),  # obs-fold
    (head(b"\tX-Y: z"), 400),  # whitespace before the first field
    (head(b"X-Y: z", b""), 400),
    # field values: VCHAR, obs-text, SP and HTAB; no other control
    (head(b"X-Y: a\tb \x80\xff c"), http.Request("GET", "/healthz", True)),
    (head(b"X-Y: a\x00b"), 400),
    (head(b"X-Y: a\rb"), 400),  # a bare CR
    (head(b"X-Y: a\x7fb"), 400),
    (head(b"X-Y: a\x1bb"), 400),
    (head(b"X-Y: z\r"), 400),  # the last line's CR is a bare one (its CRLF ended the head)
    # the request line
    (head(line=b"GET /\x00 HTTP/1.1"), 400),
    (head(line="GET /é HTTP/1.1".encode()), 400),
    (head(line=b"G(T / HTTP/1.1"), 400),
    (head(line=b"GET / HTTP/1.1 "), 400),
    (head(line=b"GET\t/ HTTP/1.1"), 400),
    (head(line=b"GET / http/1.1"), 400),
    (head(line=b"GET / HTTP/11.1"), 400),
    (head(line="GET / HTTP/\u0661.\u0661".encode()), 400),  # Arabic-Indic digits
    (head(line=b"GET / HTTP/3.0"), 505),
    (head(line=b"GET / HTTP/1.2"), http.Request("GET", "/", True)),  # as 1.1 (RFC 9110 2.5)
    (head(line=b"BREW / HTTP/1.1"), 501),
    (head(b"X-Y: a\x00", line=b"BREW / HTTP/1.1"), 400),  # grammar first
    (head(b"Connection: Keep-Alive,\tCLOSE", line=b"GET / HTTP/1.1"),
     http.Request("GET", "/", False)),
    (b"GET / HTTP/1.1\nHost: a\r\nX: y", http.Request("GET", "/", True)),  # bare LF ends lines
])
def test_the_grammar(request_head: bytes, want: http.Request | int) -> None:
    assert parse_request(request_head) == want


@settings(max_examples=2000, deadline=None)
@given(st.binary(max_size=300))
def test_no_bytes_make_the_parser_raise(data: bytes) -> None:
    for candidate in (data, head(data), head(b"Content-Length: " + data),
                      head(line=b"GET " + data + b" HTTP/1.1")):
        assert parse_request(candidate) in (400, 501, 505) or \
            isinstance(parse_request(candidate), http.Request)


names = st.binary(min_size=1, max_size=20).map(
    lambda b: bytes(TCHAR[x % len(TCHAR)] for x in b))
values = st.binary(max_size=40).map(
    lambda b: bytes(FIELD_VCHAR[x % len(FIELD_VCHAR)] for x in b))
ows = st.sampled_from([b"", b" ", b"\t", b" \t "])


@settings(max_examples=500, deadline=None)
@given(st.lists(st.tuples(names, ows, values, ows), max_size=8))
def test_every_field_the_grammar_allows_is_accepted(
        fields: list[tuple[bytes, bytes, bytes, bytes]]) -> None:
    lines = [n + b":" + a + v + b for n, a, v, b in fields
             if n.lower() not in (b"content-length", b"transfer-encoding", b"connection")]
    assert parse_request(head(*lines)) == http.Request("GET", "/healthz", True)


@settings(max_examples=500, deadline=None)
@given(names, values, st.sampled_from(CTL), st.integers(min_value=0),
       st.sampled_from(["name", "value"]))
def test_a_control_byte_anywhere_in_a_field_is_refused(
        name: bytes, value: bytes, ctl: int, at: int, where: str) -> None:
    if where == "name":
        i = at % (len(name) + 1)
        name = name[:i] + bytes([ctl]) + name[i:]
    else:
        i = at % (len(value) + 1)
        value = value[:i] + bytes([ctl]) + value[i:]
    assert parse_request(head(name + b": " + value)) == 400


@settings(max_examples=200, deadline=None)
@given(st.sampled_from(NOT_DIGITS), st.text("0123456789", max_size=3))
def test_a_content_length_of_other_digits_is_refused(digit: str, around: str) -> None:
    for enc in ("utf-8", "latin-1"):
        with contextlib.suppress(UnicodeEncodeError):
            value = (around + digit + around).encode(enc)
            assert parse_request(head(b"Content-Length: " + value)) == 400


# --- on a live server: answers, and what gets logged -------------------------------------------

@pytest.fixture(scope="module")
def live() -> Iterator[http.Served]:
    health = Health((4,), 30.0)
    health.updated(4)
    srv = http.start_healthz("127.0.0.1:0", health, Metrics())
    yield srv
    srv.stop()


def exchange(port: int, data: bytes) -> bytes:
    """Send data, and read until the server closes; b"" when no answer came in 5 s."""
    with socket.create_connection(("127.0.0.1", port), timeout=5) as s:
        s.sendall(data)
        with contextlib.suppress(BrokenPipeError):
            s.shutdown(socket.SHUT_WR)
        try:
            return read_all(s)
        except TimeoutError:
            return b""


@settings(max_examples=300, deadline=None)
@given(st.binary(max_size=200), st.sampled_from([b"X-Fuzz: ", b"Content-Length: ", b""]))
def test_fuzzed_header_bytes_are_answered_and_log_nothing(
        live: http.Served, data: bytes, prefix: bytes) -> None:
    request = b"GET /healthz HTTP/1.1\r\nConnection: close\r\n" + prefix + data + b"\r\n\r\n"
    with structlog.testing.capture_logs() as logs:
        answer = exchange(live.port, request)
    assert answer[:12] in (b"HTTP/1.1 200", b"HTTP/1.1 400", b"HTTP/1.1 431"), answer[:100]
    assert logs == []


def test_the_content_length_flood_is_refused_and_logs_nothing() -> None:
    """The issue's attack on a process logging as the daemon does: 1,000 requests, each
    `Content-Length: ²` (and the like), each answered 400 and closed; the log stays empty."""
    with tempfile.TemporaryFile() as log:
        child = subprocess.Popen([sys.executable, "-m", "tests.unit.http_child"], cwd=ROOT,
                                 stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=log,
                                 text=True)
        assert child.stdin is not None and child.stdout is not None
        try:
            child.stdin.write("[]\n")
            child.stdin.flush()
            port = json.loads(child.stdout.readline())["healthz"]
            log.seek(0, 2)
            before = log.tell()
            bad = [b"\xb2", "²".encode(), b"9" * 5000, b"\xb9\xb3", "٣".encode()]
            for i in range(1000):
                answer = exchange(port, b"GET /healthz HTTP/1.1\r\nHost: node\r\n"
                                        b"Content-Length: " + bad[i % len(bad)] + b"\r\n\r\n")
                if not answer.startswith(b"HTTP/1.1 400 ") or b"Connection: close\r\n" \
                        not in answer:
                    break
            good = exchange(port, b"GET /healthz HTTP/1.1\r\nConnection: close\r\n\r\n")
            time.sleep(0.2)  # anything the server still had to write
            log.seek(0, 2)
            written = log.tell() - before
            log.seek(before)
            text = log.read().decode(errors="replace")
        finally:
            child.stdin.close()
            child.wait(20)
    assert i == 999 and answer.startswith(b"HTTP/1.1 400 "), f"request {i}: {answer[:200]!r}"
    assert good.startswith(b"HTTP/1.1 200 ")
    assert written == 0, f"{written} bytes of log: {text[:2000]}"


def test_server_errors_are_logged_once_a_minute_whatever_their_number(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """Should some input still reach a bug, the log grows by one traceback, then by one line a
    minute at most (with the count since), not by a traceback per request."""
    def broken(head: bytes) -> Any:
        raise ValueError("a bug the grammar did not catch")

    quiet = http_loop._Quiet("http server error")
    monkeypatch.setattr(http_loop, "parse_request", broken)
    monkeypatch.setattr(http_loop, "_SERVER_ERROR", quiet)
    srv = http.serve("127.0.0.1", 0, {"/": lambda: (200, {}, b"ok")}, "t")
    try:
        with structlog.testing.capture_logs() as logs:
            for _ in range(200):
                exchange(srv.port, b"GET / HTTP/1.1\r\n\r\n")
            quiet._next = 0.0  # a minute later
            exchange(srv.port, b"GET / HTTP/1.1\r\n\r\n")
    finally:
        srv.stop()
    assert [(e["event"], "exc_info" in e and e["exc_info"]) for e in logs] == \
        [("http server error", True), ("http server error", False)]
    assert logs[1]["repeated"] == 199


def test_a_broken_route_is_logged_once_a_minute_too(monkeypatch: pytest.MonkeyPatch) -> None:
    def boom() -> tuple[int, dict[str, str], bytes]:
        raise RuntimeError("boom")

    monkeypatch.setattr(http_loop, "_ANSWER_FAILED", http_loop._Quiet("http answer failed"))
    srv = http.serve("127.0.0.1", 0, {}, "t", fallback=boom)
    try:
        with structlog.testing.capture_logs() as logs:
            answers = [exchange(srv.port, b"GET /" + b"a" * 4000 + b" HTTP/1.1\r\n\r\n")
                       for _ in range(50)]
    finally:
        srv.stop()
    assert {a[:12] for a in answers} == {b"HTTP/1.1 500"}
    assert len(logs) == 1 and len(logs[0]["path"]) <= 100
