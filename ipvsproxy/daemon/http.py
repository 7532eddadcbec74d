"""The daemon's HTTP servers: /healthz and /livez (--healthz-bind-address), /metrics,
/proxyMode and a plain /healthz (--metrics-bind-address), and the small server machinery the
health-check node ports (daemon/hcnp.py) share.

Owns listening and answering only; how a request is parsed and an answer written is
daemon/http_wire.py's, what is answered comes from daemon/health.py and daemon/metrics.py.
/healthz listens on every address of every node, so anyone who can reach a node can try to
exhaust it: each server is one thread running one selector loop over sockets that
are never waited on, and what a client may cost it is bounded by Limits (connections held,
time and bytes to send a request, time to take an answer). Requests are GET and HEAD without
bodies; anything else is answered and the connection closed. Routes run on the server's
thread, one at a time. Silent per request; a server error is logged at most once a minute.
Must not: start a thread per client, or read a request body.
"""

from __future__ import annotations

import contextlib
import errno
import re
import selectors
import socket
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import structlog
from prometheus_client.exposition import CONTENT_TYPE_PLAIN_0_0_4

from ipvsproxy.config import parse_bind_address
from ipvsproxy.daemon.http_wire import (
    NOSNIFF_TEXT,
    Route,
    _answer,
    _error,
    json_answer,
    parse_request,
)
from ipvsproxy.daemon.http_wire import Request as Request  # what parse_request gives

log = structlog.get_logger("ipvsproxy.http")

WILDCARDS = ("", "0.0.0.0", "::")
HEALTHZ_PORT = 10256
METRICS_PORT = 10249


@dataclass(frozen=True, slots=True)
class Limits:
    """What one server lets its clients cost. A kubelet probe or a load balancer check is one
    small request answered at once; these leave it a wide margin and an attacker little."""

    connections: int = 256  # held at once; one more evicts the oldest not being answered
    request_timeout: float = 5.0  # accept (or the previous answer) to the end of the headers
    header_bytes: int = 8192  # request line and headers together (Go's default is 1 MiB)
    write_timeout: float = 10.0  # to hand a whole answer to the kernel
    keepalive_requests: int = 100  # answers on one connection, then it is closed
    linger: float = 1.0  # after the last answer, for the client to close first


LIMITS = Limits()
_RECV = 16384
_LINGER_BYTES = 65536  # read and dropped while lingering, then the connection is cut
# accepts per wakeup: a burst is taken in few wakeups (each waits its turn for the GIL while
# the reconciler computes), yet the connections already held are heard between batches
_ACCEPT_BATCH = 256
_SWEEP_GRAIN = 0.05  # deadlines are checked at most this often under load
# Accepted sockets stay blocking and each call is told not to wait: one fcntl() less per
# connection (see _accept on why system calls count)
_NOWAIT = socket.MSG_DONTWAIT
_HEADER_END = re.compile(rb"\r?\n\r?\n")
_READ, _WRITE, _LINGER, _CLOSED = "read", "write", "linger", "closed"


class _Conn:
    __slots__ = ("after", "buf", "deadline", "drained", "events", "out", "served", "sock",
                 "state")

    def __init__(self, sock: socket.socket) -> None:
        self.sock = sock
        self.state = _READ
        self.deadline = 0.0
        self.buf = bytearray()  # what the client sent and was not answered yet
        self.out = memoryview(b"")  # what is left of the answer
        self.after = _READ  # once the answer is out: _READ (keep-alive), _LINGER or _CLOSED
        self.served = 0
        self.drained = 0
        self.events = 0  # registered with the selector for these; 0: not registered


class _Quiet:
    """One kind of server error, logged with its traceback the first time and then at most once
    a minute, with how many came meanwhile: whatever clients send, what they make the daemon log
    is bounded (issue 32, item 9)."""

    def __init__(self, event: str, level: str = "error", every: float = 60.0) -> None:
        self.event, self.level, self.every = event, level, every
        self._next = 0.0
        self._missed = 0
        self._traced = False

    def __call__(self, exc_info: bool = False, **fields: Any) -> None:
        now = time.monotonic()
        if now < self._next:
            self._missed += 1
            return
        self._next = now + self.every
        trace = exc_info and not self._traced
        self._traced = self._traced or trace
        if self._missed:
            fields["repeated"] = self._missed  # since the last line
            self._missed = 0
        getattr(log, self.level)(self.event, exc_info=trace, **fields)


_SERVER_ERROR = _Quiet("http server error")
_ANSWER_FAILED = _Quiet("http answer failed")
_ACCEPT_FAILED = _Quiet("http accept failed", "warning")


class _Server:
    """One listening socket and its connections, served by serve_forever() in one thread: no
    thread, stack or buffer per client beyond Limits, whatever the clients do."""

    def __init__(self, sock: socket.socket, routes: dict[str, Route], fallback: Route | None,
                 limits: Limits) -> None:
        self.socket = sock
        self.server_address = sock.getsockname()
        self.routes, self.fallback, self.limits = routes, fallback, limits
        # insertion order is the eviction order: a connection is moved to the end each time it
        # starts waiting for a new request
        self.conns: dict[_Conn, None] = {}
        self._sel = selectors.DefaultSelector()
        self._wake_r, self._wake_w = socket.socketpair()  # stop() interrupts select() at once
        self._stopping = False
        self._next_sweep = float("inf")
        self._paused_until = 0.0  # accept() failed for want of fds: retry then

    def serve_forever(self) -> None:
        self._sel.register(self.socket, selectors.EVENT_READ)
        self._sel.register(self._wake_r, selectors.EVENT_READ)
        try:
            while not self._stopping:
                wait = self._next_sweep - time.monotonic()
                for key, mask in self._sel.select(None if wait == float("inf") else wait):
                    try:
                        self._ready(key.fileobj, key.data, mask)
                    except Exception:  # a bug with one client must not take /healthz down
                        _SERVER_ERROR(exc_info=True)
                        if key.data is not None:
                            self._close(key.data)
                if time.monotonic() >= self._next_sweep:
                    self._sweep()
        finally:
            for conn in list(self.conns):
                self._close(conn)
            self._sel.close()
            self.socket.close()
            self._wake_r.close()
            self._wake_w.close()

    def _ready(self, fileobj: Any, conn: _Conn | None, mask: int) -> None:
        if conn is None:
            if fileobj is self.socket:
                self._accept()
        elif conn.state == _WRITE and mask & selectors.EVENT_WRITE:
            self._write(conn)
            self._serve_buffered(conn)
        elif conn.state in (_READ, _LINGER):  # not closed earlier in this batch
            self._read(conn)

    def shutdown(self) -> None:
        self._stopping = True
        with contextlib.suppress(OSError):  # already stopped
            self._wake_w.send(b"x")

    def _accept(self) -> None:
        for _ in range(_ACCEPT_BATCH):
            try:
                sock, _ = self.socket.accept()
            except (BlockingIOError, InterruptedError):
                return
            except OSError as exc:
                if exc.errno in (errno.EMFILE, errno.ENFILE, errno.ENOBUFS, errno.ENOMEM):
                    # the connection stays queued and the listener readable: without a pause
                    # this loop would spin
                    self._sel.unregister(self.socket)
                    self._paused_until = time.monotonic() + 0.1
                    self._next_sweep = min(self._next_sweep, self._paused_until)
                    _ACCEPT_FAILED(error=exc.strerror)
                    return
                continue  # ECONNABORTED and the like: that client is gone
            if len(self.conns) >= self.limits.connections:
                self._evict()
            conn = _Conn(sock)
            self.conns[conn] = None
            self._deadline(conn, self.limits.request_timeout)
            # A probe's request has usually arrived by now: answered here, it costs no selector
            # registration and no wakeup. That matters: each system call lets the reconciler
            # take the GIL, and getting it back can take sys.getswitchinterval() (5 ms).
            try:
                self._read(conn)
            except Exception:  # as in serve_forever: that client goes, the others stay
                _SERVER_ERROR(exc_info=True)
                self._close(conn)
            if conn.state == _READ:
                self._want(conn, selectors.EVENT_READ)

    def _evict(self) -> None:
        """Make room by closing the oldest connection that is not being answered: idle ones and
        slow senders go first, in the order they came, so a newcomer (the kubelet) gets its turn
        however many an attacker holds open. Only when all are being answered does one of those
        go (each has write_timeout anyway)."""
        victim = next((c for c in self.conns if c.state != _WRITE), None)
        self._close(victim if victim is not None else next(iter(self.conns)))

    def _read(self, conn: _Conn) -> None:
        try:
            data = conn.sock.recv(_LINGER_BYTES if conn.state == _LINGER else _RECV, _NOWAIT)
        except (BlockingIOError, InterruptedError):
            return
        except OSError:
            data = b""
        if not data:
            self._close(conn)
        elif conn.state == _LINGER:
            conn.drained += len(data)
            if conn.drained > _LINGER_BYTES:
                self._close(conn)
        else:
            conn.buf += data
            self._serve_buffered(conn)

    def _serve_buffered(self, conn: _Conn) -> None:
        """Answer the requests waiting in conn.buf (pipelined ones too), while answers go out
        at once; a loop, not recursion, so a client cannot choose the stack depth."""
        while conn.state == _READ:
            if conn.buf.startswith((b"\r", b"\n")):  # RFC 9112 2.2: blank lines before a request
                del conn.buf[:len(conn.buf) - len(conn.buf.lstrip(b"\r\n"))]
            # the cap counts the request line and header lines with their line ends, not the
            # blank line that ends them
            most = self.limits.header_bytes + 2
            end = _HEADER_END.search(conn.buf, 0, most)
            if end is None:
                if len(conn.buf) >= most:
                    self._send(conn, _error(431), _LINGER)
                return
            head = bytes(conn.buf[:end.start()])
            del conn.buf[:end.end()]
            req = parse_request(head)
            if isinstance(req, int):
                self._send(conn, _error(req), _LINGER)
                return
            conn.served += 1
            close = not req.keep_alive or conn.served >= self.limits.keepalive_requests
            # unread bytes (a body, pipelined requests) must be lingered over; else close at once
            after = _READ if not close else _LINGER if req.body or conn.buf else _CLOSED
            path = req.target.split("?", 1)[0]
            route = self.routes.get(path, self.fallback)
            if route is None:  # Go's ServeMux NotFound
                status, headers, body = 404, dict(NOSNIFF_TEXT), b"404 page not found\n"
            else:
                try:
                    status, headers, body = route()
                except Exception:
                    _ANSWER_FAILED(exc_info=True, path=path[:100])
                    self._send(conn, _error(500), _LINGER)
                    return
            self._send(conn, _answer(status, headers, body, req.method == "GET", close), after)

    def _send(self, conn: _Conn, data: bytes, after: str) -> None:
        conn.state, conn.out, conn.after = _WRITE, memoryview(data), after
        self._deadline(conn, self.limits.write_timeout)
        self._write(conn)

    def _write(self, conn: _Conn) -> None:
        try:
            sent = conn.sock.send(conn.out, _NOWAIT)
        except (BlockingIOError, InterruptedError):
            sent = 0
        except OSError:
            self._close(conn)
            return
        conn.out = conn.out[sent:]
        if conn.out:  # the client reads slowly: wait for room, and read nothing meanwhile
            self._want(conn, selectors.EVENT_WRITE)
        elif conn.after == _LINGER:
            self._linger(conn)
        elif conn.after == _CLOSED:
            self._close(conn)
        else:
            conn.state = _READ
            del self.conns[conn]
            self.conns[conn] = None
            self._deadline(conn, self.limits.request_timeout)
            self._want(conn, selectors.EVENT_READ)

    def _linger(self, conn: _Conn) -> None:
        """Closing with unread bytes (a body, a header cut short at 431) would send a reset that
        can destroy the answer before the client reads it: send FIN, then drop what comes until
        the client closes too, for a short time and a few bytes (Apache's lingering close)."""
        try:
            conn.sock.shutdown(socket.SHUT_WR)
        except OSError:
            self._close(conn)
            return
        conn.state, conn.buf = _LINGER, bytearray()
        self._deadline(conn, self.limits.linger)
        self._want(conn, selectors.EVENT_READ)

    def _want(self, conn: _Conn, events: int) -> None:
        if not conn.events:
            self._sel.register(conn.sock, events, conn)
        elif conn.events != events:
            self._sel.modify(conn.sock, events, conn)
        conn.events = events

    def _deadline(self, conn: _Conn, seconds: float) -> None:
        conn.deadline = time.monotonic() + seconds
        self._next_sweep = min(self._next_sweep, conn.deadline)

    def _sweep(self) -> None:
        """Cut every connection past its deadline (slowloris, a stuck reader, a lingering
        close); the deadline covers a whole request or answer, not one recv or send."""
        now = time.monotonic()
        nxt = float("inf")
        for conn in list(self.conns):
            if conn.deadline <= now:
                self._close(conn)
            else:
                nxt = min(nxt, conn.deadline)
        if self._paused_until:
            if now >= self._paused_until:
                self._paused_until = 0.0
                self._sel.register(self.socket, selectors.EVENT_READ)
            else:
                nxt = min(nxt, self._paused_until)
        self._next_sweep = max(nxt, now + _SWEEP_GRAIN)

    def _close(self, conn: _Conn) -> None:
        if conn.state == _CLOSED:
            return
        conn.state = _CLOSED
        self.conns.pop(conn, None)
        if conn.events:
            self._sel.unregister(conn.sock)
        conn.sock.close()


class Served:
    """A running server: the port it is bound to, and stop()."""

    def __init__(self, server: _Server, name: str) -> None:
        self.server = server
        self.host = str(server.server_address[0])
        self.port = int(server.server_address[1])
        self._thread = threading.Thread(target=server.serve_forever, name=name, daemon=True)
        self._thread.start()

    def stop(self) -> None:
        """Close the listener and every connection; the port is free when this returns."""
        self.server.shutdown()
        self._thread.join(5)


def _listen(family: socket.AddressFamily, addr: str, port: int, dual: bool) -> socket.socket:
    sock = socket.socket(family, socket.SOCK_STREAM)
    try:
        # as HTTPServer did: rebinding right after a restart must not wait out TIME_WAIT
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        if dual:
            # Go listens on both families for a wildcard address ("0.0.0.0", "::" or ""), and
            # so does kube-proxy (service_health.go: "go treats them all the same").
            sock.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 0)
        sock.bind((addr, port))
        # a burst must queue, not have its SYNs dropped and retried a second later (the old
        # backlog of 5); Go asks for net.core.somaxconn too, which caps this
        sock.listen(socket.SOMAXCONN)
        sock.setblocking(False)
    except OSError:
        sock.close()
        raise
    return sock


def serve(host: str, port: int, routes: dict[str, Route], name: str,
          fallback: Route | None = None, limits: Limits = LIMITS) -> Served:
    """Listen on host:port (a wildcard host on both families when the host has IPv6) and answer
    routes by path, fallback (or 404) otherwise. OSError when the address cannot be bound."""
    candidates: list[tuple[socket.AddressFamily, str, bool]]
    if host in WILDCARDS and socket.has_ipv6:
        candidates = [(socket.AF_INET6, "::", True), (socket.AF_INET, "0.0.0.0", False)]
    elif ":" in host:
        candidates = [(socket.AF_INET6, host, False)]
    else:
        candidates = [(socket.AF_INET, host or "0.0.0.0", False)]
    for i, (family, addr, dual) in enumerate(candidates):
        try:
            sock = _listen(family, addr, port, dual)
            break
        except OSError as exc:
            # no IPv6 on this host (EAFNOSUPPORT, EADDRNOTAVAIL): IPv4 only, as Go would do
            no_ipv6 = exc.errno in (errno.EAFNOSUPPORT, errno.EADDRNOTAVAIL)
            if i + 1 == len(candidates) or not no_ipv6:
                raise OSError(exc.errno, f"cannot listen on {_join(host, port)}: "
                                         f"{exc.strerror or exc}") from None
    return Served(_Server(sock, routes, fallback, limits), name)


def _join(host: str, port: int) -> str:
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


def _bind_address(addr: str, default_port: int) -> tuple[str, int]:
    """parse_bind_address, failing as a listener does (OSError): the caller reports both."""
    try:
        return parse_bind_address(addr, default_port)
    except ValueError as exc:
        raise OSError(errno.EINVAL, str(exc)) from None


def start_healthz(addr: str, health: Any, metrics: Any, limits: Limits = LIMITS) -> Served:
    """--healthz-bind-address: /healthz and /livez (proxy_health.go healthzHandler and
    livezHandler), each answer counted in kubeproxy_proxy_{healthz,livez}_total by code."""
    host, port = _bind_address(addr, HEALTHZ_PORT)

    def probe(check: Callable[[], tuple[int, dict[str, Any]]], counter: str) -> Route:
        def route() -> tuple[int, dict[str, str], bytes]:
            status, doc = check()
            if metrics is not None:
                getattr(metrics, counter).labels(code=str(status)).inc()
            return json_answer(status, doc)
        return route

    routes = {"/healthz": probe(health.healthz, "healthz_total"),
              "/livez": probe(health.livez, "livez_total")}
    return serve(host, port, routes, "healthz", limits=limits)


def start_metrics(addr: str, metrics: Any) -> Served:
    """--metrics-bind-address: /metrics, /proxyMode ("ipvs") and component-base's /healthz
    ("ok"), as kube-proxy's serveMetrics (cmd/kube-proxy/app/server.go)."""
    host, port = _bind_address(addr, METRICS_PORT)
    routes: dict[str, Route] = {
        "/metrics": lambda: (200, {"Content-Type": CONTENT_TYPE_PLAIN_0_0_4}, metrics.render()),
        "/proxyMode": lambda: (200, NOSNIFF_TEXT, b"ipvs"),
        "/healthz": lambda: (200, NOSNIFF_TEXT, b"ok"),
    }
    return serve(host, port, routes, "metrics")
