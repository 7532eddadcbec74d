"""The project's batching netlink sockets: room for a batch's acks, reading them, timeouts.

A batch is many requests in one send(). The kernel handles every one of them inside that send
(netlink_rcv_skb) and queues its answers on our socket before we read any: an ack for the last
request, which alone asks for one, and an error for each request that failed (await_acks).
An answer that does not fit the receive buffer is dropped and the next recv() fails with
ENOBUFS. What an answer costs the buffer is its skb's truesize, not its length, and that grew
between kernels: at the default 208 KiB buffer, 256 rtnetlink acks fit on Debian's 6.1 and
overflowed on 6.12 (found in the lab, adding kube-ipvs0 addresses, when every request asked
for an ack; a batch of failures still fills as much). So every batching socket asks for 8 MiB.
"""

from __future__ import annotations

import _socket  # the C module (see core/ipvs.py AF_INET)
import errno
import struct
from typing import TypeVar

from ipvsproxy.kernel import ipvs_codec as c

_T = TypeVar("_T")

SOL_NETLINK = 270
NETLINK_CAP_ACK = 10  # an ack carries the request's header only, not the whole request
SO_SNDBUFFORCE = 32
SO_RCVBUFFORCE = 33
BUFFER = 8 << 20
ANSWER = 64 << 10  # what one recv() of an answer may take: an ack or error is one small skb


def roomy(sock: _socket.socket) -> None:
    """Send and receive buffers of BUFFER bytes, and short acks. The *FORCE options pass
    net.core.rmem_max/wmem_max and need CAP_NET_ADMIN, which programming IPVS needs anyway;
    without it the plain options give what those limits allow."""
    for force, plain in ((SO_RCVBUFFORCE, _socket.SO_RCVBUF), (SO_SNDBUFFORCE, _socket.SO_SNDBUF)):
        try:
            sock.setsockopt(_socket.SOL_SOCKET, force, BUFFER)
        except OSError:
            sock.setsockopt(_socket.SOL_SOCKET, plain, BUFFER)
    sock.setsockopt(SOL_NETLINK, NETLINK_CAP_ACK, 1)


def give_up_after(sock: _socket.socket, seconds: int) -> None:
    """A blocking socket whose sends and receives fail (EAGAIN) after `seconds` without
    progress: the kernel's SO_RCVTIMEO/SO_SNDTIMEO, not Python's settimeout(). That one makes
    the socket non-blocking and polls before every send and receive: two system calls for one,
    and a dump is three calls per virtual server (request, data, NLMSG_DONE)."""
    timeval = struct.pack("@ll", seconds, 0)
    sock.setsockopt(_socket.SOL_SOCKET, _socket.SO_RCVTIMEO, timeval)
    sock.setsockopt(_socket.SOL_SOCKET, _socket.SO_SNDTIMEO, timeval)


def await_acks(sock: _socket.socket, pending: dict[int, _T], last: int,
               bufsize: int = ANSWER) -> list[tuple[_T, int]]:
    """Read the answers of a sent batch (sequence number -> request in `pending`) in which only
    the last request, `last`, asked for an ack (NLM_F_ACK); return the failed requests with
    their errno. The kernel answers a request without that flag only when it fails
    (netlink_rcv_skb: `if (nlh->nlmsg_flags & NLM_F_ACK || err) netlink_ack(...)`), handles the
    batch in order and queues each answer as it goes, so the last request's answer comes after
    every failure before it and ends the batch: a batch that succeeds is one answer, not one a
    request. Answers are read into one buffer: a netlink recv returns one skb, and recv(n)
    allocates n bytes for each; where glibc serves that with mmap (a process that has not yet
    freed a block that large) 22,000 IPVS operations answered one by one took 7.1-10.6 s
    against 2.3-2.5 s read into a buffer or with a warmed allocator, under the lab's emulation
    (2026-11-29; the kernel's acks themselves cost little there). Lost answers (ENOBUFS) are an
    OSError that says so."""
    failed: list[tuple[_T, int]] = []
    buf = bytearray(bufsize)
    view = memoryview(buf)
    while True:
        try:
            n = sock.recv_into(buf)
        except OSError as exc:
            if exc.errno == errno.ENOBUFS:
                raise OSError(errno.ENOBUFS, "netlink answers lost: the receive buffer "
                                             "overflowed (see nlsock.py)") from exc
            raise
        for mtype, _flags, seq, payload in c.iter_messages(view[:n]):
            if mtype == c.NLMSG_ERROR and seq in pending:
                err = c.error_code(payload)
                if err:
                    failed.append((pending[seq], err))
                if seq == last:
                    return failed
