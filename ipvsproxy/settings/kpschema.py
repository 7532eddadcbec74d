"""The KubeProxyConfiguration schema as tables: every v1alpha1 field and its type (`SCHEMA`),
the field -> flag table (`MAPPED`), the fields reported as not supported (`UNSUPPORTED`) with
kube-proxy's defaults for them (`UPSTREAM_DEFAULTS`), the fields ignored silently (`IGNORED`),
and the upstream defaults the translation fills in. Data only: kpconfig.py reads a file against
these tables and explains the decisions behind them.
"""

from __future__ import annotations

from typing import Literal

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

# Fields kpconfig.py checks with code of their own (they are not a value for one flag).
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
HEALTHZ = ("0.0.0.0", "[::]", 10256)
METRICS = ("127.0.0.1", "[::1]", 10249)
DETECT_LOCAL_MODES = ("ClusterCIDR", "NodeCIDR", "BridgeInterface", "InterfaceNamePrefix")
# nodePortAddresses keywords (types.go): 'primary' is ipvsproxy's own "primary" flag value;
# the others expand to the CIDRs they stand for.
NODEPORT_KEYWORDS = {"all": ("0.0.0.0/0", "::/0"), "localhost": ("127.0.0.0/8", "::1/128")}

KIND_TEXT: dict[str, str] = {
    "str": "a string", "bool": "true or false", "int": "an integer", "number": "a number",
    "duration": 'a duration string such as "30s" or "1m0s"', "strings": "a list of strings",
    "boolmap": "a map of names to true or false", "object": "a mapping",
}
