"""Reading the real-server dumps of every virtual server: in this process, or in a forked child
while this process decodes.

Real servers are dumped per virtual server (the kernel wants the service in the request), as
ipvsadm does. One socket runs one dump at a time (netlink_dump_start answers EBUSY while a dump
runs), so the requests are pipelined over many sockets: a request on each, then the replies of
each, handed on once a few MiB are read. Each socket still runs one dump at a time, in order; in
the emulated lab this is about 20% faster than one request after another (measured).

The kernel fills a dump's buffers inside our send() and recv() calls, so in one process its
work and the decoding take turns: at 2,000 services x 10 in the lab, ~0.33 s of requests and
reads and ~0.35 s of decoding. A thread cannot overlap them either: after every syscall it
waits for the GIL the decoding holds (up to the 5 ms switch interval, thousands of times). A
child process can: forked() runs the same reads in a child that streams the raw replies through
a pipe, and this process decodes each batch as it arrives, on another CPU. The child only sends,
receives and writes bytes, then leaves with os._exit: it runs no Python-level locks, logging,
imports or exit handlers, so it is safe even where the parent has other threads (which the
child does not have).
"""

from __future__ import annotations

import _socket  # the C module (see core/ipvs.py AF_INET)
import contextlib
import fcntl
import os
import struct
import sys
from collections.abc import Callable, Iterator, Sequence

from ipvsproxy.core.ipvs import ServiceKey
from ipvsproxy.kernel import ipvs_codec as c
from ipvsproxy.kernel.nlsock import give_up_after

NETLINK_GENERIC = 16
PIPELINE = 64  # sockets the real-server dumps run on, one dump in flight on each
COLLECT = 4 << 20  # bytes of replies read before they are handed on for decoding
# From a child, smaller batches: decoding starts sooner and the two processes overlap more.
FORK_COLLECT = 512 << 10
PIPE_SIZE = 1 << 20  # fcntl F_SETPIPE_SZ (the default 64 KiB pipe makes the child wait)
_DUMP_RECV = 64 << 10  # a dump reply buffer (skb) is at most 32 KiB
FORK_MIN = 256  # fewer services than this: not worth a child process


def may_fork(n_keys: int) -> bool:
    """Whether forked() is the way for n_keys dumps: enough of them to be worth a process, and
    this process has no other thread (fork() copies only the calling thread; the child would be
    safe, see above, but Python 3.12 warns on any fork of a threaded process, and the daemon's
    periodic resync, its only threaded caller, is not in a hurry)."""
    threading = sys.modules.get("threading")  # never imported: no thread was ever started
    single = threading is None or threading.active_count() == 1
    return n_keys >= FORK_MIN and single and hasattr(os, "fork")


# One dump's replies: its sequence number, its data buffers, and how it ended (read_dump).
Reply = tuple[int, list[bytes], int | None]

# What a child writes to its pipe: frames of two integers and bytes (in_child). A dump reply
# (forked) is how it ended (0, an errno, or _DONE_IN_DATA), its sequence number, its data.
Frame = tuple[int, int, bytes]
_FRAME = struct.Struct("=iII")  # a, b, the length of the data that follows
_DONE_IN_DATA = -1  # end None: the NLMSG_DONE is at the end of the data
_FAILED = -2  # the child failed: b holds an errno (or 0), the data the message


def dump_socket() -> _socket.socket:
    sock = _socket.socket(_socket.AF_NETLINK, _socket.SOCK_RAW, NETLINK_GENERIC)
    sock.bind((0, 0))
    give_up_after(sock, 30)
    return sock


def read_dump(sock: _socket.socket, view: memoryview, seq: int) -> tuple[list[bytes], int | None]:
    """The data buffers of the dump `seq`, and how it ended: 0 (a buffer with NLMSG_DONE
    first), the errno of an NLMSG_ERROR, or None when the NLMSG_DONE came at the end of the
    last data buffer (the decoder meets it there).

    An IPVS dump sends its NLMSG_DONE alone, in the buffer after the last data (ip_vs_ctl.c's
    dump callbacks return the length they wrote, so netlink_dump ends the dump only on a call
    that wrote nothing): the first message tells. A buffer that ends with what looks like our
    NLMSG_DONE is walked message by message to be sure."""
    bufs: list[bytes] = []
    while True:
        n = sock.recv_into(view)
        if n >= 16:
            _len, mtype, _flags, mseq, _pid = c.HDR.unpack_from(view)
            if mseq == seq and mtype in (c.NLMSG_DONE, c.NLMSG_ERROR):
                return bufs, c.error_code(view[16:n]) if mtype == c.NLMSG_ERROR else 0
        bufs.append(view[:n].tobytes())
        if n >= 36:
            length, mtype, _flags, mseq, _pid = c.HDR.unpack_from(view, n - 20)
            if (length, mtype, mseq) == (20, c.NLMSG_DONE, seq) and any(
                    t == c.NLMSG_DONE and s == seq for t, _f, s, _p in c.iter_messages(view[:n])):
                return bufs, None


def in_process(family: int, keys: Sequence[ServiceKey], seq: int,
               collect: int = COLLECT) -> Iterator[list[Reply]]:
    """The replies of the real-server dumps of `keys` (sequence numbers seq, seq+1, ...), in
    order, in batches of about `collect` bytes."""
    socks = [dump_socket() for _ in range(min(PIPELINE, len(keys)))]
    view = memoryview(bytearray(_DUMP_RECV))
    try:
        replies: list[Reply] = []
        size = 0
        for start in range(0, len(keys), len(socks)):
            part = keys[start:start + len(socks)]
            for sock, key in zip(socks, part, strict=False):
                sock.send(c.dest_dump_request(family, seq, key))
                seq += 1
            for i, sock in enumerate(socks[:len(part)]):
                bufs, end = read_dump(sock, view, seq - len(part) + i)
                replies.append((seq - len(part) + i, bufs, end))
                size += sum(map(len, bufs))
            if size >= collect:
                yield replies
                replies, size = [], 0
        if replies:
            yield replies
    finally:
        for sock in socks:
            sock.close()


def forked(family: int, keys: Sequence[ServiceKey], seq: int) -> Iterator[list[Reply]]:
    """in_process(), read by a forked child (see above): the same replies, in batches of about
    FORK_COLLECT bytes. A failure in the child is raised here as the OSError it was (or a
    RuntimeError)."""
    def produce() -> Iterator[list[Frame]]:
        for replies in in_process(family, keys, seq, FORK_COLLECT):
            # several buffers of a dump go as one: the decoders read them the same
            yield [(_DONE_IN_DATA if end is None else end, q, b"".join(bufs))
                   for q, bufs, end in replies]

    replies: list[Reply] = []
    size = count = 0
    with Child(produce) as child:
        for end, q, data in child:
            replies.append((q, [data] if data else [], None if end == _DONE_IN_DATA else end))
            size += len(data)
            count += 1
            if size >= FORK_COLLECT:
                yield replies
                replies, size = [], 0
    if count != len(keys):
        raise RuntimeError("the IPVS dump child stopped before the last dump")
    if replies:
        yield replies


class Child:
    """produce() run in a child forked now. Iterate for the frames (a, b, data: two integers and
    bytes) it makes, in order, as they come through a pipe. A failure in the child is raised
    here: an OSError with its errno, else a RuntimeError. close() (or leaving a `with`) before
    the last frame kills the child; either way it is reaped."""

    def __init__(self, produce: Callable[[], Iterator[list[Frame]]]) -> None:
        rfd, wfd = os.pipe()
        with contextlib.suppress(OSError, AttributeError):
            fcntl.fcntl(wfd, fcntl.F_SETPIPE_SZ, PIPE_SIZE)
        pid = os.fork()
        if pid == 0:  # the child: nothing here may return or raise
            code = 0
            try:
                os.close(rfd)
                for frames in produce():
                    _write_all(wfd, b"".join([_FRAME.pack(a, b, len(data)) + data
                                              for a, b, data in frames]))
            except BaseException as exc:  # reported to the parent, which raises it
                code = 1
                with contextlib.suppress(BaseException):
                    said = f"{type(exc).__name__}: {exc}".encode(errors="replace")
                    _write_all(wfd, _FRAME.pack(_FAILED, getattr(exc, "errno", 0) or 0,
                                                len(said)) + said)
            os._exit(code)
        os.close(wfd)
        self._pid: int | None = pid
        self._pipe = os.fdopen(rfd, "rb", buffering=1 << 20)
        self._done = False

    def __iter__(self) -> Iterator[Frame]:
        read = self._pipe.read
        while head := read(_FRAME.size):
            if len(head) != _FRAME.size:
                raise RuntimeError("the child process stopped in the middle of its output")
            a, b, length = _FRAME.unpack(head)
            data = read(length)
            if len(data) != length:
                raise RuntimeError("the child process stopped in the middle of its output")
            if a == _FAILED:
                why = data.decode(errors="replace")
                raise OSError(b, why) if b else RuntimeError(f"the child process: {why}")
            yield a, b, data
        self._done = True
        self.close()

    def close(self) -> None:
        if self._pid is None:
            return
        pid, self._pid = self._pid, None
        self._pipe.close()
        if not self._done:  # stopped early or the output was bad: don't wait for the rest
            import signal

            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        _, status = os.waitpid(pid, 0)
        if self._done and status:
            raise RuntimeError(f"the child process exited with status {status:#x}")

    def __enter__(self) -> Child:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view):]
