"""The project's batching netlink sockets: room for a batch's acks, reading them, timeouts.

A batch is many requests in one send(). The kernel handles every one of them inside that send
(netlink_rcv_skb) and queues an ack for each on our socket before we read any; an ack that
does not fit the receive buffer is dropped and the next recv() fails with ENOBUFS. What an ack
costs the buffer is its skb's truesize, not its length, and that grew between kernels: at the
default 208 KiB buffer, 256 rtnetlink acks fit on Debian's 6.1 and overflowed on 6.12 (found
in the lab, adding kube-ipvs0 addresses). So every batching socket asks for 8 MiB.
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


def await_acks(sock: _socket.socket, pending: dict[int, _T], bufsize: int
               ) -> list[tuple[_T, int]]:
    """Read the answers of a sent batch until every request of `pending` (sequence number ->
    request) has its ack or error, in any order; return the failed requests with their errno.
    Empties `pending`. Lost answers (ENOBUFS) are an OSError that says so."""
    failed: list[tuple[_T, int]] = []
    while pending:
        try:
            buf = sock.recv(bufsize)
        except OSError as exc:
            if exc.errno == errno.ENOBUFS:
                raise OSError(errno.ENOBUFS, f"{len(pending)} netlink answers lost: the receive "
                                             "buffer overflowed (see nlsock.py)") from exc
            raise
        for mtype, _flags, seq, payload in c.iter_messages(buf):
            if mtype == c.NLMSG_ERROR and seq in pending:
                request = pending.pop(seq)
                err = c.error_code(payload)
                if err:
                    failed.append((request, err))
    return failed
