"""Parsing API objects into the cluster model: what is kept, skipped, and reported."""

from __future__ import annotations

from ipaddress import ip_address, ip_network
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ipvsproxy.core.model import (
    Proto,
    ServicePort,
    parse_node,
    parse_service,
)
from ipvsproxy.core.slices import parse_endpoint_slice


def svc(spec: dict[str, Any], name: str = "web", **meta: Any) -> dict[str, Any]:
    return {"metadata": {"namespace": "default", "name": name, **meta}, "spec": spec}


def test_clusterip_service() -> None:
    s, problems = parse_service(svc({"clusterIP": "10.96.0.10", "ports": [
        {"name": "dns", "protocol": "UDP", "port": 53},
        {"name": "dns-tcp", "port": 53}]}))
    assert problems == []
    assert s is not None
    assert s.cluster_ips == (ip_address("10.96.0.10"),)
    assert s.ports == (ServicePort("dns", Proto.UDP, 53), ServicePort("dns-tcp", Proto.TCP, 53))


@pytest.mark.parametrize("spec,labels", [
    ({"clusterIP": "None", "ports": [{"port": 80}]}, {}),
    ({"type": "ExternalName", "externalName": "x.example", "clusterIP": "10.0.0.1"}, {}),
    ({"clusterIP": "10.0.0.1", "ports": [{"port": 80}]},
     {"service.kubernetes.io/service-proxy-name": "other"}),
    ({"clusterIP": "10.0.0.1", "ports": [{"port": 80}]}, {"service.kubernetes.io/headless": ""}),
])
def test_skipped_without_a_problem(spec: dict[str, Any], labels: dict[str, str]) -> None:
    assert parse_service(svc(spec, labels=labels)) == (None, [])


def test_one_bad_port_is_reported_and_the_rest_kept() -> None:
    s, problems = parse_service(svc({"clusterIP": "10.96.0.1", "ports": [
        {"name": "a", "port": 70000}, {"name": "b", "port": 80, "protocol": "QUIC"},
        {"name": "c", "port": 443}]}))
    assert s is not None and [p.name for p in s.ports] == ["c"]
    assert len(problems) == 2
    assert all(str(p).startswith("Service default/web: spec.ports[") for p in problems)


def test_a_bad_address_listed_twice_is_reported_once() -> None:
    """(Found by test_hostile_input: clusterIPs ['::ffff:10.200.7.0'] twice was reported
    twice, once per copy.)"""
    s, problems = parse_service(svc({
        "clusterIPs": ["10.96.0.1", "x", [], "x", []], "externalIPs": ["y", "y", "1.2.3.4"],
        "ports": [{"name": "a", "port": 80}]}))
    assert s is not None and s.external_ips == (ip_address("1.2.3.4"),)
    assert sorted(str(p) for p in problems) == [
        "Service default/web: clusterIP 'x' is not a valid IP address; ignored",
        "Service default/web: clusterIP [] is not a valid IP address; ignored",
        "Service default/web: externalIP 'y' is not a valid IP address; ignored"]


def test_loadbalancer_fields() -> None:
    obj = svc({"type": "LoadBalancer", "clusterIP": "10.96.3.3", "externalTrafficPolicy": "Local",
               "healthCheckNodePort": 32000, "loadBalancerSourceRanges": ["198.51.100.0/24"],
               "sessionAffinity": "ClientIP",
               "ports": [{"port": 443, "nodePort": 31443}]})
    obj["status"] = {"loadBalancer": {"ingress": [
        {"ip": "203.0.113.10"}, {"ip": "203.0.113.11", "ipMode": "Proxy"},
        {"hostname": "lb.example"}]}}
    s, problems = parse_service(obj)
    assert problems == [] and s is not None
    assert s.lb_ingress_ips == (ip_address("203.0.113.10"),)
    assert s.lb_source_ranges == (ip_network("198.51.100.0/24"),)
    assert (s.external_local, s.health_check_node_port, s.affinity_timeout) == (True, 32000, 10800)
    assert s.ports[0].node_port == 31443


def test_scheduler_annotations() -> None:
    s, problems = parse_service(svc({"clusterIP": "10.96.0.1", "ports": [{"port": 80}]},
                                    annotations={"ipvsproxy.io/scheduler": "sh",
                                                 "ipvsproxy.io/scheduler-flags":
                                                     "sh-fallback, sh-port, bogus"}))
    assert s is not None and (s.scheduler, s.sched_flags) == ("sh", 0x18)
    assert [p.reason for p in problems] == [
        "annotation ipvsproxy.io/scheduler-flags: unknown flags 'bogus' ignored"]


def slice_(endpoints: list[Any], **ann: str) -> dict[str, Any]:
    return {"metadata": {"namespace": "default", "name": "web-abc",
                         "labels": {"kubernetes.io/service-name": "web"}, "annotations": ann},
            "addressType": "IPv4", "ports": [{"name": "", "port": 8080, "protocol": "TCP"}],
            "endpoints": endpoints}


def test_endpoint_slice_conditions_and_weight() -> None:
    es, problems = parse_endpoint_slice(slice_([
        {"addresses": ["10.244.1.5"], "nodeName": "n1"},
        {"addresses": ["10.244.1.6"], "conditions": {"ready": False, "serving": True,
                                                     "terminating": True}},
        {"addresses": ["not-an-ip"]}], **{"ipvsproxy.io/weight": "5"}))
    assert es is not None and es.weight == 5 and es.service == "web"
    assert [(str(e.addr), e.ready, e.serving, e.terminating) for e in es.endpoints] == [
        ("10.244.1.5", True, True, False), ("10.244.1.6", False, True, True)]
    assert len(problems) == 1 and "endpoints[2]" in problems[0].reason


@pytest.mark.parametrize("raw", ["-1", "65536", "x", "1.5", "٣"])
def test_bad_weight_reported_and_default_used(raw: str) -> None:
    es, problems = parse_endpoint_slice(slice_([], **{"ipvsproxy.io/weight": raw}))
    assert es is not None and es.weight == 1
    assert len(problems) == 1 and "ipvsproxy.io/weight" in problems[0].reason


def test_node() -> None:
    n, _ = parse_node({"metadata": {"name": "n1", "labels": {"topology.kubernetes.io/zone": "z1"}},
                       "spec": {"taints": [{"key": "ToBeDeletedByClusterAutoscaler"}]},
                       "status": {"addresses": [{"type": "InternalIP", "address": "192.168.1.10"},
                                                {"type": "Hostname", "address": "n1"}]}})
    assert n is not None and n.zone == "z1" and n.deleting
    assert n.addresses == (ip_address("192.168.1.10"),)


json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=8),
    lambda c: st.lists(c, max_size=4) | st.dictionaries(st.text(max_size=8), c, max_size=4),
    max_leaves=20)


@settings(max_examples=300, deadline=None)
@given(json_values)
def test_garbage_never_raises(obj: Any) -> None:
    for parse in (parse_service, parse_endpoint_slice, parse_node):
        if isinstance(obj, dict):
            parse(obj)
            parse({"metadata": {"name": "x", "namespace": "y"}, "spec": obj, **obj})


def test_unhashable_protocols_are_reported_not_raised() -> None:
    # found by tests/unit/test_hostile_input.py: `{} in Proto.__members__` raised TypeError
    svc, problems = parse_service({"metadata": {"namespace": "evil", "name": "p"},
                                   "spec": {"clusterIP": "10.96.0.1", "ports": [
                                       {"port": 80, "protocol": {}}, {"port": 81}]}})
    assert svc is not None and [p.port for p in svc.ports] == [81]
    assert any("spec.ports[0] is invalid" in p.reason for p in problems)
    _, problems = parse_endpoint_slice({
        "addressType": "IPv4", "metadata": {"namespace": "evil", "name": "s",
                                            "labels": {"kubernetes.io/service-name": "p"}},
        "ports": [{"port": 80, "protocol": ["TCP"]}], "endpoints": []})
    assert problems
