"""What a generated cluster is, as the rest of the differential suite sees it: the label and
zone constants, the feature tables (every feature a cluster or a change series can cover),
`Params` (what a cluster must fit), `Change` (one write through the API server), `Cluster` (the
API objects of one seed, in load order) and `key_of`. Values only: generate.py makes them.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass
from typing import Any

Obj = dict[str, Any]

MANAGED_BY = "differential.ipvsproxy.io"
LABEL_MANAGED_BY = "endpointslice.kubernetes.io/managed-by"
LABEL_SERVICE_NAME = "kubernetes.io/service-name"
LABEL_PROXY_NAME = "service.kubernetes.io/service-proxy-name"
LABEL_HEADLESS = "service.kubernetes.io/headless"
LABEL_ZONE = "topology.kubernetes.io/zone"
# The other nodes of the cluster (endpoints there are remote; node-b in zone-a, node-c in
# zone-b) and the zones (this node's is zone-a, none, or another after a change).
OTHER_NODES = ("node-b", "node-c")
ZONES = ("zone-a", "zone-b", "zone-c")
PROTOCOLS = ("TCP", "UDP", "SCTP")

# Every feature a cluster or a change series can cover (what features()/change.feature name).
SERVICE_FEATURES = (
    "svc:ClusterIP", "svc:NodePort", "svc:LoadBalancer", "svc:ExternalName", "svc:headless",
    "proto:TCP", "proto:UDP", "proto:SCTP", "ports:multi", "ports:unnamed",
    "nodeport:tcp-udp-same-number",
    "family:ipv4", "family:ipv6", "family:dual-v4-primary", "family:dual-v6-primary",
    "family:prefer-dual", "family:implicit",
    "externalIPs", "externalIPs:ipv6", "externalIPs:node-address", "externalIPs:clusterip-local",
    "lb:vip", "lb:proxy", "lb:ipmode-unset", "lb:hostname", "lb:ipv6", "lb:other-family",
    "lb:node-address", "lb:no-nodeports", "lb:no-status",
    "sourceRanges", "sourceRanges:node", "sourceRanges:zero", "sourceRanges:padded",
    "sourceRanges:host-bits", "sourceRanges:ipv6",
    "affinity:ClientIP", "affinity:default-timeout",
    "etp:Local", "etp:Local-no-local-endpoints", "itp:Local", "hcnp",
    "td:PreferClose", "td:PreferSameZone", "td:PreferSameNode",
    "label:service-proxy-name", "ann:ipvsproxy-scheduler", "ann:ipvsproxy-weight",
    "lb:same-as-externalIP", "invalid:externalIP-leading-zeros",
    "invalid:externalIP-ipv4-mapped", "invalid:lb-ip-leading-zeros",
    "externalIPs:service-range", "invalid:externalIP-multicast", "invalid:lb-ip-link-local",
)
ENDPOINT_FEATURES = (
    "ep:ready", "ep:conditions-unset", "ep:not-ready", "ep:serving-terminating",
    "ep:terminating-not-serving", "ep:local", "ep:remote", "ep:no-node", "ep:multi-address",
    "ep:duplicate", "ep:none",
    "hints:zone", "hints:zone-other", "hints:zone-partial", "hints:node", "hints:node-other",
    "hints:node-partial", "hints:zone-empty-name",
    "slice:multi", "slice:no-service-label", "slice:orphan", "slice:port-name-mismatch",
    "slice:protocol-mismatch", "slice:port-nil", "slice:port-zero", "slice:fqdn",
    "slice:other-family", "slice:headless-label", "slice:proxy-name-label",
    "invalid:endpoint-leading-zeros", "invalid:endpoint-multicast",
)
NODE_FEATURES = ("node:zone", "node:no-zone", "node:ipv4-only")
FEATURES = SERVICE_FEATURES + ENDPOINT_FEATURES + NODE_FEATURES
CHANGE_FEATURES = (
    "chg:scale-up", "chg:scale-down", "chg:condition", "chg:hints", "chg:type", "chg:etp",
    "chg:itp", "chg:affinity", "chg:externalIPs", "chg:lb-status", "chg:source-ranges",
    "chg:ports", "chg:delete-service", "chg:create-service", "chg:delete-slice",
    "chg:create-slice", "chg:node-zone",
)


@dataclass(frozen=True, slots=True)
class Params:
    """What the cluster must fit: the API server's ranges and this node."""

    services: int = 12
    # --service-cluster-ip-range of the API server: the IPv4 range, then the IPv6 one
    service_cidrs: tuple[str, str] = ("10.96.0.0/16", "fd00:96::/112")
    node_port_range: tuple[int, int] = (30000, 32767)  # --service-node-port-range
    node_name: str = "diff-node"
    node_ips: tuple[str, str] = ("192.168.77.10", "fd00:77::10")  # on a NIC of the lab guest
    cluster_cidrs: tuple[str, str] = ("10.244.0.0/16", "fd00:244::/56")  # pods
    namespaces: tuple[str, ...] = ("diff-a", "diff-b")
    reserved: int = 16  # the first addresses of each service CIDR (kubernetes, DNS) are not used


@dataclass(frozen=True, slots=True)
class Change:
    """One write through the API server.

    op: "create" (POST), "replace" (PUT of the whole object, no resourceVersion), "status" (a
    merge patch of a Service's status subresource: obj holds metadata and status) or "delete"
    (obj holds apiVersion, kind and metadata).
    """

    op: str
    obj: Obj
    feature: str

    @property
    def key(self) -> tuple[str, str, str]:
        return key_of(self.obj)


@dataclass(slots=True)
class Cluster:
    seed: int
    params: Params
    namespaces: list[Obj]
    node: Obj
    services: list[Obj]  # as created (a Service's status is set afterwards, see lb_status)
    lb_status: list[Obj]  # metadata + status of LoadBalancer Services with ingress
    slices: list[Obj]

    def steps(self) -> list[Change]:
        """Loading the cluster into an empty API server, in order."""
        out = [Change("create", o, "load") for o in (*self.namespaces, self.node)]
        out += [Change("create", o, "load") for o in self.services]
        out += [Change("status", o, "load") for o in self.lb_status]
        out += [Change("create", o, "load") for o in self.slices]
        return out

    def objects(self) -> list[Obj]:
        """The cluster as one list (Services with their status), e.g. for `--from-file`."""
        status = {key_of(s): s["status"] for s in self.lb_status}
        svcs = [dict(s, status=status[key_of(s)]) if key_of(s) in status else s
                for s in self.services]
        return [*self.namespaces, self.node, *svcs, *self.slices]

    def features(self) -> Counter[str]:
        from tests.differential.features import features  # features.py imports this module

        return features(self.node, self.services, self.lb_status, self.slices, self.params)


def key_of(obj: Obj) -> tuple[str, str, str]:
    m = obj["metadata"]
    return obj["kind"], m.get("namespace", ""), m["name"]
