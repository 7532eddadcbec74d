"""The fast reader for kubectl's YAML (issue 22): whatever it accepts it reads exactly as
KubectlLoader does (libyaml's loader, `yaml.CSafeLoader`, with kubectl's reading of a few plain
scalars: ipvsproxy/inputs/kubectl_yaml.py, issue 35), same types and same strings, and whatever it
does not fully recognise it hands back (None), including every text the loader rejects.

Texts come from PyYAML's dumper in kubectl's layout (`default_flow_style=False`), from an
emulation of go-yaml v2 (what sigs.k8s.io/yaml, so kubectl, writes: keys sorted, a sequence at
its key's column, `"..."` for strings that would read as something else, `|` blocks for
multi-line strings), with nasty strings everywhere, and from random edits of such texts.
"""

from __future__ import annotations

import datetime
import io
import math
import re
from typing import Any

import pytest
import yaml
from hypothesis import HealthCheck, event, example, given, settings
from hypothesis import strategies as st
from hypothesis.control import currently_in_test_context
from yaml.emitter import Emitter
from yaml.nodes import ScalarNode
from yaml.resolver import Resolver

from ipvsproxy.inputs import kubeyaml
from ipvsproxy.inputs.kubectl_yaml import KubectlLoader, KubectlPyLoader
from ipvsproxy.inputs.kubeyaml import load_all

# --- comparing -----------------------------------------------------------------------------


def same(a: Any, b: Any) -> bool:
    """Equal, of the same types all the way down, mappings in the same order; nan is nan."""
    if type(a) is not type(b):
        return False
    if isinstance(a, dict):
        return (list(a) == list(b) and all(same(k, j) for k, j in zip(a, b, strict=True))
                and all(same(a[k], b[k]) for k in a))
    if isinstance(a, list):
        return len(a) == len(b) and all(same(x, y) for x, y in zip(a, b, strict=True))
    if isinstance(a, float) and math.isnan(a):
        return math.isnan(b)
    return bool(a == b)


def reference(text: str, loader: Any = KubectlLoader) -> list[Any] | Exception:
    try:
        return list(yaml.load_all(text, Loader=loader))
    except yaml.YAMLError as exc:
        return exc


def check(text: str) -> list[Any] | None:
    """The fast reader's documents, asserted equal to KubectlLoader's (and to its pure-Python
    twin's, which manifests uses when libyaml is missing) when it gives any."""
    fast = load_all(text)
    if currently_in_test_context():  # how often each way: --hypothesis-show-statistics
        event("read" if fast is not None else "handed back")
    if fast is not None:
        for loader in (KubectlLoader, KubectlPyLoader):
            ref = reference(text, loader)
            assert not isinstance(ref, Exception), (text, fast, ref)
            assert same(fast, ref), (text, fast, ref)
    return fast


# --- objects -------------------------------------------------------------------------------

NASTY = ["", " ", "  a", "a ", "a  b", "'", "''", '"', '""', "'a'", '"a"', "a'b", 'a"b', ":",
         "a:", ":a", "a:b", "a: b", "a :b", "#", "a#b", "a #b", "# a", "-", "- a", "-a", "--",
         "---", "...", "--- a", "?", "? a", "?a", "|", "|-", ">", "> a", "{}", "[]", "{", "}",
         "[a]", "{a: 1}", "a,b", ",", "&a", "*a", "!a", "!!str", "%a", "@a", "`a", "<<", "=",
         "~", "null", "Null", "NULL", "true", "True", "FALSE", "yes", "No", "on", "OFF", "y",
         "n", "0", "-0", "+1", "007", "0755", "0o17", "0x1F", "0b101", "1_000", "1,000", "1e5",
         "1E+5", "1.5", "1.", ".5", "-.5", "1.0e+5", ".inf", "-.Inf", ".nan", "190:20:30",
         "1:20", "2026-01-01", "2026-1-1", "2026-01-01T10:00:00Z", "2026-01-01 10:00:00 +2",
         "10.96.0.1", "fd00::1", "::", "a\nb", "a\n", "\n", "\na", "a\n\n", "a\n\nb\n", " a\nb",
         "a \nb", "a\n b", "a\tb", "\t", "a\rb", "\x00", "\x07", "\x1b", "\x7f", "\x85", "\xa0",
         "\u2028", "\u2029", "\ufeff", "é", "日本", "\U0001f600", "a\\b", "\\", "\\n", "a/b",
         "kubernetes.io/service-name", "app.kubernetes.io/name", "x" * 90, "a " * 50,
         "{\"apiVersion\":\"v1\",\"kind\":\"Service\"}\n"]
KEYS = ["apiVersion", "kind", "metadata", "name", "namespace", "labels", "annotations", "spec",
        "ports", "port", "items", "status", "kubernetes.io/service-name", "a.b/c-d_e",
        "kubectl.kubernetes.io/last-applied-configuration", "x" * 200]

nasty_text = st.text(st.sampled_from("ab :#'\"-?|>{}[],&*!%@`\\/.0159eExX_+~\n\t éü日\U0001f600"
                                     "\x00\x07\x85\xa0\u2028\ufeff"), max_size=12)
strings = STRINGS = st.one_of(
    st.sampled_from(NASTY), nasty_text, st.text(max_size=8),
    st.from_regex(r"[a-z0-9]([-a-z0-9.]{0,15}[a-z0-9])?", fullmatch=True))
keys = st.one_of(st.sampled_from(KEYS), strings.filter(bool), strings)
# what most of a real dump holds: names, addresses, numbers as strings, words
mild = st.one_of(st.from_regex(r"[a-z0-9]([-a-z0-9./]{0,20}[a-z0-9])?", fullmatch=True),
                 st.from_regex(r"[A-Za-z][a-z]{0,8}( [a-z]{1,8}){0,12}", fullmatch=True),
                 st.sampled_from(NASTY))
scalars = st.one_of(
    strings, strings, st.none(), st.booleans(), st.integers(-2**70, 2**70),
    st.floats(allow_nan=True), st.dates(), st.datetimes(timezones=st.just(datetime.UTC)),
    st.datetimes())
objects = st.recursive(scalars, lambda inner: st.one_of(
    st.lists(inner, max_size=4), st.dictionaries(keys, inner, max_size=5)), max_leaves=25)
documents = st.dictionaries(keys, objects, min_size=1, max_size=6)


@st.composite
def kubernetes_objects(draw: st.DrawFn, strings: st.SearchStrategy[str] = STRINGS
                       ) -> dict[str, Any]:
    """A Service-like object with nasty strings in its labels, annotations and fields."""
    meta = {"name": draw(strings), "namespace": draw(strings),
            "labels": draw(st.dictionaries(keys, strings, max_size=3)),
            "annotations": draw(st.dictionaries(keys, strings, max_size=3)),
            "resourceVersion": str(draw(st.integers(0, 10**9)))}
    ports = draw(st.lists(st.fixed_dictionaries(
        {"port": st.integers(0, 70000), "name": strings, "protocol": st.sampled_from(["TCP",
                                                                                     "UDP"])},
        optional={"targetPort": st.one_of(st.integers(0, 70000), strings)}), max_size=3))
    return {"apiVersion": "v1", "kind": "Service", "metadata": meta,
            "spec": {"clusterIP": draw(strings), "ports": ports,
                     "selector": draw(st.dictionaries(keys, strings, max_size=2))},
            "status": {"loadBalancer": draw(st.sampled_from([{}, {"ingress": []}]))},
            "extra": draw(objects if strings is STRINGS else st.recursive(
                st.one_of(strings, st.integers(), st.booleans(), st.none()),
                lambda inner: st.one_of(st.lists(inner, max_size=3),
                                        st.dictionaries(strings, inner, max_size=3)),
                max_leaves=8))}


# --- go-yaml v2, as kubectl writes ---------------------------------------------------------

_ANALYSER = Emitter(io.StringIO(), allow_unicode=True)
_RESOLVER = Resolver()


def _printable(ch: str) -> bool:
    o = ord(ch)
    return (0x20 <= o <= 0x7E or 0xA0 <= o <= 0xD7FF or (0xE000 <= o <= 0xFFFD and o != 0xFEFF)
            or o >= 0x10000)


def _double(s: str) -> str:
    out = []
    named = {"\0": "0", "\a": "a", "\b": "b", "\t": "t", "\n": "n", "\v": "v", "\f": "f",
             "\r": "r", "\x1b": "e", '"': '"', "\\": "\\", "\x85": "N", "\xa0": "_",
             "\u2028": "L", "\u2029": "P"}
    for ch in s:
        if ch in named:
            out.append("\\" + named[ch])
        elif _printable(ch):
            out.append(ch)
        elif ord(ch) <= 0xFF:
            out.append(f"\\x{ord(ch):02X}")
        elif ord(ch) <= 0xFFFF:
            out.append(f"\\u{ord(ch):04X}")
        else:
            out.append(f"\\U{ord(ch):08X}")
    return '"' + "".join(out) + '"'


class Plain(str):
    """A string go-yaml would write plain though PyYAML reads it as another type (go-yaml v2's
    resolver is not PyYAML's): written as it is."""


def _go_scalar(v: Any, key: bool = False) -> str | tuple[str, list[str]]:
    """A scalar as go-yaml v2 writes it: text, or (header, lines) for a literal block."""
    if v is None:
        return "null"
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, int):
        return str(v)
    if isinstance(v, float):
        return ".nan" if math.isnan(v) else ".inf" if v == math.inf else (
            "-.inf" if v == -math.inf else repr(v))
    if isinstance(v, datetime.datetime | datetime.date):
        return v.isoformat()
    if isinstance(v, Plain):
        return str(v)
    analysis = _ANALYSER.analyze_scalar(v)
    if "\n" in v and not key and analysis.allow_block:
        hint = "2" if v[0] in " \n" else ""
        chomp = "-" if not v.endswith("\n") else "+" if v == "\n" or v.endswith("\n\n") else ""
        body = v[:-1] if v.endswith("\n") else v
        return "|" + hint + chomp, body.split("\n")
    plain = (v != "" and _RESOLVER.resolve(ScalarNode, v, (True, False)) == "tag:yaml.org,2002:str")
    if plain and analysis.allow_block_plain and not analysis.multiline:
        return v
    if plain and analysis.allow_single_quoted and not analysis.multiline:
        return "'" + v.replace("'", "''") + "'"
    return _double(v)


def _go_value(v: Any, col: int, head: str, out: list[str]) -> None:
    """`head` (`key:` or `-`) and the value after it, its lines at column `col` and below."""
    if isinstance(v, dict) and v:
        out.append(head)
        _go_mapping(v, col + 2, out)
    elif isinstance(v, list) and v:
        if head.endswith("-"):  # go-yaml: `- - a`, the inner sequence two columns in
            _go_sequence(v, col + 2, out, first=head + " ")
        else:
            out.append(head)
            _go_sequence(v, col, out)  # at the key's own column
    elif isinstance(v, dict | list):
        out.append(head + (" {}" if isinstance(v, dict) else " []"))
    else:
        s = _go_scalar(v)
        if isinstance(s, tuple):
            out.append(f"{head} {s[0]}")
            out.extend(" " * (col + 2) + line if line else "" for line in s[1])
        else:
            out.append(f"{head} {s}")


def _go_mapping(m: dict[Any, Any], col: int, out: list[str], first: str | None = None) -> None:
    for n, k in enumerate(sorted(m, key=str)):
        key = _go_scalar(k, key=True)
        assert isinstance(key, str)
        prefix = first if n == 0 and first is not None else " " * col
        _go_value(m[k], col, prefix + key + ":", out)


def _go_sequence(seq: list[Any], col: int, out: list[str], first: str | None = None) -> None:
    for n, item in enumerate(seq):
        prefix = first if n == 0 and first is not None else " " * col
        if isinstance(item, dict) and item:
            _go_mapping(item, col + 2, out, first=prefix + "- ")
        else:
            _go_value(item, col, prefix + "-", out)


def go_yaml(*docs: Any) -> str:
    out: list[str] = []
    for n, doc in enumerate(docs):
        if n:
            out.append("---")
        if isinstance(doc, dict) and doc:
            _go_mapping(doc, 0, out)
        elif isinstance(doc, list) and doc:
            _go_sequence(doc, 0, out)
        elif isinstance(doc, dict | list):
            out.append("{}" if isinstance(doc, dict) else "[]")
        else:
            s = _go_scalar(doc)
            out.append(s if isinstance(s, str) else s[0] + "\n" + "\n".join(s[1]))
    return "\n".join(out) + "\n"


class _Styled(yaml.SafeDumper):
    """PyYAML's dumper, writing the strings marked Literal or Folded in that block style when
    PyYAML can."""


class Literal(str):
    pass


class Folded(str):
    pass


_Styled.add_representer(Literal, lambda d, s: d.represent_scalar(
    "tag:yaml.org,2002:str", str(s), style="|"))
_Styled.add_representer(Folded, lambda d, s: d.represent_scalar(
    "tag:yaml.org,2002:str", str(s), style=">"))


class _Kubectl(yaml.SafeDumper):
    """PyYAML's dumper, writing Plain strings plain (tagged as what they read as)."""


for _dumper in (_Styled, _Kubectl):
    _dumper.add_representer(Plain, lambda d, s: d.represent_scalar(
        _RESOLVER.resolve(ScalarNode, str(s), (True, False)), str(s)))


def _styled(o: Any, n: int = 0) -> Any:
    """Multi-line strings, and every third one, marked for a block style."""
    if isinstance(o, dict):
        return {k: _styled(v, n + 1) for k, v in o.items()}
    if isinstance(o, list):
        return [_styled(v, n + 1) for v in o]
    if isinstance(o, str) and not isinstance(o, Plain) and ("\n" in o or n % 3 == 0):
        return (Literal if n % 2 else Folded)(o)
    return o


def text(docs: list[Any], which: int) -> str:
    """The documents as PyYAML writes them in kubectl's layout (0: as it is, 1: wide, with no
    folding of long strings, and unicode as it is, 2: with block scalars) or (3) go-yaml."""
    if which == 0:
        return yaml.dump_all(docs, Dumper=_Kubectl, default_flow_style=False)
    if which == 1:
        return yaml.dump_all(docs, Dumper=_Kubectl, default_flow_style=False, width=10**9,
                             allow_unicode=True, sort_keys=False)
    if which == 2:
        return yaml.dump_all([_styled(d) for d in docs], Dumper=_Styled,
                             default_flow_style=False, width=10**9, allow_unicode=True)
    return go_yaml(*docs)


def pyyaml_texts(docs: list[Any]) -> list[str]:
    return [text(docs, which) for which in range(3)]


# --- properties ----------------------------------------------------------------------------

PROPERTY = settings(max_examples=400, deadline=None,
                    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])


@PROPERTY
@given(st.lists(st.one_of(documents, kubernetes_objects()), min_size=1, max_size=3))
def test_pyyaml_dumps_read_as_csafeloader_does(docs: list[Any]) -> None:
    for text in pyyaml_texts(docs):
        check(text)


@PROPERTY
@given(st.lists(st.one_of(documents, kubernetes_objects()), min_size=1, max_size=3))
def test_go_yaml_dumps_read_as_csafeloader_does(docs: list[Any]) -> None:
    check(go_yaml(*docs))


risky = st.sampled_from(["0x1F", "1_000", "0755", "yes", "on", "Off", "2026-01-01", ".inf",
                         "-.inf", "190:20:30", "1e5", "0b101", "-0", "+5", "1.5", "~", "null",
                         "<<", "=", "2026-01-01T10:00:00.5Z", "1.0e+5", "0o17", "1:2:3.5"])


@PROPERTY
@given(st.dictionaries(keys, st.one_of(risky, st.lists(risky, max_size=3)), min_size=1,
                       max_size=6), st.dictionaries(risky, strings, max_size=3))
def test_plain_scalars_resolve_as_yaml_1_1(values: dict[str, Any], by_key: dict[str, Any]
                                           ) -> None:
    """What go-yaml writes plain though YAML 1.1 reads another type (hex, octal, 1_000, yes/on,
    timestamps, .inf, sexagesimal), as keys too: read as KubectlLoader reads them."""
    def plain(o: Any) -> Any:
        return [Plain(x) for x in o] if isinstance(o, list) else Plain(o)
    obj = {k: plain(v) for k, v in values.items()} | {Plain(k): v for k, v in by_key.items()}
    check(go_yaml(obj))
    for text in pyyaml_texts([obj]):
        check(text)


EDITS = [*" -:#'\"|>{}[],&*!?%@\t\r\n\\a1._~", "  ", "- ", ": ", " #", "---\n", "...", "\n  ",
         "\n- ", "|-\n", "\ufeff", "\x85"]


@settings(PROPERTY, max_examples=600)
@given(st.lists(st.one_of(documents, kubernetes_objects(mild), kubernetes_objects(mild)),
                min_size=1, max_size=2),
       st.integers(0, 3), st.lists(st.tuples(st.floats(0, 1), st.integers(0, 2),
                                             st.sampled_from(EDITS)), min_size=1, max_size=3))
def test_edited_texts_are_read_right_or_handed_back(
        docs: list[Any], which: int, edits: list[tuple[float, int, str]]) -> None:
    """Random damage to a valid text: the loader's reading where the fast reader gives one,
    and never a reading where the loader raises."""
    t = text(docs, which)
    for where, cut, insert in edits:
        i = int(where * len(t))
        t = t[:i] + insert + t[i + cut:]
    check(t)


# What kubectl v1.32.4 wrote (`kubectl annotate --local -f objects.json x=y -o yaml`): long
# strings folded at 80 columns, plain and single-quoted; `|` blocks; strings that would read
# as another type double-quoted; unicode as it is.
KUBECTL_SERVICE_AND_SLICE = r"""apiVersion: v1
kind: Service
metadata:
  annotations:
    colon: 'a: b'
    ctrl: "a\ab"
    empty: ""
    json: |
      {"apiVersion":"v1","kind":"Service","metadata":{"annotations":{},"name":"web","namespace":"a"},"spec":{"ports":[{"port":80}]}}
    lead: ' x'
    long: this is a long annotation value with many words that goes beyond the eighty
      column limit for sure yes
    longq: 'a: b this is a long annotation value with many words that goes beyond
      the eighty column limit: for sure'
    multi: |
      line one
      line two
    num: "0755"
    quote: it's "q"
    tab: "a\tb"
    uni: 日本 é
    x: "y"
    "yes": "yes"
  name: web
  namespace: a
spec:
  clusterIP: 10.96.0.10
  ports:
  - port: 80
    protocol: TCP
    targetPort: 8080
  selector:
    app: web
---
addressType: IPv4
apiVersion: discovery.k8s.io/v1
endpoints:
- addresses:
  - 10.244.1.5
  conditions:
    ready: true
  nodeName: n1
kind: EndpointSlice
metadata:
  annotations:
    x: "y"
  labels:
    kubernetes.io/service-name: web
  name: web-abc
  namespace: a
ports:
- name: ""
  port: 8080
  protocol: TCP
"""
KUBECTL_NODE = r"""apiVersion: v1
kind: Node
metadata:
  annotations:
    kubeadm.alpha.kubernetes.io/cri-socket: unix:///var/run/containerd/containerd.sock
    node.alpha.kubernetes.io/ttl: "0"
    volumes.kubernetes.io/controller-managed-attach-detach: "true"
    x: "y"
  creationTimestamp: "2026-11-24T10:00:00Z"
  labels:
    beta.kubernetes.io/arch: amd64
    kubernetes.io/hostname: node-a
    node-role.kubernetes.io/control-plane: ""
  name: node-a
  resourceVersion: "123456"
  uid: 0f3c1c2e-1111-2222-3333-444455556666
spec:
  podCIDR: 10.244.0.0/24
  podCIDRs:
  - 10.244.0.0/24
  taints:
  - effect: NoSchedule
    key: node-role.kubernetes.io/control-plane
status:
  addresses:
  - address: 192.168.1.10
    type: InternalIP
  - address: node-a
    type: Hostname
  allocatable:
    cpu: "8"
    ephemeral-storage: "95500736762"
    hugepages-2Mi: "0"
    memory: 16165596Ki
    pods: "110"
  capacity:
    cpu: "8"
    memory: 16267996Ki
    pods: "110"
  conditions:
  - lastHeartbeatTime: "2026-11-24T10:05:00Z"
    lastTransitionTime: "2026-11-24T10:00:00Z"
    message: kubelet has sufficient memory available
    reason: KubeletHasSufficientMemory
    status: "False"
    type: MemoryPressure
  - lastHeartbeatTime: "2026-11-24T10:05:00Z"
    lastTransitionTime: "2026-11-24T10:01:00Z"
    message: 'container runtime network not ready: NetworkReady=false reason:NetworkPluginNotReady
      message:Network plugin returns error: cni plugin not initialized'
    reason: KubeletNotReady
    status: "False"
    type: Ready
  daemonEndpoints:
    kubeletEndpoint:
      Port: 10250
  images:
  - names:
    - registry.k8s.io/etcd@sha256:a6dc63e6e8cfa0307d7851762fa6b629afb18f28d8aa3fab5a6e91b4af60026a
    - registry.k8s.io/etcd:3.5.15-0
    sizeBytes: 56909194
  - names:
    - registry.k8s.io/pause:3.10
    sizeBytes: 320368
  nodeInfo:
    architecture: amd64
    bootID: b1
    containerRuntimeVersion: containerd://1.7.22
    kernelVersion: 6.1.0-56-amd64
    kubeProxyVersion: ""
    kubeletVersion: v1.35.4
    machineID: m1
    operatingSystem: linux
    osImage: Debian GNU/Linux 12 (bookworm)
    systemUUID: s1
"""


def test_what_kubectl_writes_takes_the_fast_path() -> None:
    assert check(KUBECTL_SERVICE_AND_SLICE) is not None
    docs = check(KUBECTL_NODE)
    assert docs is not None
    assert docs[0]["status"]["conditions"][1]["message"] == (
        "container runtime network not ready: NetworkReady=false "
        "reason:NetworkPluginNotReady message:Network plugin returns error: cni plugin not "
        "initialized")


def test_realistic_dumps_take_the_fast_path() -> None:
    """The fast reader is not a fallback that always falls back: what kubectl writes for
    Services, EndpointSlices and Nodes (in either dumper's layout) it reads itself."""
    from bench.cluster_gen import generate

    dump: dict[str, Any] = {"apiVersion": "v1", "kind": "List", "items": generate(50, 3),
                            "metadata": {"resourceVersion": ""}}
    dump["items"][0]["metadata"]["annotations"] = {
        "kubectl.kubernetes.io/last-applied-configuration": '{"apiVersion":"v1"}\n',
        "note": "it's \"quoted\": yes", "empty": "", "num": "0755", "multi": "a\n\nb"}
    dump["items"][0]["metadata"]["creationTimestamp"] = "2026-11-24T10:00:00Z"
    for text in [yaml.safe_dump(dump, default_flow_style=False), go_yaml(dump),
                 *pyyaml_texts([dump])[1:]]:
        assert check(text) == [dump], text


# --- examples ------------------------------------------------------------------------------

READ = [
    ("", []), ("\n", []), ("---\n", [None]), ("---\n---\n", [None, None]),
    ("a: 1\n---\n", [{"a": 1}, None]), ("---\na: 1\n", [{"a": 1}]),
    ("a: 1\n---\nb: 2", [{"a": 1}, {"b": 2}]), ("a:\nb:\n", [{"a": None, "b": None}]),
    ("a:\n- 1\n- 2\nb: 3\n", [{"a": [1, 2], "b": 3}]),
    ("a:\n  - 1\n  - x\nb: 3\n", [{"a": [1, "x"], "b": 3}]),
    ("- a: 1\n  b:\n  - x\n- c\n", [[{"a": 1, "b": ["x"]}, "c"]]),
    ("- a:\n- b\n", [[{"a": None}, "b"]]), ("  a: 1\n  b: 2\n", [{"a": 1, "b": 2}]),
    ("a: 1\n\nb: 2\n", [{"a": 1, "b": 2}]),
    ("a: |\n  x\n  y\nb: 1\n", [{"a": "x\ny\n", "b": 1}]),
    ("a: |-\n  x\n\n  y\n\nb: 1\n", [{"a": "x\n\ny", "b": 1}]),
    ("a: |+\n  x\n\n\nb: 1\n", [{"a": "x\n\n\n", "b": 1}]),
    ("a: >\n  x\n  y\n\n  z\n   w\n  v\nb: 1\n", [{"a": "x y\nz\n w\nv\n", "b": 1}]),
    ("a: |\n  x", [{"a": "x"}]), ("- |\n  x\n- >-\n  y\n  z\n", [["x\n", "y z"]]),
    ("a:\n- |\n x\n", [{"a": ["x\n"]}]),
    ('a: "\\t\\u00e9\\x41\\U0001F600\\N\\_\\L\\P\\/\\ \\0\\e\\""\n',
     [{"a": "\té\x41\U0001f600\x85\xa0\u2028\u2029/ \0\x1b\""}]),
    ("a: 'it''s'\nb: ''\nc: \"\"\n", [{"a": "it's", "b": "", "c": ""}]),
    ("- \"a: b\"\n- 'c: d'\n\"e\": 'f'\n", None),
    ("- \"a: b\"\n- 'c: d'\n", [["a: b", "c: d"]]),
    ("a: 0x1F\nb: 1_000\nc: yes\nd: off\ne: 0755\nf: .inf\ng: 2026-01-01\ni: ~\nj: null\n"
     "k: 1.5\nl: -0\nm: +5\nn: 1e5\no: 190:20:30\n",
     [{"a": 31, "b": 1000, "c": True, "d": False, "e": 493, "f": math.inf,
       "g": "2026-01-01", "i": None, "j": None, "k": 1.5, "l": 0, "m": 5,
       "n": "1e5", "o": "190:20:30"}]),
    # what kubectl reads as strings though YAML 1.1 reads another type, or none (issue 35)
    ("a: =\nb: <<\nc: 2026-13-45\nd: 2026-01-01 10:00:00 +2\ne: 1:20\nf: .5_\ng: 0x_\n"
     "h: 0x1FFFFFFFFFFFFFFFF\ni: -0x8000000000000001\nj: 0xFFFFFFFFFFFFFFFF\nk: 1.0e+999\n"
     "l: -.inf\n=: 1\n'<<': 2\n",
     [{"a": "=", "b": "<<", "c": "2026-13-45", "d": "2026-01-01 10:00:00 +2", "e": "1:20",
       "f": ".5_", "g": "0x_", "h": "0x1FFFFFFFFFFFFFFFF", "i": "-0x8000000000000001",
       "j": 2**64 - 1, "k": "1.0e+999", "l": -math.inf, "=": 1, "<<": 2}]),
    ("- =\n- <<\n- 2026-01-01\n", [["=", "<<", "2026-01-01"]]),
    ("true: 1\n1: a\nnull: b\n", [{True: "a", None: "b"}]),
    ("a: {}\nb: []\n- {}\n", None), ("a: {}\nb: []\n", [{"a": {}, "b": []}]),
    ("a:b: c\na: x#y\nb: -x\nc: http://h:80/p\nd: a,b]\n",
     [{"a:b": "c", "a": "x#y", "b": "-x", "c": "http://h:80/p", "d": "a,b]"}]),
    ("a: é \xa0x\né: 日本\n", [{"a": "é \xa0x", "é": "日本"}]),
    ('a: "b\n  c"\n', [{"a": "b c"}]), ("- a\n  - b\n", [["a - b"]]),
    ("a: b\n\n\n  c\n   d\n\ne: 1\n", [{"a": "b\n\nc d", "e": 1}]), ("a: 1\n  2\n", [{"a": "1 2"}]),
    ("a: b\n  c\n- a\n -b\n", None), ("- a\n -b\n", [["a -b"]]),
    ("a: x\n\n  y\n", [{"a": "x\ny"}]),
    ("a: 'x\n\n  y'\nb: \"p\\\n  \\ q\\\n\n  r\"\n", [{"a": "x\ny", "b": "p q\nr"}]),
    ("- 1.2.3\n- 1..\n- 0.0.0.0\n- 1.2.3e5\n- 1.2\n- 1.2.3:4\n- 1.2.3-4\n- 2026.01.01\n"
     "- 1_0.2.3\n- 1.2.3 4\n",
     [["1.2.3", "1..", "0.0.0.0", "1.2.3e5", 1.2, "1.2.3:4", "1.2.3-4", "2026.01.01",
       "1_0.2.3", "1.2.3 4"]]),
    ("- - a\n  - b\n- - - c\n    - d: 1\n      e: |\n        f\n",
     [[["a", "b"], [["c", {"d": 1, "e": "f\n"}]]]]),
]


@pytest.mark.parametrize("text,docs", [c for c in READ if c[1] is not None])
def test_read(text: str, docs: list[Any]) -> None:
    fast = check(text)
    assert fast is not None
    assert same(fast, docs)


HANDED_BACK = [
    "'a: b': c\n", "<<: {}\n", "<<: a\n", "a:\n  <<: 1\n", "a: {a: 1}\n", "a: [1]\n", "a: b # c\n",
    "# c\na: 1\n", "a: &x 1\n", "a: *x\n", "a: !!str 1\n", "a:\n  b\n",
    "a:   b\n", "a : b\n", "a: b: c\n", "a: -\n",
    "a:\n    b: 1\n  c: 2\n", "  a: 1\nb: 2\n", "a: 1\n- b\n", "- a\nb: 1\n", "foo\n",
    "---\nfoo\n", "--- a\n", "a: 1\n...\n", "\ufeffa: 1\n", 'a: "\\ud800"\n', "...: 1\n",
    "---x: 1\n", "a: |2\n   x\n", "a: | # c\n  x\n", "a: |\nb: 1\n", "k" * 1200 + ": 1\n",
    "a: '''\n", "a: 'x' y\n", "%YAML 1.1\n---\na: 1\n", "a: [\n", "? a\n: b\n", "a: @x\n",
    "a: `x\n", "a: %x\n", "a: ,x\n", "a: |\n    x\n  y\n", "a:\n-b\n",
    "a:\tb\n", "a: b\r\n", "a: b \n", "a: b ", "a: \x85\n", "a: \u2028\n", "a: \x07\n",
    "a: 1\n- b: 2\n", "a: >2\n   x\n", "- -\n", "-\n", " " * 498 + "a: 1\n",
]


@pytest.mark.parametrize("text", HANDED_BACK)
def test_handed_back(text: str) -> None:
    assert load_all(text) is None


def test_changed_pyyaml_tables_hand_everything_back(monkeypatch: pytest.MonkeyPatch) -> None:
    """A program that taught KubectlLoader other constructors or path resolvers reads with
    them: the fast reader, which knows only the stock ones, steps aside."""
    assert load_all("a: 1\n") == [{"a": 1}]
    monkeypatch.setattr(KubectlLoader, "yaml_constructors",
                        {**KubectlLoader.yaml_constructors,
                         "tag:yaml.org,2002:int": lambda loader, node: "int!"})
    assert load_all("a: 1\n") is None
    monkeypatch.undo()
    monkeypatch.setattr(KubectlLoader, "yaml_path_resolvers", {("x",): "y"})
    assert load_all("a: 1\n") is None


@pytest.mark.parametrize("text", [*NASTY, "1.2.3", "10.96.0.1", "1.2", "0o7", "0x_", "+.inf",
                                  "-.NaN", "1__0", "12:30", "2026-01-01t10:00:00", "Yes",
                                  "ON", "nULL"])
def test_one_pattern_a_first_character_resolves_as_pyyaml(text: str) -> None:
    """The reader tries a first character's implicit resolvers as one pattern (and takes a
    shortcut for dotted numbers): the tag is the one PyYAML's resolver gives."""
    if not text:
        return
    tag = Resolver().resolve(ScalarNode, text, (True, False))
    try:
        value = kubeyaml._Scalars().resolved(text)
    except kubeyaml._Outside:  # `!`, `&`, `*`: never plain
        assert tag == "tag:yaml.org,2002:yaml"
        return
    construct = KubectlLoader.yaml_constructors[tag]
    assert same(value, construct(KubectlLoader(""), ScalarNode(tag, text)))


def test_resolvers_a_program_added_are_used(monkeypatch: pytest.MonkeyPatch) -> None:
    """Implicit resolvers are CSafeLoader's own, whatever they are; the shortcut that reads
    10.0.0.1 as a str without trying them is taken only with PyYAML's stock ones."""
    table = {k: list(v) for k, v in yaml.CSafeLoader.yaml_implicit_resolvers.items()}
    monkeypatch.setattr(yaml.CSafeLoader, "yaml_implicit_resolvers", table)
    yaml.CSafeLoader.add_implicit_resolver("tag:yaml.org,2002:null",
                                           re.compile(r"^\d+(?:\.\d+){3}$"), list("0123456789"))
    text = "a: 10.0.0.1\nb: 10.0.0\n"
    assert load_all(text) == list(yaml.load_all(text, Loader=KubectlLoader)) == [
        {"a": None, "b": "10.0.0"}]


@example("a: 1\n")
@settings(max_examples=200, deadline=None)
@given(st.text(st.sampled_from("ab1 -:#'\"|>\n{}[]"), max_size=30))
def test_short_random_texts(text: str) -> None:
    check(text)


def test_module_says_why() -> None:
    assert kubeyaml.__doc__ and "KubectlLoader" in kubeyaml.__doc__
