"""The control plane the real-API tests run on (integration/upstream/controlplane.py) is the one
they claim: the pinned release, TLS verified against the server's own CA for both addresses it is
reached by, dual-stack service ranges, the `kubernetes` Service's endpoint at the address a lab
guest reaches it by, server-side apply with status, and the API server's own compactor at the
configured --etcd-compaction-interval."""

from __future__ import annotations

import socket
import ssl

import pytest

from integration.upstream import build
from integration.upstream.controlplane import GUEST_SIDE_ADDRESS, ControlPlane
from tests.realapi.conftest import Applied, wait_for
from tests.unit.kube_objects import port, service


def test_it_is_the_pinned_release(control_plane: ControlPlane) -> None:
    got = control_plane.request("GET", "/version")
    assert got["gitVersion"] == build.kubernetes_version()


def test_its_certificate_names_the_addresses_it_is_reached_by(
        control_plane: ControlPlane) -> None:
    # TLS to 127.0.0.1, verified as if reached by each address: its bind address, the one it
    # advertises (the host from a lab guest) and its ClusterIP
    ctx = ssl.create_default_context(cadata=control_plane.ca_pem)
    for name in ("127.0.0.1", GUEST_SIDE_ADDRESS, "10.96.0.1"):
        with socket.create_connection(("127.0.0.1", control_plane.port), timeout=10) as raw, \
                ctx.wrap_socket(raw, server_hostname=name) as tls:
            assert tls.version(), name
    with socket.create_connection(("127.0.0.1", control_plane.port), timeout=10) as raw, \
            pytest.raises(ssl.SSLCertVerificationError):
        ctx.wrap_socket(raw, server_hostname="10.0.2.3")


def test_the_kubernetes_service_points_at_the_guest_side_address(
        control_plane: ControlPlane) -> None:
    slices = control_plane.collection("EndpointSlice", "default",
                                      labelSelector="kubernetes.io/service-name=kubernetes")
    (sl,) = slices["items"]
    assert [e["addresses"] for e in sl["endpoints"]] == [[GUEST_SIDE_ADDRESS]]
    assert [p["port"] for p in sl["ports"]] == [control_plane.port]


def test_dual_stack_services_and_load_balancer_status(cluster: Applied) -> None:
    (svc,) = cluster.apply(service("dual", "10.96.30.1", port(80), type_="LoadBalancer",
                                   ipFamilyPolicy="RequireDualStack",
                                   ipFamilies=["IPv4", "IPv6"], clusterIPs=None,
                                   ingress=["203.0.113.30"]))
    assert svc["spec"]["clusterIPs"][0] == "10.96.30.1"
    assert svc["spec"]["clusterIPs"][1].startswith("fd00:96::")
    assert svc["status"]["loadBalancer"]["ingress"][0]["ip"] == "203.0.113.30"


def test_the_api_servers_compactor_runs_at_the_configured_interval(
        control_plane: ControlPlane, cluster: Applied) -> None:
    rev = int(cluster.apply({"kind": "ConfigMap", "metadata": {
        "name": "before", "namespace": "default"}})[0]["metadata"]["resourceVersion"])
    cluster.apply({"kind": "ConfigMap", "metadata": {"name": "after", "namespace": "default"}})
    control_plane.compaction_interval = "1s"
    try:
        control_plane.restart()
        # it compacts to the revision it saw one interval earlier: within a few intervals
        wait_for("the API server's compaction past the first write",
                 lambda: control_plane.compacted(rev), 60)
    finally:
        control_plane.compaction_interval = "0"
        control_plane.restart()
