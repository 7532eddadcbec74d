"""kube-proxy's configuration file for `ipvsproxy run --config`: reads a KubeProxyConfiguration
(kubeproxy.config.k8s.io/v1alpha1, YAML or JSON, as kubeadm keeps it in the kube-system/kube-proxy
ConfigMap) and turns it into values for the flags of the same meaning.

Owns the file's schema (which fields kube-proxy knows, their types), the table from field to
flag (`MAPPED`), which fields are reported as not supported and which are ignored silently, and
the upstream defaulting rules the translation needs. It does not decide anything the flags decide:
`run._config` puts the values in place of flags left at their defaults (a flag given on the
command line wins), and `config.from_args` validates the result as for any command line.

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
--service-cluster-ip-range and --external-ip-cidrs (kube-proxy has neither: the service range is
the API server's setting, and ipvsproxy also reads it from the cluster's ServiceCIDR objects).
"""

from __future__ import annotations

import json
import re
from collections.abc import Hashable
from ipaddress import ip_address, ip_network
from pathlib import Path
from typing import Any, Literal

import yaml

from ipvsproxy.config import ConfigError, duration, parse_bind_address

API_VERSION = "kubeproxy.config.k8s.io/v1alpha1"
KIND = "KubeProxyConfiguration"

Value = str | int | bool
# How a field's value is type-checked, as Go's JSON decoder checks the v1alpha1 struct:
# "object" is a struct (its fields are listed below it), "any" is not checked (opaque subtrees
# and fields of older kube-proxy versions, which the current decoder does not know either).
Kind = Literal["str", "bool", "int", "number", "duration", "strings", "boolmap", "object", "any"]

# Every field of v1alpha1 KubeProxyConfiguration (types.go), by path.
SCHEMA: dict[str, Kind] = {
    "apiVersion": "str",
    "kind": "str",
    "featureGates": "boolmap",
    "clientConnection": "object",
    "clientConnection.kubeconfig": "str",
    "clientConnection.acceptContentTypes": "str",
    "clientConnection.contentType": "str",
    "clientConnection.qps": "number",
    "clientConnection.burst": "int",
    # component-base LoggingConfiguration; its options are a deep opaque tree
    "logging": "object",
    "logging.format": "str",
    "logging.flushFrequency": "any",  # a duration string or an int of nanoseconds
    "logging.verbosity": "int",
    "logging.vmodule": "any",
    "logging.options": "any",
    "hostnameOverride": "str",
    "bindAddress": "str",
    "healthzBindAddress": "str",
    "metricsBindAddress": "str",
    "bindAddressHardFail": "bool",
    "enableProfiling": "bool",
    "showHiddenMetricsForVersion": "str",
    "mode": "str",
    "iptables": "object",
    "iptables.masqueradeBit": "int",
    "iptables.masqueradeAll": "bool",
    "iptables.localhostNodePorts": "bool",
    "iptables.snatNodeInternalIP": "bool",
    "iptables.syncPeriod": "duration",
    "iptables.minSyncPeriod": "duration",
    "ipvs": "object",
    "ipvs.syncPeriod": "duration",
    "ipvs.minSyncPeriod": "duration",
    "ipvs.scheduler": "str",
    "ipvs.excludeCIDRs": "strings",
    "ipvs.strictARP": "bool",
    "ipvs.tcpTimeout": "duration",
    "ipvs.tcpFinTimeout": "duration",
    "ipvs.udpTimeout": "duration",
    "nftables": "object",
    "nftables.masqueradeBit": "int",
    "nftables.masqueradeAll": "bool",
    "nftables.syncPeriod": "duration",
    "nftables.minSyncPeriod": "duration",
    "winkernel": "object",
    "winkernel.networkName": "str",
    "winkernel.sourceVip": "str",
    "winkernel.enableDSR": "bool",
    "winkernel.rootHnsEndpointName": "str",
    "winkernel.forwardHealthCheckVip": "bool",
    "detectLocalMode": "str",
    "detectLocal": "object",
    "detectLocal.bridgeInterface": "str",
    "detectLocal.interfaceNamePrefix": "str",
    "clusterCIDR": "str",
    "nodePortAddresses": "strings",
    "oomScoreAdj": "int",
    "conntrack": "object",
    "conntrack.maxPerCore": "int",
    "conntrack.min": "int",
    "conntrack.tcpEstablishedTimeout": "duration",
    "conntrack.tcpCloseWaitTimeout": "duration",
    "conntrack.tcpBeLiberal": "bool",
    "conntrack.udpTimeout": "duration",
    "conntrack.udpStreamTimeout": "duration",
    "configSyncPeriod": "duration",
    "portRange": "str",
    "windowsRunAsService": "bool",
    # Removed from kube-proxy but still in files older versions generated (kubeadm <= 1.25
    # wrote `udpIdleTimeout: 0s`): known here so that a zero value stays quiet.
    "udpIdleTimeout": "any",
    "conntrack.max": "any",
    "resourceContainer": "any",
}

# The table: KubeProxyConfiguration field -> the argparse dest of the ipvsproxy flag of the same
# meaning. In IPVS mode kube-proxy takes its sync periods from ipvs.* and masqueradeAll and
# masqueradeBit from iptables.* (v1alpha1/conversion.go).
MAPPED: dict[str, str] = {
    "hostnameOverride": "hostname_override",
    "clusterCIDR": "cluster_cidr",
    "healthzBindAddress": "healthz_bind_address",
    "metricsBindAddress": "metrics_bind_address",
    "nodePortAddresses": "nodeport_addresses",
    "iptables.masqueradeAll": "masquerade_all",
    "iptables.masqueradeBit": "iptables_masquerade_bit",
    "ipvs.scheduler": "ipvs_scheduler",
    "ipvs.syncPeriod": "ipvs_sync_period",
    "ipvs.minSyncPeriod": "ipvs_min_sync_period",
    "ipvs.excludeCIDRs": "ipvs_exclude_cidrs",
    "ipvs.strictARP": "ipvs_strict_arp",
    "ipvs.tcpTimeout": "ipvs_tcp_timeout",
    "ipvs.tcpFinTimeout": "ipvs_tcpfin_timeout",
    "ipvs.udpTimeout": "ipvs_udp_timeout",
    # `run`'s --kubeconfig: kube-proxy uses in-cluster credentials when this is empty, as
    # ipvsproxy does without the flag.
    "clientConnection.kubeconfig": "kubeconfig",
}

# Fields checked by code of their own below (they are not a value for one flag).
SPECIAL = frozenset({"apiVersion", "kind", "mode", "bindAddress", "detectLocalMode"})

# Fields kube-proxy honours in IPVS mode and ipvsproxy does not: a warning when set.
UNSUPPORTED: dict[str, str] = {
    "featureGates": "ipvsproxy has no feature gates",
    "clientConnection.acceptContentTypes": "ipvsproxy's API client keeps its own settings",
    "clientConnection.contentType": "ipvsproxy's API client keeps its own settings",
    "clientConnection.qps": "ipvsproxy's API client keeps its own settings",
    "clientConnection.burst": "ipvsproxy's API client keeps its own settings",
    "logging.format": "logging is set by ipvsproxy's --log-format",
    "logging.flushFrequency": "ipvsproxy's logs are not buffered",
    "logging.verbosity": "logging is set by ipvsproxy's -v",
    "logging.vmodule": "logging is set by ipvsproxy's -v",
    "logging.options": "logging is set by ipvsproxy's --log-format",
    "enableProfiling": "ipvsproxy serves no /debug/pprof",
    "showHiddenMetricsForVersion": "ipvsproxy has no hidden metrics",
    "detectLocal.bridgeInterface": "ipvsproxy tells local traffic by clusterCIDR only",
    "detectLocal.interfaceNamePrefix": "ipvsproxy tells local traffic by clusterCIDR only",
    "iptables.snatNodeInternalIP": "ipvsproxy masquerades to the egress interface's address",
    "oomScoreAdj": "ipvsproxy leaves its OOM score alone",
    "conntrack.maxPerCore": "ipvsproxy does not tune conntrack",
    "conntrack.min": "ipvsproxy does not tune conntrack",
    "conntrack.tcpEstablishedTimeout": "ipvsproxy does not tune conntrack",
    "conntrack.tcpCloseWaitTimeout": "ipvsproxy does not tune conntrack",
    "conntrack.tcpBeLiberal": "ipvsproxy does not tune conntrack",
    "conntrack.udpTimeout": "ipvsproxy does not tune conntrack",
    "conntrack.udpStreamTimeout": "ipvsproxy does not tune conntrack",
    "configSyncPeriod": "ipvsproxy's watches have no periodic resync setting",
    "udpIdleTimeout": "removed from kube-proxy (it was for the userspace mode)",
    "conntrack.max": "removed from kube-proxy (see conntrack.maxPerCore)",
    "resourceContainer": "removed from kube-proxy",
}

# kube-proxy's defaults (defaults.go) of unsupported fields: a file written by
# `kube-proxy --write-config-to` spells them out, and they are nobody's choice either.
UPSTREAM_DEFAULTS: dict[str, object] = {
    "clientConnection.contentType": "application/vnd.kubernetes.protobuf",
    "clientConnection.qps": 5,
    "clientConnection.burst": 10,
    "logging.format": "text",
    "logging.flushFrequency": "5s",
    "oomScoreAdj": -999,
    "conntrack.maxPerCore": 32 * 1024,
    "conntrack.min": 128 * 1024,
    "conntrack.tcpEstablishedTimeout": "24h",
    "conntrack.tcpCloseWaitTimeout": "1h",
    "configSyncPeriod": "15m",
    "udpIdleTimeout": "250ms",
}

# Fields ignored without a word, because kube-proxy in IPVS mode on Linux ignores them too
# (or because ipvsproxy already behaves as they ask).
IGNORED: dict[str, str] = {
    "iptables.syncPeriod": "IPVS mode syncs on ipvs.syncPeriod",
    "iptables.minSyncPeriod": "IPVS mode syncs on ipvs.minSyncPeriod",
    "iptables.localhostNodePorts": "iptables mode only",
    "nftables.masqueradeBit": "nftables mode only",
    "nftables.masqueradeAll": "nftables mode only",
    "nftables.syncPeriod": "nftables mode only",
    "nftables.minSyncPeriod": "nftables mode only",
    "winkernel.networkName": "Windows only",
    "winkernel.sourceVip": "Windows only",
    "winkernel.enableDSR": "Windows only",
    "winkernel.rootHnsEndpointName": "Windows only",
    "winkernel.forwardHealthCheckVip": "Windows only",
    "windowsRunAsService": "Windows only",
    "portRange": "unused since the userspace mode was removed",
    "bindAddressHardFail": "ipvsproxy always exits when it cannot listen",
}

# Where healthz and metrics listen when the file leaves them empty (defaults.go
# getDefaultAddresses: by the family of bindAddress) and the port a bare IP gets.
_HEALTHZ = ("0.0.0.0", "[::]", 10256)
_METRICS = ("127.0.0.1", "[::1]", 10249)
_DETECT_LOCAL_MODES = ("ClusterCIDR", "NodeCIDR", "BridgeInterface", "InterfaceNamePrefix")
# nodePortAddresses keywords (types.go): 'primary' is ipvsproxy's own "primary" flag value;
# the others expand to the CIDRs they stand for.
_NODEPORT_KEYWORDS = {"all": ("0.0.0.0/0", "::/0"), "localhost": ("127.0.0.0/8", "::1/128")}

# Go's time.ParseDuration: an optional sign, then number-unit pairs, or a bare "0".
_GO_UNITS = {"ns": 1e-9, "us": 1e-6, "µs": 1e-6, "μs": 1e-6, "ms": 1e-3, "s": 1.0, "m": 60.0,
             "h": 3600.0}
_GO_PART = r"(\d+(?:\.\d*)?|\.\d+)(ns|us|µs|μs|ms|s|m|h)"
_GO_DURATION = re.compile(rf"[-+]?(?:0|(?:{_GO_PART})+)")

_KIND_TEXT: dict[str, str] = {
    "str": "a string", "bool": "true or false", "int": "an integer", "number": "a number",
    "duration": 'a duration string such as "30s" or "1m0s"', "strings": "a list of strings",
    "boolmap": "a map of names to true or false", "object": "a mapping",
}


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
            for dest, (_, host, port) in (("healthz_bind_address", _HEALTHZ),
                                          ("metrics_bind_address", _METRICS)):
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
            raise self.error(field, f"expected {_KIND_TEXT[kind]}, got {_show(value)}")
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
            if item in _NODEPORT_KEYWORDS:
                if item == "localhost":
                    self.warn(field, "'localhost': NodePorts are not served on loopback "
                                     "addresses in IPVS mode (kube-proxy does not either)")
                out.extend(_NODEPORT_KEYWORDS[item])
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
        port = _HEALTHZ[2] if field == "healthzBindAddress" else _METRICS[2]
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
        if mode not in _DETECT_LOCAL_MODES:
            raise self.error("detectLocalMode",
                             f"{mode!r} is not one of {', '.join(_DETECT_LOCAL_MODES)}")
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
