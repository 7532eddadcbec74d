"""The differential suite's generator, offline: determinism, coverage, and validity as far as it
can be checked without the API server (the lab loads every generated cluster into the real one).
"""

from __future__ import annotations

import json
from collections import Counter
from ipaddress import ip_address, ip_network

import kubernetes_validate
import pytest

from tests.differential import changes as C
from tests.differential import features as F
from tests.differential import generate as G
from tests.differential import validity as V
from tests.differential.cluster import CHANGE_FEATURES, FEATURES, Params, key_of
from tests.differential.model import _leading_zeros

SEEDS = range(8)  # consecutive seeds walk through every feature (generate._FOCUS_ORDER)
SCHEMA = "1.35.0"


def dump(objs: object) -> str:
    return json.dumps(objs, sort_keys=True)


def test_the_same_seed_gives_the_same_cluster_and_changes() -> None:
    for seed in (0, 7, 123):
        a, b = G.generate(seed), G.generate(seed)
        assert dump(a.objects()) == dump(b.objects())
        assert dump([(c.op, c.obj, c.feature) for c in C.changes(a, 40, seed)]) == \
            dump([(c.op, c.obj, c.feature) for c in C.changes(b, 40, seed)])



_DIGEST = """
import hashlib, json
from tests.differential import changes, generate
h = hashlib.sha256()
for seed in range(1, 31):
    c = generate.generate(seed)
    steps = [(x.op, x.obj, x.feature) for x in changes.changes(c, 40, seed)]
    h.update(json.dumps([c.objects(), steps], sort_keys=True).encode())
print(h.hexdigest())
"""


def test_the_same_seed_gives_the_same_cluster_in_every_process() -> None:
    """Nothing depends on set order, which str hashing changes from process to process: a
    seed named in a failure report must give the same cluster when run again."""
    import os
    import subprocess
    import sys
    from pathlib import Path

    root = Path(__file__).resolve().parents[2]
    digests = {subprocess.run([sys.executable, "-c", _DIGEST], cwd=root, check=True, text=True,
                              capture_output=True, env=dict(os.environ, PYTHONHASHSEED=str(h))
                              ).stdout for h in (1, 2, 3)}
    assert len(digests) == 1, digests

def test_other_seeds_give_other_clusters() -> None:
    clusters = {dump(G.generate(s).objects()) for s in range(10)}
    assert len(clusters) == 10


def test_params_are_honoured() -> None:
    p = Params(services=5, service_cidrs=("10.100.0.0/24", "fd00:100::/120"),
                 node_port_range=(31000, 31099), node_name="node-x",
                 namespaces=("one",))
    c = G.generate(3, p)
    assert len(c.services) == 5
    assert c.node["metadata"]["name"] == "node-x"
    assert V.problems(c) == []
    for s in c.services:
        assert s["metadata"]["namespace"] == "one"
        for a in s["spec"].get("clusterIPs", []):
            if a != "None":
                net = ip_network(p.service_cidrs[0] if "." in a else p.service_cidrs[1])
                assert ip_address(a) in net
        for port in s["spec"].get("ports", []):
            assert port.get("nodePort", 31000) in range(31000, 31100)


def test_every_feature_is_covered_by_a_few_seeds() -> None:
    total = F.coverage(SEEDS)
    assert set(FEATURES) - set(total) == set()
    assert set(total) <= set(FEATURES)  # features() names nothing the table does not list


def test_each_cluster_mixes_many_features() -> None:
    for seed in SEEDS:
        feats = G.generate(seed).features()
        assert len(feats) >= 30, (seed, sorted(feats))
        kinds = {f for f in feats if f.startswith("svc:")}
        assert len(kinds) >= 3, (seed, kinds)


def test_every_change_kind_is_covered() -> None:
    total = C.change_coverage(range(4), 60)
    assert set(CHANGE_FEATURES) - set(total) == set()


@pytest.mark.parametrize("seed", range(40))
def test_generated_clusters_break_no_rule_checked_offline(seed: int) -> None:
    assert V.problems(G.generate(seed)) == []


@pytest.mark.parametrize("seed", range(6))
def test_objects_match_the_1_35_schema(seed: int) -> None:
    c = G.generate(seed)
    for obj in [*c.objects()]:
        try:
            kubernetes_validate.validate(obj, SCHEMA, strict=True)
        except kubernetes_validate.ValidationError as exc:
            raise AssertionError(f"{key_of(obj)}: {exc}") from None


@pytest.mark.parametrize("seed", range(6))
def test_each_change_leaves_a_cluster_that_breaks_no_rule(seed: int) -> None:
    """Replay the changes on the objects as the API server stores them (a Service's status
    apart, and dropped when it stops being a LoadBalancer) and check the state after each."""
    c = G.generate(seed)
    services = {key_of(s): s for s in c.services}
    status = {key_of(s): s for s in c.lb_status}
    slices = {key_of(s): s for s in c.slices}
    node = c.node
    for change in C.changes(c, 60, seed):
        k, obj = change.key, change.obj
        table = {"Service": services, "EndpointSlice": slices}.get(k[0])
        if change.op != "delete":
            try:
                kubernetes_validate.validate(obj, SCHEMA, strict=True)
            except kubernetes_validate.ValidationError as exc:
                raise AssertionError(f"{change.op} {k}: {exc}") from None
        if k[0] == "Node":
            assert change.op == "replace"
            node = dict(obj, status=node["status"])
        elif change.op == "status":
            assert services[k]["spec"]["type"] == "LoadBalancer"
            status[k] = obj
        else:
            assert table is not None
            assert (k in table) == (change.op != "create"), (change.op, k)
            if change.op == "delete":
                del table[k]
                status.pop(k, None)
            else:
                if k in services and change.op == "replace":
                    old = services[k]["spec"]
                    if old.get("clusterIP") != "None":  # clusterIPs are immutable
                        assert old["clusterIPs"] == obj["spec"]["clusterIPs"]
                    if obj["spec"]["type"] != "LoadBalancer":
                        status.pop(k, None)
                table[k] = obj
        problems = V.check_objects(c.params, [node], list(services.values()),
                                   list(status.values()), list(slices.values()))
        assert problems == [], (change.op, change.feature, k)


def test_changes_never_reuse_an_address_or_a_node_port() -> None:
    """A deleted Service's clusterIP and nodePorts are released asynchronously: a series that
    reused them could be refused, so it never does."""
    for seed in range(5):
        c = G.generate(seed)
        seen_ips: Counter[str] = Counter()
        seen_ports: Counter[int] = Counter()
        for s in c.services:
            seen_ips.update(a for a in s["spec"].get("clusterIPs", []) if a != "None")
        for change in C.changes(c, 80, seed):
            if change.op == "create" and change.obj["kind"] == "Service":
                spec = change.obj["spec"]
                for a in spec.get("clusterIPs", []):
                    if a != "None":
                        assert seen_ips[a] == 0, a
                        seen_ips[a] += 1
                ports = [p["nodePort"] for p in spec.get("ports", []) if p.get("nodePort")]
                for n in set(ports) | ({spec["healthCheckNodePort"]}
                                       if spec.get("healthCheckNodePort") else set()):
                    assert seen_ports[n] == 0, n
                    seen_ports[n] += 1


def test_the_checker_finds_what_the_api_server_refuses() -> None:
    """check_objects is the offline half of validity: it must catch what it claims to."""
    c = G.generate(2)
    svc = next(s for s in c.services if s["spec"]["type"] == "NodePort")
    bad = json.loads(json.dumps(svc))
    bad["spec"]["clusterIP"] = bad["spec"]["clusterIPs"][0] = "10.97.0.5"  # outside the range
    bad["spec"]["ports"][0]["nodePort"] = 29999  # outside the node port range
    bad["metadata"]["name"] = "Bad_Name"
    other = json.loads(json.dumps(svc))
    other["metadata"]["name"] = "copy"
    other["spec"].pop("externalTrafficPolicy")
    found = V.check_objects(c.params, [c.node], [*c.services, bad, other], [], [])
    text = "\n".join(found)
    assert "outside 10.96.0.0/16" in text
    assert "nodePort 29999 outside the range" in text
    assert "not a DNS-1035 label" in text
    assert "used twice" in text  # the copy's clusterIP and nodePorts
    assert "externalTrafficPolicy set iff externally accessible" in text
    sl = json.loads(json.dumps(c.slices[0]))
    sl["endpoints"] = [{"addresses": ["127.0.0.1" if sl["addressType"] == "IPv4" else "::1"]}]
    assert any("is special" in p for p in V.check_objects(c.params, [], [], [], [sl]))


def test_leading_zeros_are_read_as_decimal() -> None:
    assert _leading_zeros("10.244.1.7") == "010.244.001.007"
    assert str(V._parse_sloppy("010.244.001.007")) == "10.244.1.7"
    assert V._parse_sloppy("256.1.1.1") is None
