"""The worked example of shared/reference/kube-proxy-ipvs.md §1.6 as plain API objects."""

from __future__ import annotations

from typing import Any


def svc(name: str, ip: str, ports: list[dict[str, Any]], type_: str = "ClusterIP",
        **spec: Any) -> dict[str, Any]:
    obj: dict[str, Any] = {"kind": "Service",
                           "metadata": {"namespace": "default", "name": name},
                           "spec": {"type": type_, "clusterIP": ip, "clusterIPs": [ip],
                                    "ports": ports, **spec}}
    return obj


def eps(name: str, service: str, port: int, endpoints: list[tuple[str, str]],
        port_name: str = "", proto: str = "TCP", family: str = "IPv4",
        **extra: Any) -> dict[str, Any]:
    return {"kind": "EndpointSlice", "addressType": family,
            "metadata": {"namespace": "default", "name": name,
                         "labels": {"kubernetes.io/service-name": service}, **extra},
            "ports": [{"name": port_name, "port": port, "protocol": proto}],
            "endpoints": [{"addresses": [ip], "nodeName": node,
                           "conditions": {"ready": True}} for ip, node in endpoints]}


def node(name: str = "node-a", ip: str = "192.168.1.10", **labels: str) -> dict[str, Any]:
    return {"kind": "Node", "metadata": {"name": name, "labels": labels},
            "status": {"addresses": [{"type": "InternalIP", "address": ip}]}}


def worked_example() -> list[dict[str, Any]]:
    lb = svc("lb", "10.96.30.30", [{"port": 443, "protocol": "TCP", "nodePort": 31443}],
             "LoadBalancer", loadBalancerSourceRanges=["198.51.100.0/24"])
    lb["status"] = {"loadBalancer": {"ingress": [{"ip": "203.0.113.10"}]}}
    return [
        node(),
        svc("web", "10.96.10.10", [{"port": 80, "protocol": "TCP"}]),
        eps("web-1", "web", 8080, [("10.244.1.5", "node-a"), ("10.244.2.7", "node-b")]),
        svc("np", "10.96.20.20", [{"port": 8080, "protocol": "TCP", "nodePort": 30080}],
            "NodePort", externalTrafficPolicy="Local"),
        eps("np-1", "np", 80, [("10.244.1.6", "node-a"), ("10.244.3.9", "node-c")]),
        lb,
        eps("lb-1", "lb", 8443, [("10.244.2.8", "node-b")]),
    ]
