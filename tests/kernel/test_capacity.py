"""ipset capacity against a real kernel: a cluster with more ClusterIP:port pairs than the set
it inherits can hold.

kube-proxy creates KUBE-CLUSTER-IP with a fixed `maxelem 65536` and cannot sync a cluster with
more pairs ("Hash is full, cannot add more elements"). ipvsproxy sizes sets from the desired
state; here it takes over a set that is too small, resizes it by filling a larger scratch set
and swapping it in, and a real request to the very last ClusterIP:port is masqueraded, which
only happens when KUBE-CLUSTER-IP matches it.

`make capacity` runs it at issue 8's size: 70,000 pairs into kube-proxy's maxelem-65536 set
(about 13 minutes under emulation: 70,000 virtual servers). In `make test` the same path runs
at 2,000 pairs into a set created with maxelem 1024.
"""

from __future__ import annotations

import json
import os
import re
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.kernel import forked
from tests.kernel.conftest import sh
from tests.kernel.test_traffic import FLAGS, PODS_SH, who

pytestmark = [pytest.mark.kernel, pytest.mark.lab_cost(60)]  # seconds, balances lab guests
FULL = os.environ.get("IPVSPROXY_CAPACITY_FULL") == "1"
# (services, ports each, the maxelem of the set found on the node, the maxelem it must get)
SERVICES, PORTS, FOUND, RESIZED = (700, 100, 65536, 262144) if FULL else (20, 100, 1024, 65536)


def cluster_ip(i: int) -> str:
    return f"10.100.{i // 200}.{i % 200 + 1}"


def cluster() -> dict[str, Any]:
    items: list[dict[str, Any]] = [
        {"kind": "Node", "metadata": {"name": "node-a"},
         "status": {"addresses": [{"type": "InternalIP", "address": "192.168.1.10"}]}}]
    for i in range(SERVICES):
        items.append({"kind": "Service", "metadata": {"namespace": "big", "name": f"s{i}"},
                      "spec": {"clusterIP": cluster_ip(i), "ports": [
                          {"name": f"p{p}", "port": 1000 + p, "targetPort": 8080,
                           "protocol": "TCP"} for p in range(PORTS)]}})
    last = SERVICES - 1
    items.append({"kind": "EndpointSlice", "addressType": "IPv4",
                  "metadata": {"namespace": "big", "name": f"s{last}-1",
                               "labels": {"kubernetes.io/service-name": f"s{last}"}},
                  "ports": [{"name": f"p{PORTS - 1}", "port": 8080, "protocol": "TCP"}],
                  "endpoints": [{"addresses": ["10.244.1.11"], "nodeName": "node-a",
                                 "conditions": {"ready": True}}]})
    return {"kind": "List", "items": items}


@pytest.fixture
def big(ipvs_modules: None, tmp_path: Path) -> Iterator[Path]:
    forked.run(["cleanup"])
    sh("ipvsadm -C")
    sh(f"{PODS_SH} up pod1")
    path = tmp_path / "big.json"
    path.write_text(json.dumps(cluster()))
    yield path
    forked.run(["cleanup"])
    sh("ipvsadm -C")
    sh(f"{PODS_SH} down")


def header(name: str) -> dict[str, str]:
    out = sh(f"ipset list -t {name}")
    return dict(re.findall(r"^([A-Za-z ]+): ?(.*)$", out, re.M))


def test_more_cluster_ip_ports_than_the_set_holds(big: Path) -> None:
    # what kube-proxy leaves behind: its set, too small (the sync writes the iptables rules
    # that reference it before it resizes it: the swap happens under a live reference)
    sh(f"ipset create KUBE-CLUSTER-IP hash:ip,port family inet hashsize 1024 maxelem {FOUND}")
    t0 = time.monotonic()
    p = forked.run(["sync", "--once", "--from-file", str(big), *FLAGS])
    took = time.monotonic() - t0
    assert p.returncode == 0, p.stdout + p.stderr[-3000:]
    h = header("KUBE-CLUSTER-IP")
    assert int(h["Number of entries"]) == SERVICES * PORTS
    assert f"maxelem {RESIZED} " in h["Header"], h
    assert not re.search(r"ipvsproxy-tmp-", sh("ipset list -n"))  # the scratch set is gone
    vs = sum(1 for line in sh("ipvsadm -Sn").splitlines() if line.startswith("-A"))
    assert vs == SERVICES * PORTS
    # the last pair is in the set, and packets prove it: from outside the cluster CIDR, a
    # request to a ClusterIP is masqueraded only when KUBE-CLUSTER-IP matches it
    last = f"{cluster_ip(SERVICES - 1)},tcp:{1000 + PORTS - 1}"
    sh(f"ipset test KUBE-CLUSTER-IP {last}")
    assert who(f"http://{cluster_ip(SERVICES - 1)}:{1000 + PORTS - 1}", ns="client") == (
        "pod1", "10.244.1.1")
    # converged: a second sync has nothing to do, and does not resize again
    again = forked.run(["sync", "--once", "--dry-run", "--from-file", str(big), *FLAGS])
    assert again.returncode == 0 and again.stdout == "", again.stdout[:2000] + again.stderr
    print(f"\n{SERVICES * PORTS} ClusterIP:port pairs: sync {took:.1f} s in the lab, "
          f"KUBE-CLUSTER-IP {h['Header']}")
