"""kube-proxy's configuration file for `ipvsproxy run --config`: reads a KubeProxyConfiguration
(kubeproxy.config.k8s.io/v1alpha1, YAML or JSON, as kubeadm keeps it in the kube-system/kube-proxy
ConfigMap) and turns it into values for the flags of the same meaning.

Owns the reading: decoding, type checks against the schema, the translation of each field into
a flag's value, and the warnings. The schema itself (which fields kube-proxy knows, their types,
the table from field to flag, which fields are reported as not supported and which are ignored
silently, the upstream defaults) is data in kpschema.py. It does not decide anything the flags
decide: `run._config` puts the values in place of flags left at their defaults (a flag given on
the command line wins), and `config.from_args` validates the result as for any command line.

The upstream sources this follows: staging/src/k8s.io/kube-proxy/config/v1alpha1/types.go (the
fields), pkg/proxy/apis/config/v1alpha1/defaults.go and conversion.go (defaulting, and which
section counts in which mode) and cmd/kube-proxy/app/options.go loadConfig (decoding).

Decisions, and why:

* Unknown fields are warnings, not errors. kube-proxy decodes strictly first, but for v1alpha1
  falls back to a lenient decoder and only logs "Using lenient decoding as strict decoding failed"
  (options.go loadConfig). A drop-in replacement has to start on every file kube-proxy starts on:
  the ConfigMap is often shared with, or copied from, a kube-proxy of another version whose extra
  fields this table does not know. Duplicate keys, the other strict-decoding failure, are
  warnings too. Wrong types are errors, as in kube-proxy (the lenient decoder fails on them too).
* Fields kube-proxy honours in IPVS mode but ipvsproxy does not (conntrack tuning, client QPS,
  logging, ...) are warnings when they are set to something other than their zero value or
  kube-proxy's default: the warning tells someone that a choice they made has no effect. Fields
  kube-proxy itself ignores in IPVS mode (iptables.syncPeriod, nftables.*, winkernel.*, ...) are
  ignored silently, as kube-proxy ignores them.
* Zero values mean "not set": v1alpha1 has no omitempty, so every generated file (kubeadm's
  included) spells out `syncPeriod: 0s`, `masqueradeAll: false`, `scheduler: ""` for fields nobody
  chose, and upstream defaulting fills those in the same way. One consequence departs from
  kube-proxy: `ipvs.minSyncPeriod: 0s` leaves ipvsproxy's default (1s, see add_daemon_flags) in
  place rather than meaning "sync at every event"; --ipvs-min-sync-period=0 asks for that.
  Pointer fields (iptables.masqueradeBit) are "not set" only when null or absent, as upstream.
* `mode` must be "ipvs" or empty: a file asking for another mode is not meant for this proxy.
  An empty mode is taken as ipvs (upstream would pick iptables), and ipvs.* is read.
* The values come in the form argparse stores for each flag, so that run._config can put them
  in the namespace as they are: text as typed on a command line ("30s", "10.244.0.0/16,fd00::/48",
  "primary") for the text flags, an int for --iptables-masquerade-bit (type=int) and True for the
  store_true flags (--masquerade-all, --ipvs-strict-arp). The text "false" would be truthy.

ipvsproxy flags with no KubeProxyConfiguration field: --ip-families (kube-proxy detects the
families), --ipvs-graceful-termination-period and --service-metrics (ipvsproxy's own), and
--service-cluster-ip-range, --external-ip-cidrs, --node-network-cidrs and
--max-objects-per-service (kube-proxy has none of them: the service range is the API server's
setting, and ipvsproxy also reads it from the cluster's ServiceCIDR objects).
"""

from __future__ import annotations

import json
import re
from collections.abc import Hashable
from ipaddress import ip_address, ip_network
from pathlib import Path
from typing import Any

import yaml

from ipvsproxy.settings.config import ConfigError, duration, parse_bind_address
from ipvsproxy.settings.kpschema import (
    API_VERSION,
    DETECT_LOCAL_MODES,
    HEALTHZ,
    KIND,
    KIND_TEXT,
    MAPPED,
    METRICS,
    NODEPORT_KEYWORDS,
    SCHEMA,
    UNSUPPORTED,
    UPSTREAM_DEFAULTS,
    Kind,
    Value,
)

# Go's time.ParseDuration: an optional sign, then number-unit pairs, or a bare "0".
_GO_UNITS = {"ns": 1e-9, "us": 1e-6, "µs": 1e-6, "μs": 1e-6, "ms": 1e-3, "s": 1.0, "m": 60.0,
             "h": 3600.0}
_GO_PART = r"(\d+(?:\.\d*)?|\.\d+)(ns|us|µs|μs|ms|s|m|h)"
_GO_DURATION = re.compile(rf"[-+]?(?:0|(?:{_GO_PART})+)")

def defaults_from_file(path: str) -> tuple[dict[str, Value], list[str]]:
    """The flag values (by argparse dest) a KubeProxyConfiguration file sets, and warnings about
    what in it is not used. ConfigError, naming the file and the field, when it cannot be used."""
    return _File(path).read()


def go_duration(text: str) -> float | None:
    """Seconds of a Go duration string ("1m30s", "250ms", "0"), None when it is not one."""
    t = text.strip()
    if not _GO_DURATION.fullmatch(t):
        return None
    sign = -1.0 if t.startswith("-") else 1.0
    return sign * sum(float(n) * _GO_UNITS[u] for n, u in re.findall(_GO_PART, t))


class _File:
    def __init__(self, path: str) -> None:
        self.path = path
        self.warnings: list[str] = []
        self.values: dict[str, Value] = {}
        self.fields: dict[str, Any] = {}  # leaf path -> type-checked, non-null value

    def error(self, field: str, problem: str) -> ConfigError:
        return ConfigError(f"{self.path}: {field}: {problem}")

    def warn(self, field: str, problem: str) -> None:
        self.warnings.append(f"{self.path}: {field}: {problem}")

    def read(self) -> tuple[dict[str, Value], list[str]]:
        doc = self.load()
        if not isinstance(doc, dict):
            raise ConfigError(f"{self.path}: not a {KIND} (the file holds no mapping)")
        for field, want in (("apiVersion", API_VERSION), ("kind", KIND)):
            got = doc.get(field)
            if got != want:
                raise self.error(field, f"{got!r} is not {want!r}" if got is not None
                                 else f"missing (a {KIND} has {field}: {want})")
        self.walk(doc, "")
        self.check_mode()
        v6 = self.bind_address_is_v6()
        self.check_detect_local()
        for field, dest in MAPPED.items():
            value = self.mapped(field, self.fields.get(field))
            if value is not None:
                self.values[dest] = value
        if v6:
            # An empty healthz/metrics address is upstream's default, whose family follows
            # bindAddress (defaults.go getDefaultAddresses): on an IPv6 one it is not ipvsproxy's.
            for dest, (_, host, port) in (("healthz_bind_address", HEALTHZ),
                                          ("metrics_bind_address", METRICS)):
                self.values.setdefault(dest, f"{host}:{port}")
        for field, why in UNSUPPORTED.items():
            if field in self.fields and self.chosen(field):
                self.warn(field, f"{_show(self.fields[field])} is ignored: {why}")
        return self.values, self.warnings

    # -- decoding ---------------------------------------------------------------------------

    def load(self) -> Any:
        try:
            text = Path(self.path).read_text(encoding="utf-8")
        except OSError as exc:
            raise ConfigError(f"{self.path}: cannot read it: {exc.strerror or exc}") from None
        except UnicodeDecodeError as exc:
            raise ConfigError(f"{self.path}: not UTF-8 text: {exc}") from None
        try:
            if text.lstrip().startswith("{"):
                return json.loads(text, object_pairs_hook=self.json_object)
            loader = _Loader(text)
            try:
                doc = loader.get_single_data()
            finally:
                loader.dispose()
            for key, line in loader.duplicates:
                self.warnings.append(f"{self.path}: line {line}: {key} is given twice; "
                                     "the last one counts")
            return doc
        except (yaml.YAMLError, ValueError) as exc:
            raise ConfigError(f"{self.path}: not valid YAML or JSON: {_parse_error(exc)}"
                              ) from None

    def json_object(self, pairs: list[tuple[str, Any]]) -> dict[str, Any]:
        seen: set[str] = set()
        for key, _ in pairs:
            if key in seen:
                self.warnings.append(f"{self.path}: {key} is given twice; the last one counts")
            seen.add(key)
        return dict(pairs)

    def walk(self, node: dict[Any, Any], prefix: str) -> None:
        """Type-check every known field under node (Go's decoder would refuse a wrong type) and
        collect the non-null leaves in self.fields; warn about unknown ones."""
        for key, value in node.items():
            field = f"{prefix}{key}"
            kind = SCHEMA.get(field) if isinstance(key, str) else None
            if kind is None:
                # kube-proxy's lenient v1alpha1 decoding drops these with a log line
                self.warn(field, "unknown field, ignored (is it spelt right?)")
                continue
            if value is None:  # JSON null leaves a Go field at its zero value
                continue
            self.check_type(field, kind, value)
            if kind == "object":
                self.walk(value, f"{field}.")
            else:
                self.fields[field] = value

    def check_type(self, field: str, kind: Kind, value: Any) -> None:
        if not _type_ok(kind, value):
            raise self.error(field, f"expected {KIND_TEXT[kind]}, got {_show(value)}")
        if kind == "strings":
            for i, item in enumerate(value):
                if not isinstance(item, str):
                    raise self.error(f"{field}[{i}]", f"expected a string, got {_show(item)}")
        if kind == "duration":
            seconds = go_duration(value)
            if seconds is None:
                raise self.error(field, f"{value!r} is not a duration (like 30s, 1m0s, 500ms)")
            if seconds < 0:
                raise self.error(field, f"{value!r}: must not be negative")

    # -- the fields -------------------------------------------------------------------------

    def mapped(self, field: str, value: Any) -> Value | None:
        """The flag value of one mapped field, None when the file leaves it unset."""
        if value is None:
            return None
        kind = SCHEMA[field]
        if kind == "bool":
            # store_true flags: only true can be said, and false is the flag's default anyway
            return True if value else None
        if kind == "int":  # iptables.masqueradeBit, a pointer: 0 is a value
            bit: int = value
            if not 0 <= bit <= 31:
                raise self.error(field, f"{bit} is not within 0..31")
            return bit
        if kind == "duration":
            return _duration_text(value)
        if kind == "strings":
            if not value:
                return None
            return (self.nodeport_addresses(value) if field == "nodePortAddresses"
                    else self.cidrs(field, value))
        text: str = value.strip()
        if not text:
            return None
        if field == "clusterCIDR":
            return self.cluster_cidr(text)
        if field in ("healthzBindAddress", "metricsBindAddress"):
            return self.bind_address(field, text)
        return text

    def cidrs(self, field: str, items: list[str]) -> str:
        for i, item in enumerate(items):
            try:
                ip_network(item.strip(), strict=False)
            except ValueError:
                raise self.error(f"{field}[{i}]", f"{item!r} is not a CIDR") from None
        return ",".join(item.strip() for item in items)

    def cluster_cidr(self, text: str) -> str:
        # A comma list, at most one CIDR per family (validation.go; config.from_args says the
        # same of --cluster-cidr, but only here can the message name the field).
        families: list[int] = []
        for word in text.split(","):
            try:
                families.append(ip_network(word.strip(), strict=False).version)
            except ValueError:
                raise self.error("clusterCIDR", f"{word.strip()!r} is not a CIDR") from None
        if len(set(families)) != len(families):
            raise self.error("clusterCIDR", f"{text!r}: at most one CIDR per IP family")
        return ",".join(w.strip() for w in text.split(","))

    def nodeport_addresses(self, items: list[str]) -> str:
        field = "nodePortAddresses"
        if "primary" in items:
            if len(items) != 1:  # as kube-proxy's validation
                raise self.error(field, "'primary' cannot be combined with other entries")
            return "primary"
        out: list[str] = []
        for i, item in enumerate(items):
            if item in NODEPORT_KEYWORDS:
                if item == "localhost":
                    self.warn(field, "'localhost': NodePorts are not served on loopback "
                                     "addresses in IPVS mode (kube-proxy does not either)")
                out.extend(NODEPORT_KEYWORDS[item])
                continue
            try:
                ip_network(item.strip(), strict=False)
            except ValueError:
                raise self.error(f"{field}[{i}]",
                                 f"{item!r} is not a CIDR, 'primary', 'all' or 'localhost'"
                                 ) from None
            out.append(item.strip())
        return ",".join(out)

    def bind_address(self, field: str, text: str) -> str:
        """IP:PORT as kube-proxy's defaulting makes it: a bare IP gets the default port
        (defaults.go, proxyutil.AppendPortIfNeeded); the flag's own parser checks the rest."""
        port = HEALTHZ[2] if field == "healthzBindAddress" else METRICS[2]
        try:
            host, number = parse_bind_address(text, port)
            if not host or not number:  # the file must name both (validation.go validateHostPort)
                raise ValueError("an IP address and a port 1-65535 are required")
        except ValueError as exc:
            raise self.error(field, f"{text!r} is not IP:PORT ({exc})") from None
        return f"[{host}]:{number}" if ":" in host else f"{host}:{number}"

    def check_mode(self) -> None:
        mode = self.fields.get("mode", "")
        if mode not in ("", "ipvs"):
            raise self.error("mode", f"{mode!r}: ipvsproxy only programs IPVS; a file for it "
                                     "says mode: ipvs (or leaves mode empty)")

    def bind_address_is_v6(self) -> bool:
        """kube-proxy takes bindAddress as the node's primary IP; ipvsproxy reads the node's IPs
        from its Node object. Only the family still matters, for the healthz/metrics default."""
        text = self.fields.get("bindAddress", "").strip()
        if not text:
            return False
        try:
            ip = ip_address(text)
        except ValueError:
            raise self.error("bindAddress", f"{text!r} is not an IP address") from None
        if not ip.is_unspecified:
            self.warn("bindAddress", f"{text!r} is ignored: ipvsproxy takes the node's IPs "
                                     "from its Node object")
        return ip.version == 6

    def check_detect_local(self) -> None:
        mode = self.fields.get("detectLocalMode", "")
        if mode in ("", "ClusterCIDR"):
            return
        if mode not in DETECT_LOCAL_MODES:
            raise self.error("detectLocalMode",
                             f"{mode!r} is not one of {', '.join(DETECT_LOCAL_MODES)}")
        self.warn("detectLocalMode", f"{mode!r} is not supported: ipvsproxy tells local traffic "
                                     "by clusterCIDR (as detectLocalMode: ClusterCIDR)")

    def chosen(self, field: str) -> bool:
        """Whether an unsupported field holds someone's choice: neither its zero value nor
        kube-proxy's default."""
        value = self.fields[field]
        if _is_zero(value):
            return False
        default = UPSTREAM_DEFAULTS.get(field)
        if default is None:
            return True
        if isinstance(value, str) and isinstance(default, str) and go_duration(default):
            return go_duration(value) != go_duration(default)  # "24h" is "24h0m0s"
        return bool(value != default)


class _Loader(yaml.SafeLoader):
    """yaml.SafeLoader that notes keys given twice in one mapping (kube-proxy's strict decoder
    refuses them and its lenient one keeps the last, as PyYAML does)."""

    def __init__(self, stream: str) -> None:
        super().__init__(stream)
        self.duplicates: list[tuple[str, int]] = []

    def construct_mapping(self, node: yaml.MappingNode, deep: bool = False
                          ) -> dict[Hashable, Any]:
        seen: set[str] = set()
        for key_node, _ in node.value:
            if isinstance(key_node, yaml.ScalarNode):
                if key_node.value in seen:
                    self.duplicates.append((key_node.value, key_node.start_mark.line + 1))
                seen.add(key_node.value)
        return super().construct_mapping(node, deep=deep)


def _duration_text(text: str) -> str | None:
    """A file duration as --flag text: as written when config.duration reads it the same (it
    knows ms, s, m and h), else as a number of seconds; None for zero (not set)."""
    seconds = go_duration(text)
    if not seconds:
        return None
    try:
        if abs(duration(text, "") - seconds) < 1e-9:
            return text.strip()
    except ConfigError:
        pass
    return repr(seconds)


def _parse_error(exc: Exception) -> str:
    """PyYAML's message without the quoted source it appends; json's is one line already."""
    if isinstance(exc, yaml.MarkedYAMLError) and exc.problem_mark is not None:
        mark = exc.problem_mark
        what = " ".join(filter(None, (exc.context, exc.problem)))
        return f"line {mark.line + 1}, column {mark.column + 1}: {what}"
    return " ".join(str(exc).split())


def _bare_ip(text: str) -> bool:
    """An IP address without a port ("10.0.0.1", "fd00::1", "[fd00::1]")."""
    try:
        ip_address(text[1:-1] if text.startswith("[") and text.endswith("]") else text)
    except ValueError:
        return False
    return True


def _type_ok(kind: Kind, value: Any) -> bool:
    match kind:
        case "str" | "duration":
            return isinstance(value, str)
        case "bool":
            return isinstance(value, bool)
        case "int":
            return isinstance(value, int) and not isinstance(value, bool)
        case "number":
            return isinstance(value, int | float) and not isinstance(value, bool)
        case "strings":
            return isinstance(value, list)
        case "boolmap":
            return isinstance(value, dict) and all(
                isinstance(k, str) and isinstance(b, bool) for k, b in value.items())
        case "object":
            return isinstance(value, dict)
    return True  # "any"


def _is_zero(value: Any) -> bool:
    """Go's zero value, as a generated file writes it for a field nobody set."""
    if value is None or value is False or value == 0:
        return True
    if isinstance(value, str):
        return not value or go_duration(value) == 0  # "", "0", "0s"
    if isinstance(value, dict):
        return all(_is_zero(v) for v in value.values())
    if isinstance(value, list):
        return all(_is_zero(v) for v in value)
    return False


def _show(value: Any) -> str:
    """A value for a message: YAML-ish scalars, short lists and mappings as JSON."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, list | dict):
        text = json.dumps(value, default=str)
        if len(text) <= 60:
            return text
        return "a mapping" if isinstance(value, dict) else "a list"
    return repr(value) if isinstance(value, str) else str(value)
