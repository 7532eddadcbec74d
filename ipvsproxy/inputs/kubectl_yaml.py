"""What kubectl means by a YAML text, for the two readers of manifests (manifests.py's libyaml
path and kubeyaml.py's fast one): libyaml's safe loader (`yaml.CSafeLoader`), except where
kubectl reads a scalar otherwise, and a bound on nesting.

kubectl writes YAML with sigs.k8s.io/yaml (go-yaml v2), which writes a string plain whenever
go-yaml's own resolver reads it back as a string, and reads YAML with it too, into plain Go
values that become JSON. YAML 1.1 as PyYAML resolves it reads some of those plain strings as
other types (issue 35): `=` (the "value" type) and `<<` (the merge key) as a value, which
libyaml's loader cannot construct, so a whole `kubectl get -o yaml` dump was refused;
timestamps, which go-yaml reads as the string whatever their form (its decoder keeps a
timestamp as text in an interface{}), and which PyYAML reads as dates, or refuses (2026-13-45);
base-60 numbers (`1:20`), floats that begin with a dot and hold `_` (`.5_`), hex and binary
numbers beyond 64 bits, and `0x_`, none of which go-yaml reads as a number. KubectlLoader
reads each of those as its text, as kubectl does, and a `<<` key as the merge key only where
it can be one (its value a mapping, or a sequence of mappings, as go-yaml merges it); else as
the string. Everything else is read as libyaml's loader reads it.

Nesting: libyaml's loader composes nodes by recursion in C, and a text nested 30,000 levels
deep ends the process (SIGSEGV; issue 32, item 11); the pure-Python loader raises
RecursionError. `too_deep` finds a text nested more than MAX_DEPTH levels without recursing,
far above any Kubernetes object (they nest a few dozen levels at most).
"""

from __future__ import annotations

import math
import re
from typing import Any

import yaml
from yaml.constructor import SafeConstructor
from yaml.nodes import MappingNode, Node, ScalarNode, SequenceNode

MAX_DEPTH = 1000  # collections inside collections, the document's own counted

_STR = "tag:yaml.org,2002:str"
_MERGE = "tag:yaml.org,2002:merge"
_GO_PREFIXED = re.compile(r"[-+]?0[xb]")
_INT64 = range(-(2**63), 2**63)
_UINT64 = range(2**64)


def _text(loader: Any, node: ScalarNode) -> str:
    """The scalar's text: go-yaml reads a timestamp, `=` and a `<<` that is a value so."""
    return str(loader.construct_scalar(node))


def _int(loader: Any, node: ScalarNode) -> int | str:
    text = _text(loader, node)
    if ":" in text:  # YAML 1.1's base 60 (1:20); go-yaml has none
        return text
    try:
        value: int = SafeConstructor.construct_yaml_int(loader, node)
    except ValueError:  # 0x_, 0b_
        return text
    # go-yaml: strconv.ParseInt, then ParseUint (no sign); past them a decimal or octal
    # number is a float, a hex or binary one a string
    if _GO_PREFIXED.match(text) and value not in _INT64 and (
            text[0] in "+-" or value not in _UINT64):
        return text
    return value


def _float(loader: Any, node: ScalarNode) -> float | str:
    text = _text(loader, node)
    # base 60 (1:20.5); and go-yaml reads a float that begins with a dot by strconv alone,
    # which refuses '_'
    if ":" in text or (text[:1] == "." and "_" in text):
        return text
    value: float = SafeConstructor.construct_yaml_float(loader, node)
    if math.isinf(value) and "inf" not in text.lower():  # beyond float64: strconv refuses it
        return text
    return value


# The constructors KubectlLoader has for the scalar types of PyYAML's implicit resolvers.
SCALAR_CONSTRUCTORS: dict[str, Any] = {
    "tag:yaml.org,2002:null": SafeConstructor.construct_yaml_null,
    "tag:yaml.org,2002:bool": SafeConstructor.construct_yaml_bool,
    "tag:yaml.org,2002:int": _int,
    "tag:yaml.org,2002:float": _float,
    "tag:yaml.org,2002:timestamp": _text,
    "tag:yaml.org,2002:value": _text,
    _MERGE: _text,
}


def _mergeable(node: Node) -> bool:
    return isinstance(node, MappingNode) or (
        isinstance(node, SequenceNode) and all(isinstance(n, MappingNode) for n in node.value))


def _loader_class(base: Any) -> Any:
    class Loader(base):  # type: ignore[misc]
        def flatten_mapping(self, node: MappingNode) -> None:
            # a `<<` key whose value cannot be merged is the string (go-yaml refuses it;
            # kubectl writes one only for a key "<<" of the JSON)
            for key, value in node.value:
                if key.tag == _MERGE and not _mergeable(value):
                    key.tag = _STR
            super().flatten_mapping(node)

    for tag, f in SCALAR_CONSTRUCTORS.items():
        Loader.add_constructor(tag, f)
    return Loader


# libyaml's loader with kubectl's scalars; PyYAML's pure-Python one where it lacks libyaml
KubectlLoader: Any = _loader_class(getattr(yaml, "CSafeLoader", None) or yaml.SafeLoader)
KubectlLoader.__name__ = KubectlLoader.__qualname__ = "KubectlLoader"
KubectlPyLoader: Any = _loader_class(yaml.SafeLoader)  # the same, pure Python (and the tests)
KubectlPyLoader.__name__ = KubectlPyLoader.__qualname__ = "KubectlPyLoader"

_OPEN = (yaml.MappingStartEvent, yaml.SequenceStartEvent)
_CLOSE = (yaml.MappingEndEvent, yaml.SequenceEndEvent)


def too_deep(text: str, limit: int = MAX_DEPTH) -> bool:
    """Whether `text` nests collections more than `limit` deep. A bound first, at C speed:
    block collections need more indentation at least every second level, so their depth is
    at most twice the longest line, and each flow collection needs its own `[` or `{`. Only
    where that bound is over the limit are the parser's events counted (a quarter of the
    load's time; libyaml's parser does not recurse)."""
    longest = max(map(len, text.split("\n")), default=0)
    if 2 * longest + 2 + text.count("[") + text.count("{") <= limit:
        return False
    depth = 0
    try:
        for event in yaml.parse(text, Loader=KubectlLoader):
            if isinstance(event, _OPEN):
                depth += 1
                if depth > limit:
                    return True
            elif isinstance(event, _CLOSE):
                depth -= 1
    except yaml.YAMLError:
        return False  # invalid anyway: the loader says where
    return False
