"""The side-by-side benchmark's cluster (issue 33): bench/cluster_gen.py's generated services as
objects the real kube-apiserver takes, the dataplane service with real pods, the endpoint change
series, the names under which each kube-proxy mode's kernel state holds an endpoint, and the
figures' arithmetic. Pure, except `Loader` (HTTPS to the API server, from the host).

The generated cluster is a prefix family: generate(1000) is the first 1,000 services of
generate(10000) (one random stream, drawn service by service), so the sizes of one run are
loaded one after the other into one API server, each adding services to the last.
"""

from __future__ import annotations

import base64
import hashlib
import http.client
import json
import random
import ssl
import threading
from collections.abc import Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit

from bench.cluster_gen import NODE, NODE_IP, endpoint_slice, generate, pod_ip

Obj = dict[str, Any]

# The API server's NodePort range: the generated cluster hands out NodePorts from 30000 up (30%
# of the services have one: 15,000 at 50,000 services), and each LoadBalancer service with
# externalTrafficPolicy Local gets an explicit health-check node port from HC_PORT_BASE up (left
# to the server, a random one could take a later service's explicit NodePort).
NODE_PORT_RANGE = "30000-64999"
HC_PORT_BASE = 60000
# The dataplane service: three real pods (network namespaces on a bridge) behind a ClusterIP
# outside every generated one (those end at 10.96.195.81 at 50,000 services), and a client
# namespace; all of them in the cluster CIDR (10.128.0.0/9) where no generated pod is
# (generated pods are 10.128.0.0/10 and 10.192.0.0/10).
DP_NAMESPACE, DP_NAME, DP_IP, DP_PORT = "bench", "dataplane", "10.96.255.250", 80
DP_POD_NET, DP_PODS, DP_POD_PORT = "10.190.0", ("10.190.0.11", "10.190.0.12", "10.190.0.13"), 8080
DP_CLIENT_NET = "10.191.0"


@dataclass(frozen=True)
class Service:
    """What the bench needs of one generated service: where its ClusterIP virtual server is
    and what its endpoints are called."""

    index: int
    namespace: str
    name: str
    protocol: str  # TCP or UDP
    cluster_ip: str
    port: int
    port_name: str
    target_port: int


def services(docs: Sequence[Obj]) -> list[Service]:
    out = []
    for d in docs:
        if d["kind"] != "Service" or not d["metadata"]["name"].startswith("svc-"):
            continue
        p = d["spec"]["ports"][0]
        out.append(Service(int(d["metadata"]["name"][4:]), d["metadata"]["namespace"],
                           d["metadata"]["name"], p["protocol"], d["spec"]["clusterIP"],
                           p["port"], p["name"], p["targetPort"]))
    return out


# --------------------------------------------------------------------- objects for the API


def _bare(obj: Obj) -> Obj:
    """obj without what the API server sets itself (resourceVersion) or takes apart (status)."""
    meta = {k: v for k, v in obj["metadata"].items() if k != "resourceVersion"}
    return {**{k: v for k, v in obj.items() if k != "status"}, "metadata": meta}


def api_objects(n: int, m: int, start: int = 0) -> tuple[list[Obj], list[Obj]]:
    """Services start..n-1 of generate(n, m) and their EndpointSlices, as objects to create,
    and the Services' status to write after (LoadBalancer ingress)."""
    creates, statuses = [], []
    hc = HC_PORT_BASE
    for d in generate(n, m):
        if d["kind"] != "Service" or not d["metadata"]["name"].startswith("svc-"):
            if d["kind"] == "EndpointSlice" and d["metadata"]["name"].startswith("svc-") \
                    and int(d["metadata"]["name"][4:].split("-")[0]) >= start:
                creates.append(_bare(d))
            continue
        i = int(d["metadata"]["name"][4:])
        spec = d["spec"]
        local_lb = spec["type"] == "LoadBalancer" and spec.get("externalTrafficPolicy") == "Local"
        if local_lb:
            hc += 1
        if i < start:
            continue
        obj = _bare(d)
        if local_lb:
            obj["spec"] = {**spec, "healthCheckNodePort": hc - 1}
        creates.append(obj)
        if "status" in d:
            statuses.append({"metadata": obj["metadata"], "status": d["status"]})
    return creates, statuses


def base_objects() -> list[Obj]:
    """What every size has: the namespaces, this node (its address in status) and the
    dataplane service with its slice of real pods."""
    out: list[Obj] = [{"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": ns}}
                      for ns in [f"ns{i}" for i in range(100)] + [DP_NAMESPACE]]
    out.append({"apiVersion": "v1", "kind": "Node", "metadata": {"name": NODE}})
    out.append({"apiVersion": "v1", "kind": "Service",
                "metadata": {"namespace": DP_NAMESPACE, "name": DP_NAME},
                "spec": {"type": "ClusterIP", "clusterIP": DP_IP, "clusterIPs": [DP_IP],
                         "ports": [{"name": "p", "port": DP_PORT, "targetPort": DP_POD_PORT,
                                    "protocol": "TCP"}]}})
    out.append({"apiVersion": "discovery.k8s.io/v1", "kind": "EndpointSlice",
                "addressType": "IPv4",
                "metadata": {"namespace": DP_NAMESPACE, "name": f"{DP_NAME}-1",
                             "labels": {"kubernetes.io/service-name": DP_NAME}},
                "ports": [{"name": "p", "port": DP_POD_PORT, "protocol": "TCP"}],
                "endpoints": [{"addresses": [a], "conditions": {"ready": True},
                               "nodeName": NODE} for a in DP_PODS]})
    return out


NODE_STATUS = {"status": {"addresses": [{"type": "InternalIP", "address": NODE_IP}]}}

PLURAL = {"Namespace": "namespaces", "Node": "nodes", "Service": "services",
          "EndpointSlice": "endpointslices"}


def path(obj: Obj, name: bool = False, sub: str = "") -> str:
    """The REST path of obj's collection (or of obj itself, and a subresource)."""
    kind, meta = obj.get("kind", "Service"), obj["metadata"]
    base = "/apis/discovery.k8s.io/v1" if kind == "EndpointSlice" else "/api/v1"
    if kind in ("Service", "EndpointSlice"):
        base += f"/namespaces/{meta['namespace']}"
    out = f"{base}/{PLURAL[kind]}"
    if name or sub:
        out += f"/{meta['name']}"
    return out + (f"/{sub}" if sub else "")


# --------------------------------------------------------------------------- the loader


class Connection:
    """One keep-alive HTTPS connection to the API server with a bearer token (urllib opens a
    new connection, and a TLS handshake, per request)."""

    def __init__(self, url: str, ca_pem: str, token: str, timeout: float = 60.0) -> None:
        u = urlsplit(url)
        self.host, self.port = u.hostname or "", u.port or 443
        self.ctx = ssl.create_default_context(cadata=ca_pem)
        self.token, self.timeout = token, timeout
        self.conn: http.client.HTTPSConnection | None = None

    def request(self, method: str, path: str, body: Obj | None = None,
                content_type: str = "application/json") -> tuple[int, Obj]:
        for attempt in (0, 1):
            if self.conn is None:
                self.conn = http.client.HTTPSConnection(self.host, self.port, context=self.ctx,
                                                        timeout=self.timeout)
            try:
                self.conn.request(method, path, None if body is None else json.dumps(body),
                                  {"Authorization": f"Bearer {self.token}",
                                   "Content-Type": content_type, "Accept": "application/json"})
                r = self.conn.getresponse()
                data = r.read()
                return r.status, (json.loads(data) if data else {})
            except (OSError, http.client.HTTPException):
                self.conn.close()
                self.conn = None
                if attempt:
                    raise
        raise AssertionError("unreachable")

    def close(self) -> None:
        if self.conn is not None:
            self.conn.close()


class Loader:
    """Loads the cluster into the API server from the host, size by size, with a few keep-alive
    connections at once: `load(n, m)` creates services (and slices) `loaded..n-1`."""

    def __init__(self, url: str, ca_pem: str, token: str, workers: int = 6) -> None:
        self.url, self.ca_pem, self.token, self.workers = url, ca_pem, token, workers
        self.loaded = 0
        self.local = threading.local()

    def _conn(self) -> Connection:
        c = getattr(self.local, "conn", None)
        if c is None:
            c = self.local.conn = Connection(self.url, self.ca_pem, self.token)
        return c

    def create(self, obj: Obj) -> None:
        status, body = self._conn().request("POST", path(obj), obj)
        if status == 409 and obj["kind"] in ("Namespace", "Node"):
            return
        if status >= 300:
            raise RuntimeError(f"creating {obj['kind']} {obj['metadata']}: {status} "
                               f"{body.get('message', body)}")

    def status(self, obj: Obj, kind: str = "Service") -> None:
        o = {"kind": kind, **obj}
        status, body = self._conn().request("PATCH", path(o, sub="status"),
                                            {"status": obj["status"]},
                                            "application/merge-patch+json")
        if status >= 300:
            raise RuntimeError(f"status of {kind} {obj['metadata']}: {status} "
                               f"{body.get('message', body)}")

    def _all(self, fn: Any, objs: Sequence[Obj]) -> None:
        with ThreadPoolExecutor(self.workers) as pool:
            for _ in pool.map(fn, objs):
                pass

    def base(self) -> None:
        objs = base_objects()
        for o in objs[:-2]:
            self.create(o)
        self.status({"metadata": {"name": NODE}, **NODE_STATUS}, "Node")
        self._all(self.create, objs[-2:])

    def load(self, n: int, m: int) -> dict[str, Any]:
        """Services loaded..n-1 and their slices; what was done."""
        import time

        t0 = time.monotonic()
        start = self.loaded
        if n <= start:
            return {"services": self.loaded, "added": 0, "seconds": 0.0}
        creates, statuses = api_objects(n, m, start)
        svcs = [o for o in creates if o["kind"] == "Service"]
        self._all(self.create, svcs)
        self._all(self.create, [o for o in creates if o["kind"] == "EndpointSlice"])
        self._all(self.status, statuses)
        self.loaded = n
        return {"services": n, "added": n - start, "seconds": round(time.monotonic() - t0, 1)}


# ----------------------------------------------------------------------- the change series


@dataclass(frozen=True)
class Change:
    """One EndpointSlice update: service `svc`'s pod `version % m` replaced by a new pod
    (bench/cluster_gen.pod_ip); `measured`: a change whose way to the kernel is timed (the
    others are the steady background)."""

    svc: Service
    version: int
    measured: bool

    def new_ip(self, m: int) -> str:
        return pod_ip(self.svc.index, self.version % m, m, self.version)


def change_series(svcs: Sequence[Service], measured: int, background: int, seed: int = 33
                  ) -> list[Change]:
    """measured + background changes over distinct services as far as there are enough (then
    services come round again, each time one version on), measured and background taking
    turns while both last."""
    rng = random.Random(seed)
    order = list(svcs)
    rng.shuffle(order)
    versions: dict[int, int] = {}
    kinds = [True] * measured + [False] * background
    # interleave: m, b, m, b ... then whichever is left
    mixed = [k for pair in zip(kinds[:measured], kinds[measured:], strict=False) for k in pair]
    mixed += [True] * (measured - len(mixed) // 2) + [False] * (background - len(mixed) // 2)
    out = []
    for n, is_measured in enumerate(mixed):
        svc = order[n % len(order)]
        versions[svc.index] = versions.get(svc.index, 0) + 1
        out.append(Change(svc, versions[svc.index], is_measured))
    return out


def slice_of(change: Change, svc_obj: Obj, m: int) -> Obj:
    """The EndpointSlice object the change writes (a PUT, no resourceVersion: EndpointSlices
    allow unconditional updates)."""
    return _bare(endpoint_slice(change.svc.index, svc_obj, m, change.version))


# --------------------------------------------------------- kube-proxy's names for an endpoint


def _b32(text: str) -> str:
    return base64.b32encode(hashlib.sha256(text.encode()).digest()).decode()


def nft_endpoint_chain(svc: Service, ip: str) -> str:
    """kube-proxy nftables mode's chain for one endpoint of svc's port (pkg/proxy/nftables
    servicePortEndpointChainNameBase and hashAndTruncate), e.g.
    endpoint-5OJB2KTY-ns1/svc1/tcp/p80__10.180.0.1/80."""
    name = (f"{svc.namespace}/{svc.name}/{svc.protocol.lower()}/{svc.port_name}"
            f"__{ip.replace(':', '.')}/{svc.target_port}")
    base = _b32(name)[:8] + "-" + name
    return "endpoint-" + (base if len(base) <= 240 else base[:237] + "...")


def iptables_endpoint_chain(svc: Service, ip: str) -> str:
    """kube-proxy iptables mode's KUBE-SEP chain for one endpoint (pkg/proxy/iptables
    servicePortEndpointChainName), e.g. KUBE-SEP-SXIVWICOYRO3J4NJ."""
    port = f"{svc.namespace}/{svc.name}:{svc.port_name}"
    host = f"[{ip}]" if ":" in ip else ip
    return "KUBE-SEP-" + _b32(port + svc.protocol.lower() + f"{host}:{svc.target_port}")[:16]


# ------------------------------------------------------------------------------ figures


def percentile(values: Sequence[float], q: float) -> float:
    """The q-quantile (0..1) as the cluster benches take it: the ceil(q*n)-th smallest."""
    s = sorted(values)
    return s[max(0, round(q * len(s)) - 1)]


def cpu_seconds(stat: str, ticks: int) -> float:
    """utime + stime + cutime + cstime of a /proc/PID/stat line, in seconds: the process's
    threads and the children it waited for (kube-proxy's iptables-restore, ipset and nft runs,
    ipvsproxy's iptables-restore)."""
    fields = stat[stat.rindex(")") + 2:].split()
    return sum(int(f) for f in fields[11:15]) / ticks


def chunks(seq: Sequence[Any], n: int) -> Iterator[Sequence[Any]]:
    for i in range(0, len(seq), n):
        yield seq[i:i + n]
