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


def parse_request(head: bytes) -> Request | int:
    """The request line and header lines (the bytes before the blank line), or the status to
    refuse them with. Pure: no sockets, tested on its own."""
    lines = head.decode("latin-1").split("\n")
    parts = lines[0].rstrip("\r").split(" ")
    if len(parts) != 3 or not parts[0] or not parts[1]:
        return 400
    method, target, version = parts
    if version not in ("HTTP/1.0", "HTTP/1.1"):
        return 505 if re.fullmatch(r"HTTP/\d+\.\d+", version) else 400
    connection, body = "", False
    for line in lines[1:]:
        if not line.strip("\r"):
            continue
        name, colon, value = line.rstrip("\r").partition(":")
        if not colon or not name or name != name.strip():
            return 400
        name, value = name.lower(), value.strip()
        if name == "connection":
            connection += "," + value.lower()
        elif name == "transfer-encoding":
            body = True
        elif name == "content-length":
            if not value.isdigit():
                return 400
            body = body or int(value) > 0
    if method not in ("GET", "HEAD"):
        return 501
    close = "close" in (t.strip() for t in connection.split(","))
    # HTTP/1.0 keep-alive is not offered; a body is never read, so its connection cannot go on
    return Request(method, target, version == "HTTP/1.1" and not close and not body, body)


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
