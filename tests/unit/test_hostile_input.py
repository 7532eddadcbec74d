"""Hostile input (issue 9): Services, EndpointSlices and Nodes anyone can write, with missing and
wrongly typed fields, invalid and out-of-range addresses and ports, IPv4-mapped IPv6, duplicate
and conflicting endpoints, huge port lists, unicode names and annotation garbage. The desired
state code never raises; every problem it reports names the hostile object, never a valid one;
and the valid objects next to them are programmed exactly as without them.

The hostile objects live in namespace `evil` and use addresses and node ports the valid cluster
does not (10.200/16, fd00:200::/64, 203.0.113/24, 198.18.0/24, node ports 40000-50000), so any
change to a valid service's virtual servers would be a leak, not a legitimate conflict.
"""

from __future__ import annotations

from ipaddress import ip_network
from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from ipvsproxy.core.cluster import build_snapshot
from ipvsproxy.core.desired import Desired, compute_desired
from ipvsproxy.settings.config import Config
from tests.unit.kube_objects import CFG46, HOST, NODE, ep, node, port, service, slice_

GARBAGE = st.one_of(st.none(), st.booleans(), st.integers(-2**40, 2**40),
                    st.floats(allow_nan=True), st.text(max_size=12),
                    st.lists(st.integers(), max_size=3), st.dictionaries(st.text(max_size=4),
                                                                         st.integers(), max_size=2))


def maybe(valid: st.SearchStrategy[Any]) -> st.SearchStrategy[Any]:
    """Mostly a plausible value, sometimes garbage."""
    return st.one_of(valid, valid, valid, GARBAGE)


v4 = st.builds(lambda a, b: f"10.200.{a}.{b}", st.integers(0, 255), st.integers(0, 300))
v6 = st.builds(lambda a: f"fd00:200::{a:x}", st.integers(0, 0xFFFF))
mapped = st.builds(lambda a: f"::ffff:10.200.7.{a}", st.integers(0, 255))
ext = st.builds(lambda a: f"203.0.113.{a}", st.integers(0, 260))
lb = st.builds(lambda a: f"198.18.0.{a}", st.integers(0, 260))
ips = st.one_of(v4, v6, mapped, st.sampled_from(["None", "", "10.200.1", "1.2.3.4/24", "::"]))
names = st.one_of(st.from_regex(r"[a-z][a-z0-9-]{0,10}", fullmatch=True),
                  st.text(min_size=1, max_size=20))
port_dict = st.fixed_dictionaries({"port": maybe(st.integers(-5, 70000))}, optional={
    "name": maybe(names),
    "targetPort": maybe(st.one_of(st.integers(-5, 70000), names)),
    "protocol": maybe(st.sampled_from(["TCP", "UDP", "SCTP", "tcp", "ICMP"])),
    "nodePort": maybe(st.integers(40000, 50000)), "appProtocol": GARBAGE})
annotations = st.dictionaries(
    st.one_of(st.sampled_from(["ipvsproxy.io/scheduler", "ipvsproxy.io/scheduler-flags",
                               "ipvsproxy.io/weight"]), st.text(max_size=20)),
    st.one_of(st.sampled_from(["rr", "wrr", "sh", "mh", "lc", "bogus", "sh-fallback,sh-port",
                               "-1", "70000", "1e9"]), st.text(max_size=20)), max_size=4)


@st.composite
def hostile_service(draw: st.DrawFn) -> dict[str, Any]:
    cips = draw(st.lists(ips, max_size=3))
    spec = draw(st.fixed_dictionaries({
        "type": maybe(st.sampled_from(["ClusterIP", "NodePort", "LoadBalancer", "ExternalName",
                                       "Weird"])),
        "clusterIP": maybe(ips),
        # huge port lists now and then
        "ports": maybe(st.lists(port_dict, max_size=8) | st.lists(port_dict, min_size=100,
                                                                  max_size=300)),
    }, optional={
        "clusterIPs": maybe(st.just(cips)),
        "externalIPs": maybe(st.lists(st.one_of(ext, ips), max_size=4)),
        "sessionAffinity": maybe(st.sampled_from(["ClientIP", "None", "Sticky"])),
        "sessionAffinityConfig": maybe(st.fixed_dictionaries({"clientIP": maybe(
            st.fixed_dictionaries({"timeoutSeconds": maybe(st.integers(-5, 200000))}))})),
        "externalTrafficPolicy": maybe(st.sampled_from(["Local", "Cluster", "Cosmic"])),
        "internalTrafficPolicy": maybe(st.sampled_from(["Local", "Cluster", "x"])),
        "loadBalancerSourceRanges": maybe(st.lists(st.sampled_from(
            ["10.0.0.0/8", "300.0.0.0/8", "x", "fd00::/8", "1.2.3.4"]), max_size=3)),
        "healthCheckNodePort": maybe(st.integers(-1, 70000)),
        "ipFamilies": maybe(st.lists(st.sampled_from(["IPv4", "IPv6", "IPv7"]), max_size=2)),
    }))
    meta = draw(st.fixed_dictionaries({"namespace": st.just("evil"), "name": maybe(names)},
                                      optional={"annotations": maybe(annotations),
        "labels": maybe(st.dictionaries(st.text(max_size=8), st.text(max_size=8), max_size=2))}))
    obj: dict[str, Any] = {"kind": "Service", "metadata": meta, "spec": spec}
    if draw(st.booleans()):
        obj["status"] = {"loadBalancer": {"ingress": draw(maybe(st.lists(
            st.fixed_dictionaries({}, optional={"ip": maybe(st.one_of(lb, ips)),
                                                "ipMode": maybe(st.sampled_from(["VIP", "Proxy"])),
                                                "hostname": GARBAGE}), max_size=3)))}}
    return obj


@st.composite
def one_bad_field_service(draw: st.DrawFn) -> dict[str, Any]:
    """A plausible Service (and often programmed) with at most one field garbled."""
    i = draw(st.integers(0, 255))
    obj = service(f"ok-{i}", f"10.200.9.{i}", port(80, "http"),
                  port(draw(st.integers(1, 65535)), "b", draw(st.sampled_from(["TCP", "UDP"])),
                       node_port=draw(st.integers(40000, 50000))),
                  type_=draw(st.sampled_from(["ClusterIP", "NodePort", "LoadBalancer"])),
                  ns="evil", ingress=[f"198.18.0.{i}"], externalIPs=[f"203.0.113.{i}"])
    where = draw(st.sampled_from([None, "spec", "metadata", "ports"]))
    if where == "spec":
        obj["spec"][draw(st.sampled_from(sorted(obj["spec"])))] = draw(GARBAGE)
    elif where == "metadata":
        obj["metadata"][draw(st.sampled_from(["name", "annotations", "labels"]))] = draw(GARBAGE)
    elif where == "ports":
        obj["spec"]["ports"][draw(st.integers(0, 1))][draw(st.sampled_from(
            ["port", "name", "protocol", "nodePort"]))] = draw(GARBAGE)
    return obj


endpoint = st.fixed_dictionaries({
    "addresses": maybe(st.lists(st.one_of(v4, v6, mapped, st.just("10.244.1.5")), max_size=3)),
}, optional={
    "conditions": maybe(st.fixed_dictionaries({}, optional={
        k: maybe(st.booleans()) for k in ("ready", "serving", "terminating")})),
    "nodeName": maybe(st.sampled_from([NODE, "node-b", ""])),
    "hints": GARBAGE, "zone": GARBAGE})


@st.composite
def hostile_slice(draw: st.DrawFn) -> dict[str, Any]:
    return {"kind": "EndpointSlice",
            "addressType": draw(maybe(st.sampled_from(["IPv4", "IPv6", "FQDN"]))),
            "metadata": draw(st.fixed_dictionaries({
                "namespace": st.just("evil"), "name": maybe(names),
                "labels": maybe(st.fixed_dictionaries({
                    "kubernetes.io/service-name": maybe(names)}))},
                optional={"annotations": maybe(annotations)})),
            "ports": draw(maybe(st.lists(port_dict, max_size=4))),
            # duplicates and conflicts: the same endpoint listed again with other conditions
            "endpoints": draw(maybe(st.lists(endpoint, max_size=6).map(lambda e: e + e[:2])))}


@st.composite
def hostile_node(draw: st.DrawFn) -> dict[str, Any]:
    return {"kind": "Node",
            "metadata": draw(st.fixed_dictionaries({}, optional={
                "name": maybe(st.sampled_from(["node-b", "node-c"]) | names),
                "labels": GARBAGE})),
            "spec": draw(maybe(st.fixed_dictionaries({}, optional={
                "taints": GARBAGE, "podCIDRs": GARBAGE}))),
            "status": draw(maybe(st.fixed_dictionaries({}, optional={
                "addresses": maybe(st.lists(st.fixed_dictionaries({
                    "type": maybe(st.sampled_from(["InternalIP", "ExternalIP"])),
                    "address": maybe(ips)}), max_size=3))})))}


def valid_cluster() -> list[dict[str, Any]]:
    return [
        node(),
        service("web", "10.96.0.10", port(80, "http"), port(53, "dns", "UDP")),
        slice_("web", ep("10.244.1.5", NODE), ep("10.244.2.7", "node-b"),
               ports=[{"name": "http", "port": 8080, "protocol": "TCP"},
                      {"name": "dns", "port": 5353, "protocol": "UDP"}]),
        service("np", "10.96.0.11", port(80, "http", node_port=30080), type_="NodePort",
                externalIPs=["192.0.2.10"]),
        slice_("np", ep("10.244.1.6", NODE), port=8080, port_name="http"),
        service("lb", ["10.96.0.12", "fd00:96::12"], port(443, "https", node_port=30443),
                type_="LoadBalancer", ingress=["198.51.100.12"], externalTrafficPolicy="Local",
                ipFamilies=["IPv4", "IPv6"], sessionAffinity="ClientIP"),
        slice_("lb", ep("10.244.1.7", NODE), port=8443, port_name="https"),
        slice_("lb", ep("fd00:244::7", NODE), port=8443, port_name="https", family="IPv6"),
    ]


def desired(docs: list[dict[str, Any]], cfg: Config = CFG46) -> Desired:
    return compute_desired(build_snapshot(docs, NODE), HOST, cfg)


BASE = desired(valid_cluster())


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow,
                                                                   HealthCheck.data_too_large])
@given(st.lists(st.one_of(hostile_service(), one_bad_field_service(), hostile_slice(),
                          hostile_node()), max_size=8),
       st.randoms(use_true_random=False))
def test_hostile_objects_never_raise_and_never_touch_valid_ones(
        hostile: list[dict[str, Any]], rnd: Any) -> None:
    docs = valid_cluster() + hostile
    rnd.shuffle(docs)  # order must not matter to the valid objects either
    got = desired(docs)
    for key, vs in BASE.services.items():
        assert got.services.get(key) == vs, key
        assert got.dests.get(key) == BASE.dests[key], key
        assert got.owners.get(key) == BASE.owners[key], key
    for name, members in BASE.sets.items():
        assert members <= got.sets.get(name, frozenset()), name
    assert BASE.addresses <= got.addresses
    base_problems = {str(p) for p in BASE.problems}
    extra = [p for p in got.problems if str(p) not in base_problems]
    for p in extra:  # blame lands on the hostile object, named, with a reason
        assert p.namespace != "default", p
        assert str(p).strip() and p.reason, p
    # each problem once per object: a text repeats only for as many objects as share its name
    same_name: dict[tuple[str, str], int] = {}
    for o in hostile:
        name = o.get("metadata", {}).get("name")
        key = (o["kind"], name if isinstance(name, str) and name else "<unnamed>")
        same_name[key] = same_name.get(key, 0) + 1
    for text in {str(p) for p in extra}:
        p = next(q for q in extra if str(q) == text)
        n = sum(1 for q in extra if str(q) == text)
        assert n <= max(1, same_name.get((p.kind, p.name), 0)), f"{text!r} reported {n} times"


@settings(max_examples=150, deadline=None)
@given(hostile_node())
def test_a_hostile_own_node_never_raises(obj: dict[str, Any]) -> None:
    obj.setdefault("metadata", {})["name"] = NODE  # the proxy's own Node, garbled
    desired([o for o in valid_cluster() if o["kind"] != "Node"] + [obj])


# --------------------------------------------------------------------- cross-tenant (issue 23)

ns_names = st.from_regex(r"[a-z][a-z0-9]{0,5}", fullmatch=True)
stamps = st.one_of(st.none(), st.sampled_from(
    ["2020-01-01T00:00:00Z", "2024-05-01T12:00:00Z", "2026-11-25T00:00:00Z"]))


@settings(max_examples=200, deadline=None)
@given(st.lists(ns_names, min_size=2, max_size=4, unique=True), st.data(),
       st.randoms(use_true_random=False))
def test_no_tenant_takes_another_tenants_cluster_ip(namespaces: list[str], data: st.DataObject,
                                                     rnd: Any) -> None:
    """Victims in some namespaces, attackers in others claiming what the victims hold: a
    victim's ClusterIP:port (as externalIP, or LoadBalancer ingress IP, ipMode VIP or not), a
    victim LoadBalancer's status IP:port (as externalIP: status outranks spec, issue 32), and
    the victims' pod IPs (inside the pod network, never claimable); any protocol and port, any
    names, any creation times, in any order. Every victim keeps its ClusterIP and LoadBalancer
    IP and its endpoints, no pod IP becomes a virtual server, and every refused claim is
    reported on the attacker."""
    victims: list[tuple[str, str, int, str]] = []  # (ns, ip, port, proto): what a victim holds
    docs: list[dict[str, Any]] = [node()]
    for i, ns in enumerate(namespaces[: len(namespaces) // 2 or 1]):
        ip, p, proto = f"10.96.7.{i + 1}", data.draw(st.integers(1, 65535)), \
            data.draw(st.sampled_from(["TCP", "UDP", "SCTP"]))
        lb = data.draw(st.booleans())
        svc = service("victim", ip, port(p, "v", proto), ns=ns,
                      type_="LoadBalancer" if lb else "ClusterIP",
                      ingress=[f"198.51.100.{i + 1}"] if lb else None)
        if (t := data.draw(stamps)) is not None:
            svc["metadata"]["creationTimestamp"] = t
        docs += [svc, slice_("victim", ep(f"10.244.7.{i + 1}", NODE), port=p, port_name="v",
                             proto=proto, ns=ns)]
        victims.append((ns, ip, p, proto))
        if lb:
            victims.append((ns, f"198.51.100.{i + 1}", p, proto))
    attackers = namespaces[len(namespaces) // 2 or 1:] or ["zz"]
    pods = [f"10.244.7.{i + 1}" for i in range(len(namespaces))]
    for j, ns in enumerate(attackers):
        targets = data.draw(st.lists(st.sampled_from(victims), min_size=1, max_size=3))
        ports = [port(p, f"a{k}", proto) for k, (_, _, p, proto) in enumerate(targets)]
        ports = list({(q["port"], q["protocol"]): q for q in ports}.values())
        how = data.draw(st.sampled_from(["externalIPs", "ingress", "both"]))
        ips = [t[1] for t in targets]
        # a LoadBalancer IP is another controller's to give: an attacker can only write it
        # into spec.externalIPs, and ClusterIPs into either
        ingress = [ip for ip in ips if ip.startswith("10.96.")]
        grab = data.draw(st.lists(st.sampled_from(pods), max_size=2))
        svc = service(data.draw(st.sampled_from(["a", "victim", "aaa"])), f"10.96.8.{j + 1}",
                      *ports, ns=ns, type_="LoadBalancer",
                      externalIPs=ips + grab if how != "ingress" else grab,
                      ingress=[{"ip": ip, "ipMode": data.draw(st.sampled_from(["VIP", None]))}
                               for ip in ingress + grab] if how != "externalIPs" else None)
        if (t := data.draw(stamps)) is not None:
            svc["metadata"]["creationTimestamp"] = t
        docs += [svc, slice_(svc["metadata"]["name"], ep(f"10.244.8.{j + 1}", NODE),
                             ports=[{"name": q["name"], "port": q["port"],
                                     "protocol": q["protocol"]} for q in ports], ns=ns)]
    rnd.shuffle(docs)
    d = desired(docs, cfg=Config(hostname=NODE, families=(4, 6),
                                 cluster_cidrs=(ip_network("10.244.0.0/16"),)))
    for ns, ip, p, proto in victims:
        key = next(k for k in d.services if str(k) == f"{proto} {ip}:{p}")
        assert d.owners[key] == f"{ns}/victim:v"
        i = int(ip.rsplit(".", 1)[1]) - 1
        assert [str(rs.key) for rs in d.dests[key]] == [f"10.244.7.{i + 1}:{p}"]
    assert not [k for k in d.services if str(k.addr).startswith("10.244.")]
    for prob in d.problems:
        assert prob.namespace in attackers, prob
