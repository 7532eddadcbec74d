"""kubectl's own YAML, read as kubectl means it (issue 35, item 2).

kubectl writes YAML with sigs.k8s.io/yaml (go-yaml v2), which leaves `=`, `<<`, timestamps Go
cannot parse, `1:20` and more unquoted; YAML 1.1 as libyaml's loader reads them is another type
or none (the whole file was refused). Here the writer is kubectl's own code:
integration/upstream/kubectlyaml (unstructured decoding, then sigs.k8s.io/yaml's Marshal, as
`kubectl get -o yaml` prints), built from the Go module proxy at the versions kube-proxy
v1.35.4 is built with. Thousands of generated objects, with hostile strings where Kubernetes
objects hold text, go through it, and what `--from-file` reads from its YAML must be what it
reads from the JSON they came from: same values, same types, by both readers (the fast one, and
libyaml's loader, which reads a text outside the fast one's subset). Then the same as a new
process, `ipvsproxy sync --once --from-file ... -o json`, on a dump as `kubectl get -o yaml`
writes it.

Left out of the generated strings, as kubectl's own losses rather than a reader's: U+0085
(go-yaml writes it as a space) and the control characters go-yaml refuses to write (kubectl
prints an error); and a key `<<` with a mapping as its value (kubectl's reader merges it).
"""

from __future__ import annotations

import json
import random
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from integration.upstream import build
from ipvsproxy.inputs import kubeyaml, manifests
from tests.unit.test_kubeyaml import NASTY

SEED = 35
OBJECTS = 2500
ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def kubectl_yaml() -> Path:
    """kubectl's YAML writer, built once and cached (make setup builds it; without Go this
    fails, as every test of the upstream components does)."""
    return build.kubectl_yaml()


def kubectl_get_o_yaml(binary: Path, docs: list[Any]) -> list[str]:
    p = subprocess.run([str(binary)], input=json.dumps(docs), capture_output=True, text=True,
                       check=True)
    out: list[str] = json.loads(p.stdout)
    return out


def same(a: Any, b: Any) -> bool:
    """Equal, of the same types all the way down (True is not 1); mappings in any order, as
    go-yaml sorts their keys."""
    if type(a) is not type(b):
        return False
    if isinstance(a, dict):
        return a.keys() == b.keys() and all(same(v, b[k]) for k, v in a.items())
    if isinstance(a, list):
        return len(a) == len(b) and all(same(x, y) for x, y in zip(a, b, strict=True))
    return bool(a == b)


# --- generated objects ---------------------------------------------------------------------

# go-yaml refuses C0 controls other than tab and line breaks, DEL and C1 controls; U+0085 it
# writes as a space
_UNWRITABLE = {chr(c) for c in [*range(0x20), 0x7F, *range(0x80, 0xA0)]} - {"\t", "\n", "\r"}
_ALPHABET = "0123456789-+:._eEbBoOxXTtZzyYnN <=>~!&*|#,[]{}'\"%@\\/aé\t\n日"
_SHAPES = [  # what YAML 1.1 reads as a number or a date, as go-yaml does or does not
    "{d4}-{d2}-{d2}", "{d4}-{d1}-{d1}", "{d4}-{d2}-{d2}T{d2}:{d2}:{d2}Z",
    "{d4}-{d2}-{d2} {d2}:{d2}:{d2} +{d1}", "{d4}-{d2}-{d2}t{d1}:{d2}:{d2}.{d3}",
    "{d4}-{d2}-{d2}T{d2}:{d2}:{d2}", "{d1}:{d2}", "{d2}:{d2}:{d2}.{d1}", "-{d1}:{d2}",
    "0x{h}", "0x_", "0b_", "0b{b}", "-0x{h}", "+0x{h}", "0{o}", ".{d2}_", ".{d1}_{d1}", "{d1}_{d3}",
    "{d1}.{d2}e+{d3}", "{d1}.e+{d1}", "{d2}.", "+{d1}", "-0", "0_", "{d1}__{d1}", "1e{d1}",
    "0o{o}", "=", "<<", "~", "y", "N", "off", "On", ".nan", "-.Inf",
]


def _digits(rng: random.Random, n: int, alphabet: str = "0123456789") -> str:
    return "".join(rng.choice(alphabet) for _ in range(n))


def hostile(rng: random.Random) -> str:
    k = rng.random()
    if k < 0.25:
        s = rng.choice(NASTY)
    elif k < 0.6:
        s = rng.choice(_SHAPES).format(
            d1=_digits(rng, 1), d2=_digits(rng, 2), d3=_digits(rng, 3), d4=_digits(rng, 4),
            h=_digits(rng, rng.choice([2, 16, 17, 20]), "0123456789abcdefABCDEF"),
            b=_digits(rng, rng.choice([3, 64, 65]), "01"), o=_digits(rng, 3, "01234567"))
    else:
        s = "".join(rng.choice(_ALPHABET) for _ in range(rng.randint(0, 10)))
    return "".join(c for c in s if c not in _UNWRITABLE)


def _free(rng: random.Random, depth: int = 0) -> Any:
    """A free-form value, as CRD fields and annotations' JSON hold them."""
    k = rng.random()
    if depth < 3 and k < 0.2:
        out = {hostile(rng): _free(rng, depth + 1) for _ in range(rng.randint(0, 3))}
        if isinstance(out.get("<<"), dict | list):  # kubectl's reader would merge it
            out["<<"] = "<<"
        return out
    if depth < 3 and k < 0.35:
        return [_free(rng, depth + 1) for _ in range(rng.randint(0, 3))]
    if k < 0.45:
        return rng.randint(-(2**63), 2**63 - 1)
    if k < 0.5:  # a float that JSON and go-yaml write alike (kubectl's conversion turns an
        return rng.randint(1, 10**9) / 1000 + 0.0005  # integral one into an int)
    if k < 0.55:
        return rng.choice([True, False, None])
    return hostile(rng)


def _meta(rng: random.Random) -> dict[str, Any]:
    meta: dict[str, Any] = {
        "name": hostile(rng) or "x", "namespace": hostile(rng) or "default",
        "labels": {hostile(rng): hostile(rng) for _ in range(rng.randint(0, 3))},
        "annotations": {hostile(rng): hostile(rng) for _ in range(rng.randint(0, 4))},
        "resourceVersion": str(rng.randint(1, 10**9)),
        "creationTimestamp": rng.choice(["2026-11-24T10:00:00Z", hostile(rng)])}
    for m in ("labels", "annotations"):
        meta[m] = {k: v for k, v in meta[m].items() if k != "<<"} or {"<<x": "="}
    return meta


def generated(rng: random.Random) -> dict[str, Any]:
    kind = rng.choice(["Service", "EndpointSlice", "Node"])
    obj: dict[str, Any] = {"apiVersion": "discovery.k8s.io/v1" if kind == "EndpointSlice"
                           else "v1", "kind": kind, "metadata": _meta(rng)}
    if kind == "Service":
        obj["spec"] = {
            "type": rng.choice(["ClusterIP", "NodePort", "LoadBalancer", hostile(rng)]),
            "clusterIP": rng.choice(["10.96.0.10", hostile(rng)]),
            "externalIPs": [hostile(rng) for _ in range(rng.randint(0, 2))],
            "ports": [{"name": hostile(rng), "port": rng.randint(1, 65535),
                       "protocol": rng.choice(["TCP", "UDP", hostile(rng)]),
                       "targetPort": rng.choice([rng.randint(1, 65535), hostile(rng)])}
                      for _ in range(rng.randint(0, 3))],
            "selector": {hostile(rng): hostile(rng) for _ in range(rng.randint(0, 2))}}
    elif kind == "EndpointSlice":
        obj["addressType"] = rng.choice(["IPv4", "IPv6", hostile(rng)])
        obj["endpoints"] = [{"addresses": [hostile(rng)], "nodeName": hostile(rng),
                             "zone": hostile(rng),
                             "conditions": {"ready": rng.choice([True, False, None])}}
                            for _ in range(rng.randint(0, 3))]
        obj["ports"] = [{"name": hostile(rng), "port": rng.randint(1, 65535)}]
    else:
        obj["status"] = {"addresses": [{"address": hostile(rng), "type": "InternalIP"}],
                         "capacity": {"cpu": hostile(rng)}}
    if rng.random() < 0.5:
        obj["extra"] = _free(rng)
    return obj


# --- reading -------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def written(kubectl_yaml: Path) -> tuple[list[Any], list[str]]:
    """The generated objects, and each as `kubectl get KIND NAME -o yaml` writes it."""
    rng = random.Random(SEED)
    objs = [generated(rng) for _ in range(OBJECTS)]
    return objs, kubectl_get_o_yaml(kubectl_yaml, objs)


def test_kubectls_yaml_of_generated_objects_reads_as_their_json(
        written: tuple[list[Any], list[str]]) -> None:
    """Each object alone, by both readers."""
    objs, texts = written
    fast = outside = 0
    wrong: list[str] = []
    for obj, text in zip(objs, texts, strict=True):
        assert text, f"kubectl-yaml could not write {obj!r}"
        want = manifests.parse(json.dumps(obj), "o.json")
        assert want == [obj]
        fast += kubeyaml.load_all(text) is not None
        # a comment puts the text outside the fast reader's subset: libyaml's loader reads it
        for t in (text, "# kubectl get -o yaml\n" + text):
            try:
                got = manifests.parse(t, "o.yaml")
            except manifests.ManifestError as exc:
                wrong.append(f"{exc}\n{t}")
                continue
            if not same(got, want):
                wrong.append(f"{got!r}\n  != {want!r}\n{t}")
        outside += 1
    assert not wrong, f"{len(wrong)} of {2 * len(objs)} readings differ:\n" + "\n".join(wrong[:5])
    assert fast > len(objs) // 2  # most by the fast reader (hostile keys send some back)
    assert outside == len(objs)


def test_the_strings_that_were_refused_are_among_them(
        written: tuple[list[Any], list[str]]) -> None:
    """The generated objects hold what the issue found refused (`=` and `<<` as values), and
    what YAML 1.1 reads as another type though kubectl writes it unquoted."""
    objs, texts = written
    plain = {v for t in texts for line in t.splitlines()
             if (v := line.partition(": ")[2]) in ("=", "<<")}
    assert plain == {"=", "<<"}
    import yaml

    stock = 0
    for text in texts:
        try:
            if list(yaml.load_all(text, Loader=yaml.CSafeLoader)) != manifests.parse(
                    text, "o.yaml"):
                stock += 1
        except (yaml.YAMLError, ValueError):
            stock += 1
    assert stock > 0.05 * len(objs)  # libyaml's loader alone misreads or refuses these


def test_sync_from_file_of_kubectls_yaml_dump_is_that_of_its_json(
        tmp_path: Path, kubectl_yaml: Path) -> None:
    """`ipvsproxy sync --once --from-file DUMP -o json`, a new process, of a `kubectl get
    services,endpointslices,nodes -A -o yaml` dump whose annotations hold `=`, `<<` and
    unquoted dates: the same desired state and the same warnings as from the JSON dump."""
    from bench.cluster_gen import generate

    rng = random.Random(SEED)
    items = generate(200, 3)
    for i, o in enumerate(items):
        o.setdefault("metadata", {})["annotations"] = {
            "note": rng.choice(["=", "<<", "2026-13-45", "2026-1-2 3:04:05 +1", "1:20"]),
            "ipvsproxy.io/scheduler": rng.choice(["rr", "=", "<<", "wrr"]),
            **({"ipvsproxy.io/weight": rng.choice(["=", "0x_", "7"])}
               if o["kind"] == "EndpointSlice" else {}),
            "n": str(i)}
    dump = {"apiVersion": "v1", "kind": "List", "items": items,
            "metadata": {"resourceVersion": ""}}
    (yaml_text,) = kubectl_get_o_yaml(kubectl_yaml, [dump])
    assert "\n      note: =\n" in yaml_text and "\n      note: <<\n" in yaml_text
    (tmp_path / "dump.yaml").write_text(yaml_text)
    (tmp_path / "dump.json").write_text(json.dumps(dump, indent=4))
    node = next(o["metadata"]["name"] for o in items if o["kind"] == "Node")
    runs = {}
    for name in ("dump.yaml", "dump.json"):
        p = subprocess.run([sys.executable, "-m", "ipvsproxy", "sync", "--once", "--from-file",
                            str(tmp_path / name), "-o", "json", "--hostname-override", node,
                            "--cluster-cidr", "10.244.0.0/16"],
                           capture_output=True, text=True, cwd=ROOT, check=False)
        assert p.returncode == 0, p.stderr
        runs[name] = p
    assert runs["dump.yaml"].stdout == runs["dump.json"].stdout
    assert len(json.loads(runs["dump.yaml"].stdout)["virtual_servers"]) >= 200  # not empty
    assert runs["dump.yaml"].stderr == runs["dump.json"].stderr
    assert "ipvsproxy.io/scheduler" in runs["dump.yaml"].stderr  # `=` refused as a scheduler
