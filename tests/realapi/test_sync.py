"""`ipvsproxy sync --once --kubeconfig` against the real API server computes the very dataplane
that `--from-file` computes from a dump of the same objects made by `kubectl get -A -o yaml`.

The two paths differ on the way in: `--kubeconfig` lists with deploy/'s ServiceAccount token and
kube-proxy's label selector (the server leaves out another proxy's and headless objects), pages
with limit/continue, GETs its own Node; `--from-file` reads kubectl's `kind: List` of every
object, as the admin sees them, with apiVersion and kind on each item. The cluster mixes what
either path could get wrong: every Service type, traffic policies, affinity, dual-stack, the
scheduler and weight annotations, a load balancer's status, another proxy's and headless
services, an ExternalName, another namespace, another node, an externalIP inside the cluster's
ServiceCIDR (refused the same way), and the API server's own `kubernetes` Service.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import yaml

from integration.upstream.client import ROOT
from integration.upstream.controlplane import ControlPlane
from ipvsproxy.inputs.kubectl_yaml import KubectlLoader
from tests.realapi.conftest import Applied
from tests.unit.kube_objects import ep, node, port, service, slice_

FLAGS = ["--hostname-override", "node-a", "--cluster-cidr", "10.244.0.0/16,fd00:244::/56",
         "--ip-families", "4,6"]
OTHER_PROXY = {"service.kubernetes.io/service-proxy-name": "another-proxy"}
HEADLESS = {"service.kubernetes.io/headless": ""}


def objects() -> list[dict[str, Any]]:
    http = port(80, "http")
    ep_a, ep_b = ep("10.244.1.11", "node-a"), ep("10.244.2.12", "node-b")
    return [
        node("node-a", "192.168.1.10", "2001:db8::10"), node("node-b", "192.168.1.11"),
        service("web", "10.96.20.10", http, sessionAffinity="ClientIP"),
        slice_("web", ep_a, ep_b, port=8080, port_name="http"),
        service("np", "10.96.20.11", port(80, "http", node_port=30080), type_="NodePort",
                externalTrafficPolicy="Local"),
        slice_("np", ep_b, ep("10.244.1.13", "node-a", ready=False, serving=True,
                              terminating=True), port=8080, port_name="http"),
        service("lb", "10.96.20.12", port(443, "https", node_port=30443),
                type_="LoadBalancer", ingress=["203.0.113.10"],
                loadBalancerSourceRanges=["192.0.2.0/24"]),
        slice_("lb", ep_a, port=8443, port_name="https"),
        service("ext", "10.96.20.13", http, externalIPs=["198.51.100.7", "10.96.99.99"]),
        slice_("ext", ep_b, port=8080, port_name="http"),
        service("dual", ["10.96.20.14", "fd00:96::14"], http, ipFamilyPolicy="RequireDualStack",
                ipFamilies=["IPv4", "IPv6"]),
        slice_("dual", ep_a, port=8080, port_name="http"),
        slice_("dual", ep("fd00:244:1::11", "node-a"), family="IPv6", port=8080,
               port_name="http"),
        # kubectl writes these three unquoted (issue 35): the dump must be read all the same
        service("canary", "10.96.20.15", http,
                annotations={"ipvsproxy.io/scheduler": "wrr", "note": "=", "merge": "<<",
                             "day": "2026-13-45"}),
        slice_("canary", ep_a, name="canary-stable", port=8080, port_name="http", weight="9"),
        slice_("canary", ep_b, name="canary-next", port=8080, port_name="http", weight="1"),
        service("dns", "10.96.0.10", port(53, "dns", "UDP"), port(53, "dns-tcp"),
                ns="kube-system"),
        slice_("dns", ep("10.244.1.20", "node-a"), ns="kube-system",
               ports=[{"name": "dns", "port": 53, "protocol": "UDP"},
                      {"name": "dns-tcp", "port": 53, "protocol": "TCP"}]),
        service("theirs", "10.96.20.16", http, labels=OTHER_PROXY),
        slice_("theirs", ep_a, port=8080, port_name="http",
               labels={**OTHER_PROXY, "kubernetes.io/service-name": "theirs"}),
        service("hl", "None", http),
        slice_("hl", ep_a, port=8080, port_name="http",
               labels={**HEADLESS, "kubernetes.io/service-name": "hl"}),
        {"kind": "Service", "metadata": {"name": "away", "namespace": "default"},
         "spec": {"type": "ExternalName", "externalName": "example.invalid"}},
    ]


def ipvsproxy(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "ipvsproxy", *args], cwd=ROOT,
                          capture_output=True, text=True, timeout=300, check=False)


def desired(*source: str) -> tuple[Any, list[str]]:
    p = ipvsproxy("sync", "--once", *source, "-o", "json", *FLAGS)
    assert p.returncode == 0, p.stderr
    return json.loads(p.stdout), sorted(p.stderr.splitlines())


def kubectl() -> str:
    path = shutil.which("kubectl")
    # not a skip: a missing kubectl is a broken machine (make setup installs it)
    assert path, "kubectl is not installed; `make setup` installs it"
    return path


def test_sync_from_the_api_server_equals_sync_from_kubectls_dump(
        control_plane: ControlPlane, cluster: Applied, proxy_kubeconfig: Path,
        tmp_path: Path) -> None:
    cluster.apply(objects())
    admin = control_plane.kubeconfig(tmp_path / "admin.kubeconfig")
    dump = subprocess.run(
        [kubectl(), "--kubeconfig", str(admin), "get",
         "services,endpointslices,nodes,servicecidrs", "--all-namespaces", "-o", "yaml"],
        capture_output=True, text=True, timeout=120, check=False)
    assert dump.returncode == 0, dump.stderr
    listed = yaml.load(dump.stdout, Loader=KubectlLoader)  # safe_load refuses 2026-13-45
    assert listed["kind"] == "List"
    assert all(i.get("apiVersion") and i.get("kind") for i in listed["items"])
    (tmp_path / "cluster.yaml").write_text(dump.stdout)
    assert "\n      note: =\n" in dump.stdout and "\n      day: 2026-13-45\n" in dump.stdout

    from_api, warned_api = desired("--kubeconfig", str(proxy_kubeconfig))
    from_file, warned_file = desired("--from-file", str(tmp_path / "cluster.yaml"))
    assert from_api == from_file
    assert warned_api == warned_file
    # and it is the cluster: what it must hold, and not what it must leave out
    owners = {vs["owner"] for vs in from_api["virtual_servers"]}
    assert owners >= {"default/web:http", "default/np:http", "default/lb:https",
                      "default/ext:http", "default/dual:http", "default/canary:http",
                      "kube-system/dns:dns", "kube-system/dns:dns-tcp", "default/kubernetes:https"}
    assert not {o for o in owners if o.split(":")[0] in ("default/theirs", "default/hl",
                                                          "default/away")}
    vips = {vs["virtual_server"].split()[1].rpartition(":")[0]
            for vs in from_api["virtual_servers"]}
    assert {"203.0.113.10", "198.51.100.7", "[fd00:96::14]"} <= vips
    assert "10.96.99.99" not in vips  # an externalIP inside the ServiceCIDR: refused, said
    assert any("10.96.99.99" in p for p in from_api["problems"]), from_api["problems"]

