"""The bytes of the daemon's HTTP: a request's line and headers parsed (parse_request: a
Request, or the status that refuses it), and an answer written out (status line, headers, Date,
Content-Length, and `Connection: close` when the connection ends with it), JSON ones as
kube-proxy's health handlers write them (json_answer). Pure: no sockets, tested on its own.

Owns the format only; reading requests off sockets, the limits on what a client may send, and
when connections close are daemon/http.py's. Requests are GET and HEAD; a body is noted (the
connection cannot go on after it) but never read.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from dataclasses import dataclass
from email.utils import formatdate
from http import HTTPStatus
from typing import Any

# (status, headers, body) for a path; None: 404
Route = Callable[[], tuple[int, dict[str, str], bytes]]
JSON = "application/json"
TEXT = "text/plain; charset=utf-8"
NOSNIFF_TEXT = {"Content-Type": TEXT, "X-Content-Type-Options": "nosniff"}


@dataclass(frozen=True, slots=True)
class Request:
    method: str
    target: str
    keep_alive: bool  # HTTP/1.1, no "Connection: close" and no body to skip
    body: bool = False  # one follows (never read)


# RFC 9110 5.6.2: token = 1*tchar
_TOKEN = rb"[!#$%&'*+\-.^_`|~0-9A-Za-z]+"
# RFC 9112 3: method SP request-target SP HTTP-version; the target is ASCII without spaces or
# controls (RFC 3986's characters, and more: a path we do not know is a 404, not a 400)
_REQUEST_LINE = re.compile(rb"(" + _TOKEN + rb") ([\x21-\x7e]+) ([\x21-\x7e]+)")
_VERSION = re.compile(rb"HTTP/([0-9])\.[0-9]")  # RFC 9112 2.3, case-sensitive
# RFC 9112 5: field-name ":" OWS field-value OWS, the value's bytes VCHAR, obs-text, SP and
# HTAB (RFC 9110 5.5); any other control (NUL, a bare CR, DEL ...) makes the line invalid.
# Nothing here backtracks: the value's surrounding whitespace is stripped after the match.
_FIELD_LINE = re.compile(rb"(" + _TOKEN + rb"):([\t\x20-\x7e\x80-\xff]*)")
_DIGITS = re.compile(rb"[0-9]+")
_MAX_LENGTH = (1 << 63) - 1  # as Go's net/http: a Content-Length beyond int64 is refused


def parse_request(head: bytes) -> Request | int:
    """The request line and header lines (the bytes before the blank line), or the status to
    refuse them with: 400 for anything outside RFC 9112's grammar (a field name that is not a
    token, a control byte, obs-fold, a Content-Length that is not 1*DIGIT or differs between
    lines), 505 for an HTTP version other than 1.x, 501 for a method other than GET and HEAD.
    Never raises, whatever the bytes. Pure: no sockets, tested on its own."""
    # RFC 9112 2.2: lines end in CRLF; a bare LF is accepted, a bare CR is not. The last line's
    # end went with the blank line after it (daemon/http.py), so a CR left there is a bare one.
    *ended, last = head.split(b"\n")
    lines = [line[:-1] if line.endswith(b"\r") else line for line in ended] + [last]
    start = _REQUEST_LINE.fullmatch(lines[0])
    if start is None:
        return 400
    method, target, version = start.groups()
    major = _VERSION.fullmatch(version)
    if major is None:
        return 400
    if major[1] != b"1":
        return 505
    connection: list[bytes] = []
    length: bytes | None = None
    body = False
    for line in lines[1:]:
        # RFC 9112 5.2: obs-fold (a line starting with SP or HTAB), and whitespace before the
        # first field (2.2), are refused; so is a name followed by whitespace (5.1)
        field = _FIELD_LINE.fullmatch(line)
        if field is None:
            return 400
        name, value = field[1].lower(), field[2].strip(b" \t")
        if name == b"connection":
            connection += value.lower().split(b",")
        elif name == b"transfer-encoding":
            body = True
        elif name == b"content-length":
            # RFC 9110 8.6: 1*DIGIT, ASCII digits only; several lines must agree (Go's rule)
            if _DIGITS.fullmatch(value) is None or length not in (None, value):
                return 400
            length = value
            digits = value.lstrip(b"0")
            if len(digits) > 19 or int(digits or b"0") > _MAX_LENGTH:
                return 400
            body = body or bool(digits)
    if method not in (b"GET", b"HEAD"):
        return 501
    close = b"close" in (t.strip(b" \t") for t in connection)
    # HTTP/1.0 keep-alive is not offered; a body is never read, so its connection cannot go on;
    # HTTP/1.2 and on are answered as 1.1 (RFC 9110 2.5)
    keep_alive = version != b"HTTP/1.0" and not close and not body
    return Request(method.decode(), target.decode(), keep_alive, body)


def _answer(status: int, headers: dict[str, str], body: bytes, send_body: bool,
            close: bool) -> bytes:
    lines = [f"HTTP/1.1 {status} {_phrase(status)}"]
    lines += [f"{k}: {v}" for k, v in headers.items()]
    lines += [f"Date: {formatdate(usegmt=True)}", f"Content-Length: {len(body)}"]
    if close:
        lines.append("Connection: close")
    return ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1") + (body if send_body else b"")


def _error(status: int) -> bytes:
    return _answer(status, dict(NOSNIFF_TEXT), f"{status} {_phrase(status)}\n".encode(), True,
                   True)


def _phrase(status: int) -> str:
    try:
        return HTTPStatus(status).phrase
    except ValueError:
        return "Status"


def json_answer(status: int, doc: Any) -> tuple[int, dict[str, str], bytes]:
    """A JSON answer as kube-proxy's health handlers write it (compact, nosniff)."""
    return status, {"Content-Type": JSON, "X-Content-Type-Options": "nosniff"}, \
        json.dumps(doc, separators=(",", ":")).encode()
