"""nlsock.roomy: a batching netlink socket gets buffers for a batch's acks.

On the host; SO_RCVBUFFORCE needs root, which make test has.
"""

from __future__ import annotations

import socket

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
