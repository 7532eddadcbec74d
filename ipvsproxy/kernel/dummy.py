"""The `kube-ipvs0` dummy link: make it exist, list, add and remove its /32 and /128 addresses.

As kube-proxy does: the link is a `dummy` that is never set up; every virtual IP is bound to it
as a full-length host address so the kernel accepts packets for it and IPVS can take them.
Adds and removes are idempotent (an address already there, or already gone, is not an error).

Batching: pyroute2's `addr()` costs ~0.2 ms of Python per call (argument processing, one round
trip each). Here the RTM_NEWADDR/RTM_DELADDR messages are built directly (kernel/addr_codec.py)
and written many per send() with `nlm_request_batch`; the kernel handles and acknowledges each
message of the buffer in turn. Failures are not raised from inside a batch (that would lose the
other answers); the requests that got no positive ack are retried one by one, which gives the
real error. A failed delete of an address that a dump shows is already gone is the idempotent
case, not an error.

Listing: the RTM_GETADDR dump is read and decoded by kernel/addr_codec.py too. pyroute2's
get_addr decodes each message through its asyncio core, ~3 ms per address under the lab's
emulation: at 2,000 services that was half of a full resync's observe (6.5 s of 13 s in a
profile).
"""

from __future__ import annotations

import errno
import socket
from collections.abc import Iterable, Sequence
from types import TracebackType
from typing import Any

from pyroute2 import IPRoute
from pyroute2.netlink import NLM_F_ACK, NLM_F_CREATE, NLM_F_REPLACE, NLM_F_REQUEST
from pyroute2.netlink.exceptions import NetlinkError
from pyroute2.netlink.rtnl import RTM_DELADDR, RTM_NEWADDR

from ipvsproxy.kernel import nlsock
from ipvsproxy.kernel.addr_codec import IPAddress, decode_addr_payload, dump, encode_addr

KUBE_IPVS0 = "kube-ipvs0"
# Requests per send(). Each answer waits in the socket's receive buffer until read; 256 of
# them fit nlsock.roomy's buffer with room to spare on every kernel seen (see nlsock.py).
BATCH = 256


class DummyLinkError(Exception):
    """The link is missing, is not a dummy, or an address operation failed."""


class DummyLink:
    """One link (default kube-ipvs0) and an IPRoute socket. Not thread-safe; one per thread."""

    def __init__(self, name: str = KUBE_IPVS0) -> None:
        self.name = name
        self._ipr: Any = IPRoute()

    def close(self) -> None:
        self._ipr.close()

    def __enter__(self) -> DummyLink:
        return self

    def __exit__(self, t: type[BaseException] | None, v: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.close()

    # ---- the link ------------------------------------------------------------------------

    def index(self) -> int | None:
        found = self._ipr.link_lookup(ifname=self.name)
        return int(found[0]) if found else None

    def ensure(self) -> int:
        """Create the dummy link if missing (left down, as kube-proxy leaves it); its ifindex.
        A link of that name that is not a dummy is an error: never take over a real device."""
        idx = self.index()
        if idx is None:
            try:
                self._ipr.link("add", ifname=self.name, kind="dummy")
            except NetlinkError as exc:
                if exc.code != errno.EEXIST:  # EEXIST: someone else just created it
                    raise DummyLinkError(f"cannot create dummy link {self.name}: {exc}") from exc
            idx = self.index()
            if idx is None:
                raise DummyLinkError(f"{self.name} vanished right after it was created")
        (link,) = self._ipr.get_links(idx)
        info = link.get_attr("IFLA_LINKINFO")
        kind = info.get_attr("IFLA_INFO_KIND") if info is not None else None
        if kind != "dummy":
            raise DummyLinkError(f"{self.name} exists but is a {kind or 'plain'} link, not dummy")
        return idx

    def delete(self) -> bool:
        """Delete the link (cleanup); False if it did not exist."""
        idx = self.index()
        if idx is None:
            return False
        try:
            self._ipr.link("del", index=idx)
        except NetlinkError as exc:
            if exc.code == errno.ENODEV:
                return False
            raise DummyLinkError(f"cannot delete {self.name}: {exc}") from exc
        return True

    def _required_index(self) -> int:
        idx = self.index()
        if idx is None:
            raise DummyLinkError(f"link {self.name} does not exist")
        return idx

    # ---- addresses -----------------------------------------------------------------------

    def addresses(self, version: int | None = None) -> frozenset[IPAddress]:
        """The link's addresses of any prefix length, IPv6 link-local excluded: the kernel adds
        those by itself when a link goes up, they are never ours. (IPv4 169.254/16 is never
        automatic, so one found here was put here and is listed.)"""
        idx = self._required_index()
        family = {None: socket.AF_UNSPEC, 4: socket.AF_INET, 6: socket.AF_INET6}[version]
        try:
            payloads = dump(family, f"listing the addresses of {self.name}")
        except OSError as exc:
            raise DummyLinkError(str(exc)) from exc
        found = (decode_addr_payload(p, idx) for p in payloads)  # all RTM_NEWADDR
        return frozenset(a for a in found
                         if a is not None and not (a.version == 6 and a.is_link_local))

    def add(self, addrs: Iterable[IPAddress]) -> None:
        """Bind each address as /32 or /128; present ones are replaced in place (no error)."""
        todo = sorted(set(addrs), key=lambda a: (a.version, a))
        for a in todo:
            if a.version == 6 and a.is_link_local:
                raise DummyLinkError(f"{a} is link-local; it would never be listed or removed")
        self._batch(RTM_NEWADDR, NLM_F_REQUEST | NLM_F_ACK | NLM_F_CREATE | NLM_F_REPLACE, todo)

    def remove(self, addrs: Iterable[IPAddress]) -> None:
        """Unbind each /32 or /128 address; absent ones are not an error."""
        todo = sorted(set(addrs), key=lambda a: (a.version, a))
        self._batch(RTM_DELADDR, NLM_F_REQUEST | NLM_F_ACK, todo)

    def _batch(self, mtype: int, flags: int, addrs: Sequence[IPAddress]) -> None:
        if not addrs:
            return
        idx = self._required_index()
        failed: list[IPAddress] = []
        with socket.socket(socket.AF_NETLINK, socket.SOCK_RAW, socket.NETLINK_ROUTE) as sock:
            nlsock.roomy(sock)
            for start in range(0, len(addrs), BATCH):
                chunk = addrs[start:start + BATCH]
                pending = {start + k + 1: a for k, a in enumerate(chunk)}
                last = start + len(chunk)
                # only the last asks for an ack; the others are answered if they fail (nlsock)
                sock.send(b"".join(
                    encode_addr(idx, a, mtype, flags if seq == last else flags & ~NLM_F_ACK, seq)
                    for seq, a in pending.items()))
                try:
                    failed.extend(a for a, _err in nlsock.await_acks(sock, pending, last))
                except OSError as exc:
                    raise DummyLinkError(f"{self.name}: {exc}") from exc
        if failed and mtype == RTM_DELADDR:
            # Most failed deletes are addresses already gone; one dump sorts them out.
            present = self.addresses()
            failed = [a for a in failed if a in present]
        for a in failed:
            self._one(idx, a, mtype)

    def _one(self, idx: int, addr: IPAddress, mtype: int) -> None:
        cmd = "replace" if mtype == RTM_NEWADDR else "del"
        try:
            self._ipr.addr(cmd, index=idx, address=str(addr), prefixlen=addr.max_prefixlen)
        except NetlinkError as exc:
            if cmd == "del" and exc.code == errno.EADDRNOTAVAIL:
                return  # already gone: removing is idempotent
            raise DummyLinkError(f"{cmd} {addr}/{addr.max_prefixlen} on {self.name}: "
                                 f"{exc}") from exc
