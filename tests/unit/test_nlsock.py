"""nlsock: a batching netlink socket gets buffers for a batch's answers, and reads them.

The buffer test runs on the host; SO_RCVBUFFORCE needs root, which make test has.
"""

from __future__ import annotations

import errno
import socket
import struct

import pytest

from ipvsproxy.kernel import nlsock


def test_roomy_passes_the_default_limits() -> None:
    with socket.socket(socket.AF_NETLINK, socket.SOCK_RAW, socket.NETLINK_ROUTE) as sock:
        before = sock.getsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF)
        nlsock.roomy(sock)
        # The kernel doubles what it is asked for (its bookkeeping); a batch of 256 acks
        # overflowed the default (~208 KiB) on Linux 6.12.
        assert sock.getsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF) >= nlsock.BUFFER > before
        assert sock.getsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF) >= nlsock.BUFFER
        assert sock.getsockopt(nlsock.SOL_NETLINK, nlsock.NETLINK_CAP_ACK) == 1


def _answer(seq: int, err: int, mtype: int = 2) -> bytes:
    """An NLMSG_ERROR (an ack when err is 0) for request `seq`, as NETLINK_CAP_ACK sends it."""
    body = struct.pack("=i", -err) + struct.pack("=IHHII", 16, 0, 0, seq, 0)
    return struct.pack("=IHHII", 16 + len(body), mtype, 0, seq, 0) + body


class _Answers:
    """A socket whose recv_into() hands out the given answers one buffer at a time."""

    def __init__(self, *bufs: bytes | OSError) -> None:
        self.bufs = list(bufs)

    def recv_into(self, buf: bytearray) -> int:
        b = self.bufs.pop(0)
        if isinstance(b, OSError):
            raise b
        buf[:len(b)] = b
        return len(b)


def test_await_acks_reads_until_the_last_request_is_answered() -> None:
    pending = {7: "a", 8: "b", 9: "c"}
    sock = _Answers(_answer(8, errno.EEXIST) + _answer(99, 0) + _answer(7, 0, mtype=16),
                    _answer(7, errno.ENOENT), _answer(9, 0), _answer(10, 0))
    got = nlsock.await_acks(sock, pending, 9, 1 << 16)  # type: ignore[arg-type]
    # another request's answer and a message that is no answer are skipped; the last one's
    # ack ends the batch and what comes after it is left for the next
    assert got == [("b", errno.EEXIST), ("a", errno.ENOENT)]
    assert sock.bufs == [_answer(10, 0)]


def test_a_failing_last_request_ends_the_batch_too() -> None:
    sock = _Answers(_answer(1, errno.EEXIST), _answer(2, errno.ENOENT))
    got = nlsock.await_acks(sock, {1: "a", 2: "b"}, 2, 1 << 16)  # type: ignore[arg-type]
    assert got == [("a", errno.EEXIST), ("b", errno.ENOENT)] and sock.bufs == []


def test_lost_answers_say_so() -> None:
    sock = _Answers(_answer(1, 0), OSError(errno.ENOBUFS, "No buffer space available"))
    with pytest.raises(OSError, match="netlink answers lost: the receive buffer overflowed"):
        nlsock.await_acks(sock, {1: "a", 2: "b"}, 2, 1 << 16)  # type: ignore[arg-type]
