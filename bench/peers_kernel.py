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


class Probe:
    """One proxy mode's view of the kernel: `has(svc, ip)` (is this endpoint of this service
    programmed) and `missing(expected)` (which of every service's endpoints are not)."""

    def has(self, svc: Service, ip: str) -> bool:
        raise NotImplementedError

    def missing(self, expected: Sequence[tuple[Service, Sequence[str]]]) -> int:
        raise NotImplementedError

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

    def missing(self, expected: Sequence[tuple[Service, Sequence[str]]]) -> int:
        """Endpoints not under their ClusterIP's virtual server, plus ClusterIPs not bound to
        kube-ipvs0."""
        from ipvsproxy.kernel.dummy import DummyLinkError

        held: dict[object, set[object]] = {
            o.service.key: {d.dest.key.addr for d in o.dests}
            for o in self.ipvs.dump(stats=False)}
        try:
            bound = self.link.addresses(4)
        except DummyLinkError:  # no kube-ipvs0 yet
            bound = frozenset()
        lost = 0
        for svc, ips in expected:
            dests = held.get(self._key(svc), set())
            lost += sum(ip_address(ip) not in dests for ip in ips)
            lost += ip_address(svc.cluster_ip) not in bound
        return lost

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

    def missing(self, expected: Sequence[tuple[Service, Sequence[str]]]) -> int:
        held = self.chains.all(self.table)
        return sum(self.name(svc, ip) not in held for svc, ips in expected for ip in ips)

    def close(self) -> None:
        self.chains.close()


def probe(mode: str) -> Probe:
    return IpvsProbe() if mode == "ipvs" else ChainProbe(mode)


def all_present(p: Probe, pairs: Iterable[tuple[Service, str]]) -> bool:
    return all(p.has(svc, ip) for svc, ip in pairs)
