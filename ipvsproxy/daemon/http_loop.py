"""One HTTP server thread's selector loop (Loop.serve_forever): its listeners, their
connections, reading requests and writing answers, and the limits on what a client may cost
(Limits per listener; the process's Budget across every server, daemon/fds.py). Used by
daemon/http.py, which starts the servers; how bytes become a request and an answer is
daemon/http_wire.py's.

Sockets are never waited on: one select() serves every connection. When the process's
connections are at their budget, a newcomer costs the listener holding the most its oldest
connection not being answered, in whichever server's thread that listener is (asked through
its wakeup socket; meanwhile this loop stops accepting, the newcomers waiting in the kernel's
accept queue at no descriptor's cost). Silent per request; a server error is logged at most
once a minute. Must not: start a thread, or read a request body.
"""

from __future__ import annotations

import contextlib
import errno
import re
import selectors
import socket
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import structlog

from ipvsproxy.daemon import fds
from ipvsproxy.daemon.fds import Budget
from ipvsproxy.daemon.http_wire import (
    NOSNIFF_TEXT,
    Route,
    _answer,
    _error,
    parse_request,
)

log = structlog.get_logger("ipvsproxy.http")


@dataclass(frozen=True, slots=True)
class Limits:
    """What one server lets its clients cost. A kubelet probe or a load balancer check is one
    small request answered at once; these leave it a wide margin and an attacker little."""

    connections: int = 256  # held at once per listener; one more evicts the oldest not being
    # answered (and all the process's servers share one total: daemon/fds.py Budget)
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
    __slots__ = ("after", "buf", "deadline", "door", "drained", "events", "out", "served",
                 "sock", "state")

    def __init__(self, sock: socket.socket, door: Listener) -> None:
        self.sock = sock
        self.door = door
        self.state = _READ
        self.deadline = 0.0
        self.buf = bytearray()  # what the client sent and was not answered yet
        self.out = memoryview(b"")  # what is left of the answer
        self.after = _READ  # once the answer is out: _READ (keep-alive), _LINGER or _CLOSED
        self.served = 0
        self.drained = 0
        self.events = 0  # registered with the selector for these; 0: not registered


class Listener:
    """One listening socket of a server: what it answers, and the connections it took (in
    eviction order: a connection moves to the end each time it starts waiting for a request)."""

    __slots__ = ("closed", "conns", "fallback", "host", "port", "registered", "routes", "server",
                 "sock")

    def __init__(self, sock: socket.socket, routes: dict[str, Route], fallback: Route | None,
                 server: Loop) -> None:
        self.sock, self.routes, self.fallback, self.server = sock, routes, fallback, server
        address = sock.getsockname()
        self.host, self.port = str(address[0]), int(address[1])
        self.conns: dict[_Conn, None] = {}
        self.registered = False
        self.closed = False


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


class Loop:
    """Listening sockets and their connections, served by serve_forever() in one thread: no
    thread, stack or buffer per client beyond Limits, whatever the clients do. The connections
    count in a Budget shared with the process's other servers (daemon/fds.py)."""

    def __init__(self, limits: Limits, budget: Budget | None = None) -> None:
        self.limits = limits
        self.budget = budget if budget is not None else fds.process_budget()
        self.doors: list[Listener] = []
        self._sel = selectors.DefaultSelector()
        self._wake_r, self._wake_w = socket.socketpair()  # interrupts select() at once
        self._wake_r.setblocking(False)
        self._wake_w.setblocking(False)
        self._calls: deque[Callable[[], None]] = deque()  # run by the loop: doors come and go
        self._stopping = False
        self._done = False  # the loop has ended: calls run where they are made
        self._next_sweep = float("inf")
        self._paused_until = 0.0  # not accepting until then (no fds, or waiting for room)
        self._waiting_room = False

    @property
    def conns(self) -> list[_Conn]:
        """Every connection held (from any thread: tests, diagnostics)."""
        while True:
            try:
                return [c for door in list(self.doors) for c in list(door.conns)]
            except RuntimeError:  # changed by the loop meanwhile
                continue

    def serve_forever(self) -> None:
        self._sel.register(self._wake_r, selectors.EVENT_READ)
        try:
            while not self._stopping:
                wait = self._next_sweep - time.monotonic()
                for key, mask in self._sel.select(None if wait == float("inf") else wait):
                    try:
                        self._ready(key.fileobj, key.data, mask)
                    except Exception:  # a bug with one client must not take /healthz down
                        _SERVER_ERROR(exc_info=True)
                        if isinstance(key.data, _Conn):
                            self._close(key.data)
                if time.monotonic() >= self._next_sweep:
                    self._sweep()
        finally:
            self._stopping = self._done = True
            self._run_calls()
            for door in list(self.doors):
                self._drop(door)
            self._sel.close()
            self._wake_r.close()
            self._wake_w.close()

    def _ready(self, fileobj: Any, data: Any, mask: int) -> None:
        if data is None:  # woken: calls from other threads, room asked for or given
            with contextlib.suppress(OSError):
                while self._wake_r.recv(4096):
                    pass
            self._run_calls()
            self._rebalance()
        elif isinstance(data, Listener):
            if data.registered:  # not paused or dropped earlier in this batch
                self._accept(data)
        elif data.state == _WRITE and mask & selectors.EVENT_WRITE:
            self._write(data)
            self._serve_buffered(data)
        elif data.state in (_READ, _LINGER):  # not closed earlier in this batch
            self._read(data)

    def poke(self) -> None:
        """Wake the loop (from any thread)."""
        with contextlib.suppress(OSError):  # full: a wakeup is pending anyway; closed: stopped
            self._wake_w.send(b"x")

    def call(self, fn: Callable[[], None]) -> None:
        """Run fn on the loop's thread (from any thread)."""
        self._calls.append(fn)
        if self._done:
            self._run_calls()
        else:
            self.poke()

    def _run_calls(self) -> None:
        while self._calls:
            self._calls.popleft()()

    def shutdown(self) -> None:
        self._stopping = True
        self.poke()

    def _add(self, door: Listener) -> None:
        if self._stopping:
            door.sock.close()
            return
        self.doors.append(door)
        if not self._paused_until:
            self._sel.register(door.sock, selectors.EVENT_READ, door)
            door.registered = True

    def _drop(self, door: Listener) -> None:
        """Close a listener and every connection it took."""
        if door.closed:
            return
        for conn in list(door.conns):
            self._close(conn)
        if door.registered:
            self._sel.unregister(door.sock)
        door.registered, door.closed = False, True
        door.sock.close()
        self.doors.remove(door)

    def _pause(self, seconds: float) -> None:
        """Stop accepting for a while: the connections wait in the kernel's accept queue, which
        costs no descriptor."""
        for door in self.doors:
            if door.registered:
                self._sel.unregister(door.sock)
                door.registered = False
        self._paused_until = time.monotonic() + seconds
        self._next_sweep = min(self._next_sweep, self._paused_until)

    def _resume(self) -> None:
        self._paused_until, self._waiting_room = 0.0, False
        for door in self.doors:
            if not door.registered:
                self._sel.register(door.sock, selectors.EVENT_READ, door)
                door.registered = True

    def _accept(self, door: Listener) -> None:
        for _ in range(_ACCEPT_BATCH):
            try:
                sock, _ = door.sock.accept()
            except (BlockingIOError, InterruptedError):
                return
            except OSError as exc:
                if exc.errno in (errno.EMFILE, errno.ENFILE, errno.ENOBUFS, errno.ENOMEM):
                    # the connection stays queued and the listener readable: without a pause
                    # this loop would spin
                    self._pause(0.1)
                    _ACCEPT_FAILED(error=exc.strerror)
                    return
                continue  # ECONNABORTED and the like: that client is gone
            if len(door.conns) >= self.limits.connections:
                self._evict(door)
            elsewhere = self._make_room(door)
            conn = _Conn(sock, door)
            self.budget.take(door)
            door.conns[conn] = None
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
            if elsewhere is not None:
                # the total is over by this one until that listener's thread gives one up;
                # meanwhile this server takes no more (they wait in the accept queue)
                elsewhere.server.poke()
                self._waiting_room = True
                self._pause(0.1)  # a bound on the wait, should the poke come to nothing
                self.budget.wait(self.poke)
                return

    def _make_room(self, door: Listener) -> Listener | None:
        """Make room in the budget for one more connection on door, evicting from this server's
        listeners while one of them holds the most; the listener of another server that must
        give one up instead, if it comes to that."""
        while (victim := self.budget.victim(1, prefer=door)) is not None:
            if victim.server is not self:
                return victim  # type: ignore[no-any-return]
            self._evict(victim)
        return None

    def _rebalance(self) -> None:
        """Give up connections while the total is over and this server holds the most; resume
        accepting once it is not over, if this server was waiting for that."""
        while (victim := self.budget.victim(0)) is not None:
            if victim.server is not self:
                victim.server.poke()  # it gave up its lead meanwhile: ask the new leader
                break
            self._evict(victim)
        if self._waiting_room and self.budget.held() <= self.budget.total:
            self._resume()

    def _evict(self, door: Listener) -> None:
        """Make room by closing the oldest connection of door that is not being answered: idle
        ones and slow senders go first, in the order they came, so a newcomer (the kubelet)
        gets its turn however many an attacker holds open. Only when all are being answered
        does one of those go (each has write_timeout anyway)."""
        victim = next((c for c in door.conns if c.state != _WRITE), None)
        self._close(victim if victim is not None else next(iter(door.conns)))

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
            route = conn.door.routes.get(path, conn.door.fallback)
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
            conns = conn.door.conns
            del conns[conn]
            conns[conn] = None
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
        for door in self.doors:
            for conn in list(door.conns):
                if conn.deadline <= now:
                    self._close(conn)
                else:
                    nxt = min(nxt, conn.deadline)
        if self._paused_until:
            if now >= self._paused_until:
                self._resume()
            else:
                nxt = min(nxt, self._paused_until)
        self._next_sweep = max(nxt, now + _SWEEP_GRAIN)

    def _close(self, conn: _Conn) -> None:
        if conn.state == _CLOSED:
            return
        conn.state = _CLOSED
        del conn.door.conns[conn]
        if conn.events:
            self._sel.unregister(conn.sock)
        conn.sock.close()
        self.budget.give(conn.door)
