"""The e2e node's harness without a node (integration/node/): what `make e2e` reads from
deploy/README.md is there, its manifests name the images it builds, and its readers of
`ipvsadm -Ln` listings and requirement files do what the steps rely on."""

from __future__ import annotations

import pytest
import yaml

from integration.node import e2e, images, lock
from integration.node.cluster import HOST_IP

MANIFESTS = e2e.HERE / "manifests"


def test_the_readme_commands_the_e2e_runs_are_in_deploy_readme() -> None:
    sed = e2e.readme_command('sed -i "s|newName: ipvsproxy$|')
    assert sed.endswith("deploy/kustomization.yaml") and "$REGISTRY/ipvsproxy" in sed
    configmap = e2e.readme_command("kubectl -n kube-system create configmap ipvsproxy-apiserver")
    assert configmap.count("\n") == 2  # its two continuation lines
    assert "=10.0.0.10" in configmap and "=6443" in configmap  # the values e2e replaces
    assert e2e.readme_command("kubectl apply -k deploy/") == "kubectl apply -k deploy/"
    swap = e2e.readme_block("## Replace kube-proxy")
    for line in ("kubectl apply -k deploy/", "kubectl -n kube-system patch daemonset kube-proxy",
                 "kubectl -n kube-system rollout status daemonset ipvsproxy"):
        assert line in swap
    assert "## " not in swap and HOST_IP not in swap and "--cleanup" not in swap


def test_the_manifests_name_the_images_the_e2e_builds() -> None:
    names = {f"{images.REPO}/echo:1", f"{images.REPO}/kube-proxy:v1.35.4"}
    found = set()
    for path in MANIFESTS.glob("*.yaml"):
        for doc in yaml.safe_load_all(path.read_text()):
            spec = (doc or {}).get("spec", {})
            pod = spec.get("template", {}).get("spec", spec)
            for c in pod.get("containers", []) + pod.get("initContainers", []):
                found.add(c["image"])
    assert found == names
    assert "__APISERVER__" in (MANIFESTS / "kube-proxy.yaml").read_text()


def test_real_servers_are_read_from_a_listing_as_the_steps_compare_them() -> None:
    listing = ("Prot LocalAddress:Port Scheduler Flags\n"
               "  -> RemoteAddress:Port           Forward Weight ActiveConn InActConn\n"
               "TCP  10.96.0.10:80 rr\n"
               "  -> 10.244.1.3:8080              Masq    1      0          0\n"
               "  -> 10.244.1.2:8080              Masq    1      0          0\n"
               "  -> 10.244.1.9:8080              Masq    0      2          0\n")
    assert e2e.real_servers(listing) == ["10.244.1.2:8080", "10.244.1.3:8080"]


def test_the_lock_reads_pins_with_or_without_hashes() -> None:
    text = ("# header\nfoo==1.0 \\\n    --hash=sha256:" + "a" * 64 + "\nbar-baz==2.1.3\n")
    header, pins = lock.parse(text)
    assert header == ["# header"] and pins == [("foo", "1.0"), ("bar-baz", "2.1.3")]
    out = lock.render(header, pins, {"foo": {"b" * 64, "a" * 64}, "bar-baz": {"c" * 64}})
    assert out == ("# header\nfoo==1.0 \\\n    --hash=sha256:" + "a" * 64 + " \\\n"
                   "    --hash=sha256:" + "b" * 64 + "\nbar-baz==2.1.3 \\\n"
                   "    --hash=sha256:" + "c" * 64 + "\n")


def test_the_swap_sampler_is_read_as_its_changes() -> None:
    samples = ("14:00:00.000 proxy=[kube-proxy,] vs=6\n14:00:00.500 proxy=[kube-proxy,] vs=6\n"
               "14:00:01.000 proxy=[] vs=6\n14:00:01.500 proxy=[] vs=6\n")
    assert e2e.changes(samples) == ["14:00:00.000 proxy=[kube-proxy,] vs=6",
                                    "14:00:01.000 proxy=[] vs=6", "14:00:01.500 proxy=[] vs=6"]
    assert e2e.changes("") == []
    assert "[i]pvsproxy run --config" in e2e.SAMPLER  # not the sampler's own command line


def test_the_clients_fail_the_step_on_one_failed_connection() -> None:
    urls = ["http://a/", "http://b/"]
    ok = {"ok": 3, "failed": 0, "errors": [], "slowest": 0.1, "last_error": ""}
    counts = {"node": {u: dict(ok) for u in urls}, "pod": {u: dict(ok) for u in urls}}
    assert e2e.check_clients(counts, urls) == 12
    counts["pod"]["http://b/"] = dict(ok, failed=1, errors=["14:00:01 refused"])
    with pytest.raises(e2e.Failed, match="pod -> http://b/: 1 connections failed"):
        e2e.check_clients(counts, urls)
    with pytest.raises(e2e.Failed, match="the pod's clients"):
        e2e.check_clients({"node": counts["node"], "pod": "kubectl exec: error"}, urls)
