"""The watch fast path for EndpointSlice updates (issue 8: >= 20,000 events/s into the store).

`parse_endpoint_slice(obj, prev)` takes the value the store holds for the slice and shares its
unchanged parts; a version that changes nothing the proxy reads parses to `prev` itself, and the
store drops it without marking anything. These tests hold that to its promise: for every field
the parse reads a change is seen (dirty service, new value equal to a parse from scratch), for
the fields it does not read it is not; invalid objects, deletions and the trigger-time annotation
behave as without the fast path; and the value never depends on `prev`.
"""

from __future__ import annotations

import copy
from collections.abc import Callable, Iterator
from ipaddress import ip_address
from typing import Any

import pytest
import structlog
from hypothesis import given, settings
from hypothesis import strategies as st
from kubernetes.watch.watch import iter_resp_lines

from ipvsproxy.core.model import _parse_ip
from ipvsproxy.core.slices import parse_endpoint_slice
from ipvsproxy.daemon.store import Store
from ipvsproxy.kube.reflector import _lines
from tests.unit.kube_objects import NODE, ep

TRIGGER = "endpoints.kubernetes.io/last-change-trigger-time"
client_lines: Callable[[Any], Iterator[str]] = iter_resp_lines  # typed
SID = ("default", "web")


def base() -> dict[str, Any]:
    """A slice with everything the parse reads set, and some of what it does not read."""
    return {
        "kind": "EndpointSlice", "apiVersion": "discovery.k8s.io/v1", "addressType": "IPv4",
        "metadata": {"namespace": "default", "name": "web-abcde", "resourceVersion": "10",
                     "generation": 3, "managedFields": [{"manager": "kcm"}],
                     "labels": {"kubernetes.io/service-name": "web",
                                "endpointslice.kubernetes.io/managed-by": "kcm"},
                     "annotations": {TRIGGER: "2026-11-23T10:00:00Z",
                                     "ipvsproxy.io/weight": "3", "other": "x"}},
        "ports": [{"name": "http", "port": 8080, "protocol": "TCP"},
                  {"name": "dns", "port": 53, "protocol": "UDP"}],
        "endpoints": [
            {"addresses": ["10.244.1.1"], "nodeName": NODE, "zone": "z1", "hostname": "a",
             "targetRef": {"kind": "Pod", "name": "web-1"},
             "conditions": {"ready": True, "serving": True, "terminating": False},
             "hints": {"forZones": [{"name": "z1"}]}},
            {"addresses": ["10.244.1.2"], "nodeName": "node-b",
             "conditions": {"ready": False, "serving": True, "terminating": True}},
            ep("10.244.1.3", "node-c"),
        ]}


def listed(obj: dict[str, Any]) -> Store:
    s = Store(NODE, clock=lambda: 1000.0)
    s.replace("Service", [])
    s.replace("EndpointSlice", [obj])
    s.replace("Node", [])
    s.take()
    return s


DELETE = object()


def edit(*path: str | int, to: Any) -> Callable[[dict[str, Any]], None]:
    """Set the field at `path` (keys and list indexes) to `to`, or remove it (to=DELETE)."""
    def apply(obj: dict[str, Any]) -> None:
        at: Any = obj
        for p in path[:-1]:
            at = at[p]
        if to is DELETE:
            del at[path[-1]]
        else:
            at[path[-1]] = to
    return apply


WEIGHT = "ipvsproxy.io/weight"
MANAGED_BY = "endpointslice.kubernetes.io/managed-by"

# Fields the parse does not read: the same value comes back, nothing is marked.
IRRELEVANT = {
    "resourceVersion": edit("metadata", "resourceVersion", to="11"),
    "generation": edit("metadata", "generation", to=4),
    "managedFields": edit("metadata", "managedFields", to=[]),
    "another label": edit("metadata", "labels", MANAGED_BY, to="x"),
    "another annotation": edit("metadata", "annotations", "other", to="y"),
    "targetRef": edit("endpoints", 0, "targetRef", to={"kind": "Pod", "name": "web-9"}),
    "zone": edit("endpoints", 0, "zone", to="z2"),
    "hostname": edit("endpoints", 0, "hostname", to="b"),
    "a second address": edit("endpoints", 0, "addresses", to=["10.244.1.1", "10.244.9.9"]),
    "a port's appProtocol": edit("ports", 0, "appProtocol", to="http"),
    "conditions spelt out as their defaults": edit("endpoints", 2, "conditions",
                                                   to={"ready": True, "serving": True}),
}

# Every field the parse reads: the change is seen.
RELEVANT = {
    "addresses[0]": edit("endpoints", 1, "addresses", to=["10.244.1.9"]),
    "addresses[0], a text seen elsewhere": edit("endpoints", 1, "addresses",
                                                to=["10.244.1.3"]),
    "ready": edit("endpoints", 0, "conditions", "ready", to=False),
    "serving": edit("endpoints", 1, "conditions", "serving", to=False),
    "terminating": edit("endpoints", 0, "conditions", "terminating", to=True),
    "conditions removed": edit("endpoints", 1, "conditions", to=DELETE),
    "nodeName": edit("endpoints", 2, "nodeName", to="node-z"),
    "nodeName removed": edit("endpoints", 0, "nodeName", to=DELETE),
    "hints": edit("endpoints", 0, "hints", to={"forZones": [{"name": "z2"}]}),
    "hints removed": edit("endpoints", 0, "hints", to=DELETE),
    "hints empty": edit("endpoints", 0, "hints", "forZones", to=[]),
    "endpoint added": lambda o: o["endpoints"].append(ep("10.244.1.4")),
    "endpoint removed": lambda o: o["endpoints"].pop(1),
    "first endpoint removed": lambda o: o["endpoints"].pop(0),
    "endpoints reordered": lambda o: o["endpoints"].reverse(),
    "endpoint now invalid": edit("endpoints", 1, "addresses", to=["10.244.1.300"]),
    # refused but counted (EndpointSlice.refused): the usable endpoints stay as they were
    "a multicast endpoint added": lambda o: o["endpoints"].append(ep("233.252.1.1")),
    "a leading-zero endpoint added": lambda o: o["endpoints"].append(ep("010.244.1.9")),
    "port number": edit("ports", 0, "port", to=8081),
    "port name": edit("ports", 1, "name", to="dns2"),
    "port protocol": edit("ports", 1, "protocol", to="TCP"),
    "port added": lambda o: o["ports"].append({"name": "x", "port": 9, "protocol": "SCTP"}),
    "port removed": lambda o: o["ports"].pop(0),
    "weight": edit("metadata", "annotations", WEIGHT, to="4"),
    "weight removed": edit("metadata", "annotations", WEIGHT, to=DELETE),
    "trigger time": edit("metadata", "annotations", TRIGGER, to="2026-11-23T10:00:05Z"),
    "addressType": lambda o: (o.update(addressType="IPv6"), [
        e.update(addresses=[f"fd00::{i}"]) for i, e in enumerate(o["endpoints"])]),
}


def changed(fn: Callable[[dict[str, Any]], Any]) -> dict[str, Any]:
    obj = base()
    fn(obj)
    return obj


@pytest.mark.parametrize("name", sorted(IRRELEVANT))
def test_a_change_to_a_field_the_proxy_does_not_read_is_skipped(name: str) -> None:
    s = listed(base())
    held = s.slices[("default", "web-abcde")]
    total = s.endpoint_changes_total
    s.event("EndpointSlice", "MODIFIED", changed(IRRELEVANT[name]))
    assert s.slices[("default", "web-abcde")] is held
    assert not s.take() and s.endpoint_changes_total == total


@pytest.mark.parametrize("name", sorted(RELEVANT))
def test_a_change_to_a_field_the_proxy_reads_is_seen(name: str) -> None:
    s = listed(base())
    held = s.slices[("default", "web-abcde")]
    new = changed(RELEVANT[name])
    s.event("EndpointSlice", "MODIFIED", new)
    ch = s.take()
    assert ch.dirty == {SID}
    got = s.slices[("default", "web-abcde")]
    assert got is not held and got == parse_endpoint_slice(copy.deepcopy(new))[0]
    # and the same version again is no change
    s.event("EndpointSlice", "MODIFIED", copy.deepcopy(new))
    assert not s.take() and s.slices[("default", "web-abcde")] is got


def test_one_changed_endpoint_shares_the_others() -> None:
    old, _ = parse_endpoint_slice(base())
    assert old is not None
    new, _ = parse_endpoint_slice(changed(RELEVANT["ready"]), old)
    assert new is not None and new != old
    shared = [a is b for a, b in zip(new.endpoints, old.endpoints, strict=True)]
    assert shared == [False, True, True]
    assert new.ports is old.ports
    # the changed endpoint's address is still prev's object: its text named the same address
    assert new.endpoints[0].addr is old.endpoints[0].addr


def test_the_service_label_moves_the_slice() -> None:
    s = listed(base())
    obj = base()
    obj["metadata"]["labels"]["kubernetes.io/service-name"] = "api"
    s.event("EndpointSlice", "MODIFIED", obj)
    assert s.take().dirty == {SID, ("default", "api")}
    assert [x.service for x in s.snapshot({("default", "api")}).slices] == ["api"]
    assert not s.snapshot({SID}).slices


@pytest.mark.parametrize("label", ["service.kubernetes.io/headless",
                                   "service.kubernetes.io/service-proxy-name"])
def test_a_label_that_drops_the_slice_is_seen(label: str) -> None:
    s = listed(base())
    obj = base()
    obj["metadata"]["labels"][label] = ""
    s.event("EndpointSlice", "MODIFIED", obj)
    assert s.take().dirty == {SID} and not s.slices


def test_trigger_time_is_recorded_for_changes_only() -> None:
    s = listed(base())
    again = base()
    again["metadata"]["resourceVersion"] = "11"
    s.event("EndpointSlice", "MODIFIED", again)  # nothing the proxy reads changed
    assert s.take().trigger_times == ()
    later = base()
    later["metadata"]["annotations"][TRIGGER] = "2026-11-23T10:00:05Z"
    s.event("EndpointSlice", "MODIFIED", later)  # only the trigger time: a change, as before
    ch = s.take()
    assert ch.dirty == {SID} and ch.trigger_times == (1795428005.0,)
    moved = base()
    moved["metadata"]["annotations"][TRIGGER] = "2026-11-23T10:00:09Z"
    moved["endpoints"].pop()
    s.event("EndpointSlice", "MODIFIED", moved)
    assert s.take().trigger_times == (1795428009.0,)


def test_invalid_to_valid_and_back() -> None:
    bad = base()
    bad["addressType"] = "IPv7"
    s = listed(base())
    with structlog.testing.capture_logs() as logs:
        s.event("EndpointSlice", "MODIFIED", bad)  # valid -> invalid: gone, reported
        s.event("EndpointSlice", "MODIFIED", copy.deepcopy(bad))  # reported once only
    assert [e["reason"] for e in logs if e["event"] == "invalid object"] == [
        "addressType 'IPv7' is not IPv4, IPv6 or FQDN; ignored"]
    assert s.take().dirty == {SID} and not s.slices
    s.event("EndpointSlice", "MODIFIED", base())  # invalid -> valid: back, no problem left
    assert s.take().dirty == {SID} and s.invalid_counts()["EndpointSlice"] == 0
    assert s.slices[("default", "web-abcde")] == parse_endpoint_slice(base())[0]


def test_an_invalid_endpoint_fixed_is_seen_and_its_problem_cleared() -> None:
    bad = base()
    bad["endpoints"][1]["addresses"] = ["10.244.1.300"]
    s = listed(bad)
    assert s.invalid_counts()["EndpointSlice"] == 1
    assert len(s.slices[("default", "web-abcde")].endpoints) == 2
    with structlog.testing.capture_logs() as logs:
        s.event("EndpointSlice", "MODIFIED", copy.deepcopy(bad))
    assert not logs and not s.take()  # the same invalid part: not reported again, no change
    s.event("EndpointSlice", "MODIFIED", base())
    assert s.take().dirty == {SID} and s.invalid_counts()["EndpointSlice"] == 0
    assert len(s.slices[("default", "web-abcde")].endpoints) == 3


def test_deleted_then_added_again_is_two_changes() -> None:
    s = listed(base())
    s.event("EndpointSlice", "DELETED", base())
    assert s.take().dirty == {SID} and not s.slices
    s.event("EndpointSlice", "ADDED", base())
    assert s.take().dirty == {SID}
    assert s.slices[("default", "web-abcde")] == parse_endpoint_slice(base())[0]


# ------------------------------------------------------------- the value never depends on prev

addr = st.one_of(st.sampled_from(["10.244.0.1", "10.244.0.2", "fd00::1", "fd00::2",
                                  "010.244.0.1", "10.244.0.300", "::ffff:10.0.0.1", "FD00::1"]),
                 st.none(), st.integers())
endpoint = st.fixed_dictionaries({"addresses": st.lists(addr, max_size=2)}, optional={
    "conditions": st.fixed_dictionaries({}, optional={
        k: st.one_of(st.booleans(), st.none()) for k in ("ready", "serving", "terminating")}),
    "nodeName": st.sampled_from(["n1", "n2", "", 5]),
    "hints": st.one_of(st.none(), st.fixed_dictionaries({"forZones": st.lists(
        st.fixed_dictionaries({"name": st.sampled_from(["z1", "z2"])}), max_size=2)}))})
slices = st.fixed_dictionaries({
    "addressType": st.sampled_from(["IPv4", "IPv4", "IPv6", "FQDN"]),
    "metadata": st.fixed_dictionaries({
        "namespace": st.just("ns"), "name": st.just("s"),
        "labels": st.fixed_dictionaries({"kubernetes.io/service-name": st.sampled_from(
            ["a", "b"])}, optional={"service.kubernetes.io/headless": st.just("")}),
        "annotations": st.fixed_dictionaries({}, optional={
            TRIGGER: st.sampled_from(["t1", "t2"]),
            "ipvsproxy.io/weight": st.sampled_from(["2", "x"])})}),
    "ports": st.lists(st.fixed_dictionaries({"port": st.sampled_from([80, 81, 0])}, optional={
        "name": st.sampled_from(["", "p"]), "protocol": st.sampled_from(["TCP", "UDP", "x"])}),
        max_size=2),
    "endpoints": st.lists(endpoint, max_size=5)})


@settings(max_examples=500, deadline=None)
@given(slices, slices, st.data())
def test_the_value_never_depends_on_prev(a: dict[str, Any], b: dict[str, Any],
                                         data: st.DataObject) -> None:
    if data.draw(st.booleans()):  # often a near copy of a: the sharing paths
        b = copy.deepcopy(a)
        if b["endpoints"]:
            b["endpoints"][data.draw(st.integers(0, len(b["endpoints"]) - 1))] = data.draw(
                endpoint)
    prev, _ = parse_endpoint_slice(a)
    want, want_problems = parse_endpoint_slice(b)
    got, problems = parse_endpoint_slice(b, prev)
    assert got == want and problems == want_problems
    if got is not None:
        assert (got is prev) == (got == prev)


# -------------------------------------------------------------------- addresses, watch lines

address_texts = st.one_of(
    st.ip_addresses().flatmap(lambda a: st.sampled_from([
        str(a), str(a).upper(), getattr(a, "exploded", str(a)), f"{a}%eth0", f" {a}"])),
    st.sampled_from(["010.1.2.3", "1.2.3", "1.2.3.4.5", "256.1.1.1", "::ffff:1.2.3.4",
                     "1.2.3.4\x00", "\u0661.2.3.4", "::1.2.3.4", ""]),
    st.text(max_size=12))


@settings(max_examples=1000)
@given(address_texts)
def test_the_fast_address_parser_agrees_with_ipaddress(text: str) -> None:
    try:
        want: Any = ip_address(text)
    except ValueError:
        want = ValueError
    try:
        got: Any = _parse_ip(text)
    except ValueError:
        got = ValueError
    assert got == want and type(got) is type(want)


class Resp:
    def __init__(self, chunks: list[bytes]) -> None:
        self.chunks = chunks

    def stream(self, amt: int | None = None, decode_content: bool = False) -> Iterator[bytes]:
        yield from self.chunks


@settings(max_examples=300)
@given(st.lists(st.sampled_from([b'{"a": 1}', b"", b"\xff\xfe", "é".encode(), b"x" * 70]),
                max_size=6), st.data())
def test_watch_lines_are_the_clients_however_the_stream_is_cut(
        lines: list[bytes], data: st.DataObject) -> None:
    raw = b"".join(line + b"\n" for line in lines) + data.draw(st.sampled_from([b"", b"tail"]))
    cuts = sorted(data.draw(st.sets(st.integers(0, len(raw)), max_size=6)))
    chunks = [raw[i:j] for i, j in zip([0, *cuts], [*cuts, len(raw)], strict=True)]
    assert list(_lines(Resp(chunks))) == list(client_lines(Resp(chunks)))
