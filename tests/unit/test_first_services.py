"""Finding the objects of the services a cold node programs first (core/cluster.first_objects),
without parsing the rest."""

from __future__ import annotations

from ipvsproxy.core import tables as T
from ipvsproxy.core.cluster import first_objects
from tests.unit.kube_objects import ep, node, port, service, slice_


def test_only_the_first_services_their_slices_and_nodes() -> None:
    kube = service("kubernetes", "10.96.0.1", port(443))
    kube_eps = slice_("kubernetes", ep("192.168.1.10"), port=6443)
    dns = service("kube-dns", "10.96.0.10", port(53, "dns", "UDP"), ns="kube-system")
    dns_eps = slice_("kube-dns", ep("10.244.1.9"), ns="kube-system", name="kube-dns-x")
    other = [service("web", "10.96.0.20"), slice_("web", ep("10.244.1.5")),
             service("kubernetes", "10.96.0.30", ns="other"),  # same name, other namespace
             slice_("kube-dns", ep("10.244.1.7"), ns="default"),
             {"kind": "EndpointSlice", "metadata": {"namespace": "default", "labels": None}},
             {"kind": "Service", "metadata": "garbage"}, "not an object",
             # names and namespaces that are not strings (unhashable ones too) never match
             {"kind": "Service", "metadata": {"namespace": "default", "name": ["kubernetes"]}},
             {"kind": "Service", "metadata": {"namespace": {"x": 1}, "name": "kubernetes"}},
             {"kind": "EndpointSlice", "metadata": {
                 "namespace": ["default"],
                 "labels": {"kubernetes.io/service-name": "kubernetes"}}},
             {"kind": "EndpointSlice", "metadata": {
                 "namespace": "default", "labels": {"kubernetes.io/service-name": {}}}},
             {"kind": "EndpointSlice", "metadata": None}]
    n = node()
    docs = [*other, {"kind": "List", "items": [kube, kube_eps]}, dns, dns_eps, n]
    assert first_objects(docs, T.FIRST_SERVICES) == [kube, kube_eps, dns, dns_eps, n]
    assert first_objects(other, T.FIRST_SERVICES) == []
