"""What the kernel holds, read from outside the proxies (issue 33's side-by-side bench, in the lab
guest): whether one endpoint of a service is programmed, and whether every one is, in each proxy
mode's own form.

- IPVS (ipvsproxy, kube-proxy --proxy-mode=ipvs): the real server under the ClusterIP's virtual
  server (a netlink GET), and for the whole cluster an IPVS dump plus kube-ipvs0's addresses (a
  virtual server whose address is not bound takes no traffic from the node).
- nftables: kube-proxy's chain for that endpoint in table `ip kube-proxy`. It writes a sync as
  one transaction, the service's map entry and the endpoint's chain together, so the chain
  being there means the endpoint is in the dataplane. The whole cluster: one dump of the
  family's chains.
- iptables (iptables-nft, Debian's default and what kube-proxy runs here): its KUBE-SEP chain
  in table `ip nat`; iptables-restore commits a table as one transaction too.

Chains are read over netlink (NFT_MSG_GETCHAIN, one request, or one dump), not with `nft` or
`iptables-save`, which would print the whole ruleset for each poll.
"""

from __future__ import annotations

import errno
import os
import socket
import struct
from collections.abc import Iterable, Sequence
from ipaddress import ip_address

from bench.peers_cluster import Service, iptables_endpoint_chain, nft_endpoint_chain

NETLINK_NETFILTER = 12
NFNL_SUBSYS_NFTABLES = 10
NFT_MSG_GETCHAIN = 4
NFTA_CHAIN_TABLE, NFTA_CHAIN_NAME = 1, 3
NFPROTO_IPV4 = 2
NLM_F_REQUEST, NLM_F_DUMP = 0x1, 0x300
NLMSG_ERROR, NLMSG_DONE = 2, 3


def _attr(kind: int, data: bytes) -> bytes:
    n = 4 + len(data)
    return struct.pack("=HH", n, kind) + data + b"\0" * (-n % 4)


def _message(flags: int, seq: int, attrs: bytes = b"") -> bytes:
    payload = struct.pack("=BBH", NFPROTO_IPV4, 0, 0) + attrs
    return struct.pack("=IHHII", 16 + len(payload), (NFNL_SUBSYS_NFTABLES << 8) | NFT_MSG_GETCHAIN,
                       flags, seq, 0) + payload


def _attrs(data: bytes, off: int) -> dict[int, bytes]:
    out = {}
    while off + 4 <= len(data):
        n, kind = struct.unpack_from("=HH", data, off)
        if n < 4:
            break
        out[kind & 0x7FFF] = data[off + 4:off + n]
        off += (n + 3) & ~3
    return out


class Chains:
    """Netfilter chains of family ip, over one netlink socket."""

    def __init__(self) -> None:
        self.sock = socket.socket(socket.AF_NETLINK, socket.SOCK_RAW, NETLINK_NETFILTER)
        self.sock.setsockopt(socket.SOL_SOCKET, 33, 16 << 20)  # SO_RCVBUFFORCE (root)
        self.sock.bind((0, 0))
        self.seq = 0

    def close(self) -> None:
        self.sock.close()

    def exists(self, table: str, chain: str) -> bool:
        self.seq += 1
        self.sock.send(_message(NLM_F_REQUEST, self.seq,
                                _attr(NFTA_CHAIN_TABLE, table.encode() + b"\0")
                                + _attr(NFTA_CHAIN_NAME, chain.encode() + b"\0")))
        while True:
            data = self.sock.recv(1 << 16)
            off = 0
            while off + 16 <= len(data):
                n, kind, _, seq, _ = struct.unpack_from("=IHHII", data, off)
                if seq == self.seq:
                    if kind == NLMSG_ERROR:
                        err = -struct.unpack_from("=i", data, off + 16)[0]
                        if err in (errno.ENOENT, 0):
                            return bool(err == 0)
                        raise OSError(err, f"nft get chain {table} {chain}: {os.strerror(err)}")
                    return True
                off += (n + 3) & ~3

    def all(self, table: str) -> set[str]:
        """Every chain of `table` (family ip)."""
        self.seq += 1
        self.sock.send(_message(NLM_F_REQUEST | NLM_F_DUMP, self.seq))
        out: set[str] = set()
        want = table.encode()
        while True:
            data = self.sock.recv(1 << 20)
            off = 0
            while off + 16 <= len(data):
                n, kind, _, seq, _ = struct.unpack_from("=IHHII", data, off)
                if seq == self.seq:
                    if kind == NLMSG_DONE:
                        return out
                    if kind == NLMSG_ERROR:
                        err = -struct.unpack_from("=i", data, off + 16)[0]
                        raise OSError(err, f"nft chain dump: {os.strerror(err)}")
                    a = _attrs(data[off:off + n], 20)
                    if a.get(NFTA_CHAIN_TABLE, b"").rstrip(b"\0") == want:
                        out.add(a[NFTA_CHAIN_NAME].rstrip(b"\0").decode())
                off += (n + 3) & ~3


# One thing of the cluster the kernel must hold: an endpoint of a service, or (ip None) the
# service's ClusterIP bound to kube-ipvs0 (IPVS modes only).
Item = tuple[Service, str | None]
# Re-checking more items than this one by one costs more than reading everything once.
ONE_BY_ONE = 64


class Probe:
    """One proxy mode's view of the kernel: `has(svc, ip)` (is this endpoint of this service
    programmed), `absent(expected)` (what of every service is not: one read of everything) and
    `still_absent(items)` (which of those few still are: read one by one)."""

    def has(self, svc: Service, ip: str) -> bool:
        raise NotImplementedError

    def absent(self, expected: Sequence[tuple[Service, Sequence[str]]]) -> list[Item]:
        raise NotImplementedError

    def still_absent(self, items: Sequence[Item]) -> list[Item]:
        if len(items) > ONE_BY_ONE:
            # many left (the proxy is still at it): a spread sample one by one, and everything
            # read again only once that sample is all there
            sample = [*items[::len(items) // ONE_BY_ONE + 1][:ONE_BY_ONE - 1], items[-1]]
            left = self.still_absent(sample)
            if left:
                there = set(sample) - set(left)
                return [it for it in items if it not in there]
            by_svc: dict[Service, list[str]] = {}
            for svc, ip in items:
                by_svc.setdefault(svc, []).extend([] if ip is None else [ip])
            again = set(self.absent(list(by_svc.items())))
            return [it for it in items if it in again]
        unbound = self.unbound([svc for svc, ip in items if ip is None])
        return [(svc, ip) for svc, ip in items
                if (svc in unbound if ip is None else not self.has(svc, ip))]

    def unbound(self, svcs: Sequence[Service]) -> set[Service]:
        """Which of `svcs` have no address bound (IPVS modes: one read of kube-ipvs0)."""
        return set()

    def close(self) -> None:
        pass


class IpvsProbe(Probe):
    def __init__(self) -> None:
        from ipvsproxy.kernel.dummy import DummyLink
        from ipvsproxy.kernel.ipvs import IpvsClient

        self.ipvs = IpvsClient()
        self.link = DummyLink()  # imports pyroute2 now, not inside the first timed check

    def _key(self, svc: Service) -> object:
        from ipvsproxy.core.ipvs import Protocol, ServiceKey

        return ServiceKey.inet(Protocol[svc.protocol], ip_address(svc.cluster_ip), svc.port)

    def has(self, svc: Service, ip: str) -> bool:
        vs = self.ipvs.get_service(self._key(svc))  # type: ignore[arg-type]
        want = ip_address(ip)
        return vs is not None and any(d.dest.key.addr == want for d in vs.dests)

    def absent(self, expected: Sequence[tuple[Service, Sequence[str]]]) -> list[Item]:
        """Endpoints not under their ClusterIP's virtual server, and ClusterIPs not bound to
        kube-ipvs0 (ip None)."""
        held: dict[object, set[object]] = {
            o.service.key: {d.dest.key.addr for d in o.dests}
            for o in self.ipvs.dump(stats=False)}
        bound = self._bound()
        out: list[Item] = []
        for svc, ips in expected:
            dests = held.get(self._key(svc), set())
            out += [(svc, ip) for ip in ips if ip_address(ip) not in dests]
            if ip_address(svc.cluster_ip) not in bound:
                out.append((svc, None))
        return out

    def _bound(self) -> frozenset[object]:
        from ipvsproxy.kernel.dummy import DummyLinkError

        try:
            return frozenset(self.link.addresses(4))
        except DummyLinkError:  # no kube-ipvs0 yet
            return frozenset()

    def unbound(self, svcs: Sequence[Service]) -> set[Service]:
        bound = self._bound() if svcs else frozenset()
        return {svc for svc in svcs if ip_address(svc.cluster_ip) not in bound}

    def close(self) -> None:
        self.ipvs.close()
        self.link.close()


class ChainProbe(Probe):
    """A kube-proxy mode whose endpoints are chains: nftables (table kube-proxy) or iptables
    (table nat)."""

    def __init__(self, mode: str) -> None:
        self.table, self.name = {"nftables": ("kube-proxy", nft_endpoint_chain),
                                 "iptables": ("nat", iptables_endpoint_chain)}[mode]
        self.chains = Chains()

    def has(self, svc: Service, ip: str) -> bool:
        return self.chains.exists(self.table, self.name(svc, ip))

    def absent(self, expected: Sequence[tuple[Service, Sequence[str]]]) -> list[Item]:
        held = self.chains.all(self.table)
        return [(svc, ip) for svc, ips in expected for ip in ips if self.name(svc, ip) not in held]

    def close(self) -> None:
        self.chains.close()


def probe(mode: str) -> Probe:
    return IpvsProbe() if mode == "ipvs" else ChainProbe(mode)


def all_present(p: Probe, pairs: Iterable[tuple[Service, str]]) -> bool:
    return all(p.has(svc, ip) for svc, ip in pairs)
