"""`run --config`: a KubeProxyConfiguration file read into flag values
(ipvsproxy/settings/kpconfig.py), on its own and through run._config, where the command line wins
over the file and the file over the flags' defaults."""

from __future__ import annotations

import argparse
import dataclasses
import json
import re
from ipaddress import ip_network
from pathlib import Path
from typing import Any

import pytest
import yaml

from ipvsproxy.commands import run
from ipvsproxy.settings.config import Config, ConfigError, add_daemon_flags, add_proxy_flags
from ipvsproxy.settings.kpconfig import defaults_from_file, go_duration
from ipvsproxy.settings.kpschema import (
    IGNORED,
    MAPPED,
    SCHEMA,
    SPECIAL,
    UNSUPPORTED,
    UPSTREAM_DEFAULTS,
)

# config.conf of the kube-system/kube-proxy ConfigMap as kubeadm (1.29-1.31) writes it, with
# `mode: ipvs` and a pod subnet given to `kubeadm init`: every field spelt out, most at zero.
KUBEADM = """\
apiVersion: kubeproxy.config.k8s.io/v1alpha1
bindAddress: 0.0.0.0
bindAddressHardFail: false
clientConnection:
  acceptContentTypes: ""
  burst: 0
  contentType: ""
  kubeconfig: /var/lib/kube-proxy/kubeconfig.conf
  qps: 0
clusterCIDR: 10.244.0.0/16
configSyncPeriod: 0s
conntrack:
  maxPerCore: null
  min: null
  tcpBeLiberal: false
  tcpCloseWaitTimeout: null
  tcpEstablishedTimeout: null
  udpStreamTimeout: 0s
  udpTimeout: 0s
detectLocal:
  bridgeInterface: ""
  interfaceNamePrefix: ""
detectLocalMode: ""
enableProfiling: false
healthzBindAddress: ""
hostnameOverride: ""
iptables:
  localhostNodePorts: null
  masqueradeAll: false
  masqueradeBit: null
  minSyncPeriod: 0s
  syncPeriod: 0s
ipvs:
  excludeCIDRs: null
  minSyncPeriod: 0s
  scheduler: ""
  strictARP: false
  syncPeriod: 0s
  tcpFinTimeout: 0s
  tcpTimeout: 0s
  udpTimeout: 0s
kind: KubeProxyConfiguration
logging:
  flushFrequency: 0
  options:
    json:
      infoBufferSize: "0"
    text:
      infoBufferSize: "0"
  verbosity: 0
metricsBindAddress: ""
mode: ipvs
nftables:
  masqueradeAll: false
  masqueradeBit: null
  minSyncPeriod: 0s
  syncPeriod: 0s
nodePortAddresses: null
oomScoreAdj: null
portRange: ""
showHiddenMetricsForVersion: ""
winkernel:
  enableDSR: false
  forwardHealthCheckVip: false
  networkName: ""
  rootHnsEndpointName: ""
  sourceVip: ""
"""

# What `kube-proxy --write-config-to` writes: upstream's defaults spelt out (defaults.go).
WRITTEN_BY_KUBE_PROXY = """\
apiVersion: kubeproxy.config.k8s.io/v1alpha1
bindAddress: 0.0.0.0
bindAddressHardFail: false
clientConnection:
  acceptContentTypes: ""
  burst: 10
  contentType: application/vnd.kubernetes.protobuf
  kubeconfig: ""
  qps: 5
clusterCIDR: ""
configSyncPeriod: 15m0s
conntrack:
  maxPerCore: 32768
  min: 131072
  tcpBeLiberal: false
  tcpCloseWaitTimeout: 1h0m0s
  tcpEstablishedTimeout: 24h0m0s
  udpStreamTimeout: 0s
  udpTimeout: 0s
detectLocalMode: ClusterCIDR
enableProfiling: false
healthzBindAddress: 0.0.0.0:10256
hostnameOverride: ""
iptables:
  localhostNodePorts: true
  masqueradeAll: false
  masqueradeBit: 14
  minSyncPeriod: 1s
  syncPeriod: 30s
ipvs:
  excludeCIDRs: null
  minSyncPeriod: 0s
  scheduler: ""
  strictARP: false
  syncPeriod: 30s
  tcpFinTimeout: 0s
  tcpTimeout: 0s
  udpTimeout: 0s
kind: KubeProxyConfiguration
logging:
  flushFrequency: 5s
  format: text
  options:
    json:
      infoBufferSize: "0"
    text:
      infoBufferSize: "0"
  verbosity: 0
metricsBindAddress: 127.0.0.1:10249
mode: ipvs
nftables:
  masqueradeAll: false
  masqueradeBit: 14
  minSyncPeriod: 1s
  syncPeriod: 30s
nodePortAddresses: null
oomScoreAdj: -999
portRange: ""
showHiddenMetricsForVersion: ""
"""

HEAD = "apiVersion: kubeproxy.config.k8s.io/v1alpha1\nkind: KubeProxyConfiguration\n"


@pytest.fixture
def write(tmp_path: Path) -> Any:
    def write(text: str, name: str = "config.conf") -> str:
        p = tmp_path / name
        p.write_text(text)
        return str(p)
    return write


def read(write: Any, body: dict[str, Any] | str) -> tuple[dict[str, Any], list[str]]:
    """defaults_from_file of a file with the given fields (a dict, or YAML text) under HEAD."""
    text = body if isinstance(body, str) else yaml.safe_dump(body)
    return defaults_from_file(write(HEAD + text))


def error(write: Any, body: dict[str, Any] | str) -> str:
    with pytest.raises(ConfigError) as exc:
        read(write, body)
    return str(exc.value)


def run_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser()
    run.add_arguments(p)
    return p


def run_config(argv: list[str]) -> tuple[Config, argparse.Namespace]:
    argv = ["--ip-families", "4", "--hostname-override", "node-a", *argv]
    args = run_parser().parse_args(argv)
    args.argv = argv  # as cli.main records it
    return run._config(args), args


# -- the kubeadm file ------------------------------------------------------------------------


def test_kubeadm_file_gives_its_cluster_cidr_and_kubeconfig_and_no_warnings(write: Any) -> None:
    values, warnings = defaults_from_file(write(KUBEADM))
    assert values == {"cluster_cidr": "10.244.0.0/16",
                      "kubeconfig": "/var/lib/kube-proxy/kubeconfig.conf"}
    assert warnings == []


def test_kubeadm_file_as_json_reads_the_same(write: Any) -> None:
    doc = yaml.safe_load(KUBEADM)
    assert defaults_from_file(write(json.dumps(doc, indent=2), "config.json")) == \
        defaults_from_file(write(KUBEADM))


def test_kubeadm_file_through_run_config_is_the_defaults_plus_its_cluster_cidr(
        write: Any, capsys: pytest.CaptureFixture[str]) -> None:
    cfg, args = run_config(["--config", write(KUBEADM)])
    plain, _ = run_config([])
    assert cfg == dataclasses.replace(plain, cluster_cidrs=(ip_network("10.244.0.0/16"),))
    assert args.kubeconfig == "/var/lib/kube-proxy/kubeconfig.conf"
    assert capsys.readouterr().err == ""


def test_a_file_of_kube_proxys_own_defaults_changes_nothing_and_warns_of_nothing(
        write: Any) -> None:
    values, warnings = defaults_from_file(write(WRITTEN_BY_KUBE_PROXY))
    assert warnings == []
    assert run_config(["--config", write(WRITTEN_BY_KUBE_PROXY)])[0] == run_config([])[0]
    assert values["ipvs_sync_period"] == "30s"


# -- every mapped field reaches its flag ----------------------------------------------------

MAPPED_CASES: list[tuple[dict[str, Any], str, Any]] = [
    ({"hostnameOverride": "Node-A "}, "hostname_override", "Node-A"),
    ({"clusterCIDR": "10.244.0.0/16,fd00:10:244::/56"}, "cluster_cidr",
     "10.244.0.0/16,fd00:10:244::/56"),
    ({"healthzBindAddress": "0.0.0.0:10256"}, "healthz_bind_address", "0.0.0.0:10256"),
    ({"healthzBindAddress": "10.0.0.5"}, "healthz_bind_address", "10.0.0.5:10256"),
    ({"healthzBindAddress": "fd00::5"}, "healthz_bind_address", "[fd00::5]:10256"),
    ({"metricsBindAddress": "0.0.0.0:10249"}, "metrics_bind_address", "0.0.0.0:10249"),
    ({"metricsBindAddress": "::"}, "metrics_bind_address", "[::]:10249"),
    ({"metricsBindAddress": "[fd00::5]"}, "metrics_bind_address", "[fd00::5]:10249"),
    ({"metricsBindAddress": "[fd00::5]:9100"}, "metrics_bind_address", "[fd00::5]:9100"),
    ({"nodePortAddresses": ["192.168.0.0/16", "fd00::/64"]}, "nodeport_addresses",
     "192.168.0.0/16,fd00::/64"),
    ({"nodePortAddresses": ["primary"]}, "nodeport_addresses", "primary"),
    ({"nodePortAddresses": ["all"]}, "nodeport_addresses", "0.0.0.0/0,::/0"),
    ({"iptables": {"masqueradeAll": True}}, "masquerade_all", True),
    ({"iptables": {"masqueradeBit": 15}}, "iptables_masquerade_bit", 15),
    ({"iptables": {"masqueradeBit": 0}}, "iptables_masquerade_bit", 0),
    ({"ipvs": {"scheduler": "wrr"}}, "ipvs_scheduler", "wrr"),
    ({"ipvs": {"syncPeriod": "1m0s"}}, "ipvs_sync_period", "1m0s"),
    ({"ipvs": {"minSyncPeriod": "5s"}}, "ipvs_min_sync_period", "5s"),
    ({"ipvs": {"excludeCIDRs": ["10.99.0.0/16", "10.98.0.1/32"]}}, "ipvs_exclude_cidrs",
     "10.99.0.0/16,10.98.0.1/32"),
    ({"ipvs": {"strictARP": True}}, "ipvs_strict_arp", True),
    ({"ipvs": {"tcpTimeout": "15m0s"}}, "ipvs_tcp_timeout", "15m0s"),
    ({"ipvs": {"tcpFinTimeout": "30s"}}, "ipvs_tcpfin_timeout", "30s"),
    ({"ipvs": {"udpTimeout": "300ms"}}, "ipvs_udp_timeout", "300ms"),
    ({"clientConnection": {"kubeconfig": "/etc/kp.conf"}}, "kubeconfig", "/etc/kp.conf"),
]


@pytest.mark.parametrize(("body", "dest", "value"), MAPPED_CASES,
                         ids=[f"{c[1]}={c[2]}" for c in MAPPED_CASES])
def test_each_mapped_field_reaches_its_flag(write: Any, body: dict[str, Any], dest: str,
                                            value: Any) -> None:
    values, warnings = read(write, body)
    assert values == {dest: value}
    assert type(values[dest]) is type(value)  # what argparse would store: str, int or bool
    assert warnings == []


def test_the_cases_cover_the_whole_table() -> None:
    assert {c[1] for c in MAPPED_CASES} == set(MAPPED.values())


def test_every_flag_has_its_field_or_is_known_to_have_none() -> None:
    p = argparse.ArgumentParser()
    add_proxy_flags(p)
    add_daemon_flags(p)
    flags = {a.dest for a in p._actions} - {"help"}
    no_field = {"ip_families", "ipvs_graceful_termination_period", "service_metrics",
                "service_cluster_ip_range", "external_ip_cidrs", "node_network_cidrs",
                "max_objects_per_service", "adopt_kube_proxy"}
    assert flags - no_field == set(MAPPED.values()) - {"kubeconfig"}
    run_dests = {a.dest for a in run_parser()._actions}
    assert set(MAPPED.values()) <= run_dests  # run._config can setattr every one


def test_every_field_of_the_schema_is_mapped_special_unsupported_or_ignored() -> None:
    leaves = {f for f, kind in SCHEMA.items() if kind != "object"}
    tables = [set(MAPPED), set(SPECIAL), set(UNSUPPORTED), set(IGNORED)]
    assert set().union(*tables) == leaves
    assert sum(len(t) for t in tables) == len(leaves)  # in exactly one
    assert set(UPSTREAM_DEFAULTS) <= set(UNSUPPORTED)
    for f in leaves:  # every parent of a field is a struct of the schema
        parent = f.rpartition(".")[0]
        assert not parent or SCHEMA[parent] == "object"


def test_zero_values_set_nothing(write: Any) -> None:
    body = {"hostnameOverride": "", "clusterCIDR": " ", "healthzBindAddress": "",
            "metricsBindAddress": "", "nodePortAddresses": [],
            "iptables": {"masqueradeAll": False, "masqueradeBit": None},
            "ipvs": {"scheduler": "", "syncPeriod": "0s", "minSyncPeriod": "0",
                     "excludeCIDRs": [], "strictARP": False, "tcpTimeout": "0s",
                     "tcpFinTimeout": "0m0s", "udpTimeout": "0s"},
            "clientConnection": {"kubeconfig": ""}}
    assert read(write, body) == ({}, [])


# -- durations ------------------------------------------------------------------------------


@pytest.mark.parametrize(("text", "seconds"), [
    ("0", 0.0), ("0s", 0.0), ("30s", 30.0), ("1m0s", 60.0), ("1h30m", 5400.0),
    ("250ms", 0.25), ("1.5s", 1.5), (".5s", 0.5), ("500us", 0.0005), ("2µs", 2e-6),
    ("-1s", -1.0), ("+2m", 120.0), ("30", None), ("1d", None), ("", None), ("s", None),
    ("1m 30s", None),
])
def test_go_duration_parses_as_time_parse_duration(text: str, seconds: float | None) -> None:
    got = go_duration(text)
    assert got == pytest.approx(seconds) if seconds is not None else got is None


def test_durations_config_py_cannot_read_become_seconds(write: Any) -> None:
    values, _ = read(write, {"ipvs": {"syncPeriod": ".5s", "tcpTimeout": "1500000us"}})
    assert values == {"ipvs_sync_period": "0.5", "ipvs_tcp_timeout": "1.5"}


@pytest.mark.parametrize(("value", "problem"), [
    ("-5s", "must not be negative"), ("30", "is not a duration"),
    ("soon", "is not a duration"), (30, 'expected a duration string such as "30s"'),
])
def test_bad_durations_name_the_field(write: Any, value: Any, problem: str) -> None:
    msg = error(write, {"ipvs": {"syncPeriod": value}})
    assert "ipvs.syncPeriod: " in msg and problem in msg


# -- the command line wins over the file, the file over the defaults ---------------------

FILE = HEAD + """\
mode: ipvs
clusterCIDR: 10.244.0.0/16
iptables: {masqueradeAll: true, masqueradeBit: 15}
ipvs:
  scheduler: wrr
  syncPeriod: 1m0s
  minSyncPeriod: 2s
  strictARP: true
  tcpTimeout: 15m
  excludeCIDRs: [10.99.0.0/16]
healthzBindAddress: 0.0.0.0
metricsBindAddress: 0.0.0.0:10249
nodePortAddresses: [primary]
clientConnection: {kubeconfig: /var/lib/kube-proxy/kubeconfig.conf}
"""


def test_file_values_win_over_the_flag_defaults(write: Any) -> None:
    cfg, args = run_config(["--config", write(FILE)])
    assert (cfg.scheduler, cfg.sync_period, cfg.min_sync_period) == ("wrr", 60.0, 2.0)
    assert cfg.masquerade_all is True and cfg.strict_arp is True
    assert cfg.masquerade_bit == 15 and cfg.masq_mark == "0x8000"
    assert cfg.tcp_timeout == 900
    assert [str(n) for n in cfg.cluster_cidrs] == ["10.244.0.0/16"]
    assert [str(n) for n in cfg.exclude_cidrs] == ["10.99.0.0/16"]
    assert cfg.nodeport_primary is True
    assert cfg.healthz_bind_address == "0.0.0.0:10256"
    assert cfg.metrics_bind_address == "0.0.0.0:10249"
    assert args.kubeconfig == "/var/lib/kube-proxy/kubeconfig.conf"


def test_flags_given_on_the_command_line_win_over_the_file(write: Any) -> None:
    cfg, args = run_config([
        "--config", write(FILE), "--ipvs-scheduler", "lc", "--ipvs-sync-period", "10s",
        "--ipvs-min-sync-period", "500ms", "--iptables-masquerade-bit", "16",
        "--cluster-cidr", "10.0.0.0/8", "--ipvs-tcp-timeout", "1h",
        "--nodeport-addresses", "192.168.0.0/16", "--kubeconfig", "/root/.kube/config",
        "--metrics-bind-address", "127.0.0.1:9999",
    ])
    assert (cfg.scheduler, cfg.sync_period, cfg.min_sync_period) == ("lc", 10.0, 0.5)
    assert cfg.masquerade_bit == 16 and cfg.tcp_timeout == 3600
    assert [str(n) for n in cfg.cluster_cidrs] == ["10.0.0.0/8"]
    assert [str(n) for n in cfg.nodeport_addresses] == ["192.168.0.0/16"]
    assert cfg.nodeport_primary is False
    assert cfg.metrics_bind_address == "127.0.0.1:9999"
    assert args.kubeconfig == "/root/.kube/config"
    # what the command line left alone still comes from the file
    assert cfg.masquerade_all is True and [str(n) for n in cfg.exclude_cidrs] == ["10.99.0.0/16"]


def test_a_typed_flag_wins_even_when_it_says_the_default(write: Any) -> None:
    cfg, _ = run_config(["--config", write(FILE), "--ipvs-scheduler", "rr"])
    file_only, _ = run_config(["--config", write(FILE)])
    assert file_only.scheduler != "rr" and cfg.scheduler == "rr"


def test_without_the_file_the_defaults_stay(write: Any) -> None:
    cfg, args = run_config([])
    assert (cfg.scheduler, cfg.sync_period, cfg.min_sync_period) == ("rr", 30.0, 1.0)
    assert cfg.masquerade_all is False and cfg.masquerade_bit == 14
    assert args.kubeconfig is None


def test_run_config_prints_the_warnings_and_raises_the_errors(
        write: Any, capsys: pytest.CaptureFixture[str]) -> None:
    run_config(["--config", write(HEAD + "oomScoreAdj: -500\n")])
    err = capsys.readouterr().err
    assert err.startswith("ipvsproxy run: warning: ") and "oomScoreAdj" in err
    with pytest.raises(ConfigError, match=r"config.conf: ipvs\.scheduler: expected a string"):
        run_config(["--config", write(HEAD + "ipvs: {scheduler: [rr]}\n")])


def test_a_file_value_from_validates_as_the_flag_would(write: Any) -> None:
    # min > sync is a cross-field rule of from_args; the file cannot get around it
    with pytest.raises(ConfigError, match="--ipvs-min-sync-period"):
        run_config(["--config", write(HEAD + "ipvs: {syncPeriod: 5s, minSyncPeriod: 10s}\n")])


# -- files that cannot be used --------------------------------------------------------------


def test_wrong_api_version_or_kind(write: Any) -> None:
    for text, field in [
        ("apiVersion: kubeproxy.config.k8s.io/v1beta1\nkind: KubeProxyConfiguration\n",
         "apiVersion"),
        ("apiVersion: kubeproxy.config.k8s.io/v1alpha1\nkind: KubeletConfiguration\n", "kind"),
        ("kind: KubeProxyConfiguration\n", "apiVersion"),
        ("apiVersion: kubeproxy.config.k8s.io/v1alpha1\n", "kind"),
    ]:
        path = write(text)
        with pytest.raises(ConfigError, match=f"^{re.escape(path)}: {field}: "):
            defaults_from_file(path)


@pytest.mark.parametrize(("text", "problem"), [
    ("mode: ipvs\n  bad: [indent\n", "not valid YAML or JSON"),
    ('{"apiVersion": "x",}', "not valid YAML or JSON"),
    ("", "holds no mapping"),
    ("- a\n- b\n", "holds no mapping"),
    ("a: 1\n---\nb: 2\n", "not valid YAML or JSON"),
])
def test_unparsable_files_name_the_file(write: Any, text: str, problem: str) -> None:
    path = write(text)
    with pytest.raises(ConfigError, match=f"^{re.escape(path)}: .*{problem}"):
        defaults_from_file(path)


def test_a_missing_file_names_the_file(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=r"nope\.yaml: cannot read it"):
        defaults_from_file(str(tmp_path / "nope.yaml"))


@pytest.mark.parametrize(("body", "field", "problem"), [
    ({"clusterCIDR": ["10.244.0.0/16"]}, "clusterCIDR", "expected a string, got"),
    ({"hostnameOverride": 12}, "hostnameOverride", "expected a string, got 12"),
    ({"ipvs": {"strictARP": "true"}}, "ipvs.strictARP", "expected true or false"),
    ({"iptables": {"masqueradeAll": 1}}, "iptables.masqueradeAll", "expected true or false"),
    ({"iptables": {"masqueradeBit": "14"}}, "iptables.masqueradeBit", "expected an integer"),
    ({"iptables": {"masqueradeBit": True}}, "iptables.masqueradeBit", "expected an integer"),
    ({"ipvs": ["rr"]}, "ipvs", "expected a mapping"),
    ({"ipvs": {"excludeCIDRs": "10.0.0.0/8"}}, "ipvs.excludeCIDRs", "expected a list"),
    ({"ipvs": {"excludeCIDRs": ["10.0.0.0/8", 7]}}, "ipvs.excludeCIDRs[1]", "expected a string"),
    ({"nodePortAddresses": "primary"}, "nodePortAddresses", "expected a list of strings"),
    ({"featureGates": {"Foo": "on"}}, "featureGates", "expected a map of names to true"),
    # fields ipvsproxy does not use are type-checked too: kube-proxy refuses these files
    ({"conntrack": {"maxPerCore": "lots"}}, "conntrack.maxPerCore", "expected an integer"),
    ({"clientConnection": {"qps": "5"}}, "clientConnection.qps", "expected a number"),
])
def test_wrong_types_name_the_field(write: Any, body: dict[str, Any], field: str,
                                    problem: str) -> None:
    msg = error(write, body)
    assert f"config.conf: {field}: {problem}" in msg


@pytest.mark.parametrize(("body", "field", "problem"), [
    ({"mode": "iptables"}, "mode", "'iptables': ipvsproxy only programs IPVS"),
    ({"mode": "nftables"}, "mode", "'nftables'"),
    ({"mode": "IPVS"}, "mode", "'IPVS'"),  # upstream compares exactly too
    ({"iptables": {"masqueradeBit": 32}}, "iptables.masqueradeBit", "32 is not within 0..31"),
    ({"iptables": {"masqueradeBit": -1}}, "iptables.masqueradeBit", "not within 0..31"),
    ({"clusterCIDR": "10.244.0.0/16,10.245.0.0/16"}, "clusterCIDR", "one CIDR per IP family"),
    ({"clusterCIDR": "10.244.0.0/33"}, "clusterCIDR", "'10.244.0.0/33' is not a CIDR"),
    ({"ipvs": {"excludeCIDRs": ["10.0.0.0/8", "ten"]}}, "ipvs.excludeCIDRs[1]",
     "'ten' is not a CIDR"),
    ({"nodePortAddresses": ["primary", "10.0.0.0/8"]}, "nodePortAddresses",
     "'primary' cannot be combined"),
    ({"nodePortAddresses": ["10.0.0.0/8", "eth0"]}, "nodePortAddresses[1]",
     "'eth0' is not a CIDR, 'primary', 'all' or 'localhost'"),
    ({"healthzBindAddress": "localhost:10256"}, "healthzBindAddress", "is not IP:PORT"),
    ({"healthzBindAddress": ":10256"}, "healthzBindAddress", "is not IP:PORT"),
    ({"healthzBindAddress": "fd00::1]:10256"}, "healthzBindAddress", "is not IP:PORT"),
    ({"metricsBindAddress": "0.0.0.0:99999"}, "metricsBindAddress", "is not IP:PORT"),
    ({"metricsBindAddress": "0.0.0.0:0"}, "metricsBindAddress", "is not IP:PORT"),
    ({"metricsBindAddress": "0.0.0.0:http"}, "metricsBindAddress", "is not IP:PORT"),
    ({"bindAddress": "node-a"}, "bindAddress", "'node-a' is not an IP address"),
    ({"detectLocalMode": "PodCIDR"}, "detectLocalMode", "'PodCIDR' is not one of ClusterCIDR"),
])
def test_bad_values_name_the_field(write: Any, body: dict[str, Any], field: str,
                                   problem: str) -> None:
    msg = error(write, body)
    assert f"config.conf: {field}: " in msg and problem in msg


# -- warnings -------------------------------------------------------------------------------


@pytest.mark.parametrize(("body", "field"), [
    ({"conntrack": {"maxPerCore": 65536}}, "conntrack.maxPerCore"),
    ({"conntrack": {"tcpEstablishedTimeout": "1h"}}, "conntrack.tcpEstablishedTimeout"),
    ({"conntrack": {"tcpBeLiberal": True}}, "conntrack.tcpBeLiberal"),
    ({"featureGates": {"SomeGate": True}}, "featureGates"),
    ({"oomScoreAdj": -500}, "oomScoreAdj"),
    ({"clientConnection": {"qps": 50, "burst": 100}}, "clientConnection.qps"),
    ({"logging": {"verbosity": 4}}, "logging.verbosity"),
    ({"logging": {"format": "json"}}, "logging.format"),
    ({"enableProfiling": True}, "enableProfiling"),
    ({"configSyncPeriod": "5m"}, "configSyncPeriod"),
    ({"detectLocalMode": "NodeCIDR"}, "detectLocalMode"),
    ({"detectLocalMode": "InterfaceNamePrefix", "detectLocal": {"interfaceNamePrefix": "veth"}},
     "detectLocal.interfaceNamePrefix"),
    ({"bindAddress": "192.168.1.10"}, "bindAddress"),
    ({"udpIdleTimeout": "1s"}, "udpIdleTimeout"),
])
def test_fields_ipvsproxy_does_not_support_give_a_warning_naming_them(
        write: Any, body: dict[str, Any], field: str) -> None:
    values, warnings = read(write, body)
    assert values == {}
    assert any(f"config.conf: {field}: " in w and ("ignored" in w or "not supported" in w)
               for w in warnings), warnings


def test_unsupported_fields_at_kube_proxys_defaults_say_nothing(write: Any) -> None:
    body = {"conntrack": {"maxPerCore": 32768, "min": 131072,
                          "tcpEstablishedTimeout": "24h0m0s", "tcpCloseWaitTimeout": "1h"},
            "oomScoreAdj": -999, "configSyncPeriod": "15m0s", "detectLocalMode": "ClusterCIDR",
            "clientConnection": {"qps": 5.0, "burst": 10,
                                 "contentType": "application/vnd.kubernetes.protobuf"},
            "logging": {"format": "text", "flushFrequency": "5s", "verbosity": 0},
            "udpIdleTimeout": "250ms", "bindAddress": "::"}
    values, warnings = read(write, body)
    assert warnings == []
    # an IPv6 bindAddress moves kube-proxy's default healthz and metrics addresses to IPv6
    assert values == {"healthz_bind_address": "[::]:10256",
                      "metrics_bind_address": "[::1]:10249"}


def test_an_ipv6_bind_address_leaves_explicit_addresses_alone(write: Any) -> None:
    values, _ = read(write, {"bindAddress": "::", "healthzBindAddress": "0.0.0.0:10256"})
    assert values == {"healthz_bind_address": "0.0.0.0:10256",
                      "metrics_bind_address": "[::1]:10249"}


def test_fields_kube_proxy_ignores_in_ipvs_mode_are_ignored_silently(write: Any) -> None:
    body = {"iptables": {"syncPeriod": "10s", "minSyncPeriod": "2s", "localhostNodePorts": False},
            "nftables": {"masqueradeAll": True, "masqueradeBit": 3, "syncPeriod": "1m"},
            "winkernel": {"enableDSR": True, "networkName": "l2bridge"},
            "windowsRunAsService": True, "portRange": "30000-32767", "bindAddressHardFail": True}
    assert read(write, body) == ({}, [])


def test_unknown_fields_warn_as_kube_proxys_lenient_decoding_does(write: Any) -> None:
    body = {"ipvs": {"masqueradeAll": True, "scheduler": "lc"}, "futureField": {"x": 1},
            "clusterCIDR": "10.244.0.0/16"}
    values, warnings = read(write, body)
    assert values == {"ipvs_scheduler": "lc", "cluster_cidr": "10.244.0.0/16"}
    assert sorted(w.split(": ", 1)[1] for w in warnings) == [
        "futureField: unknown field, ignored (is it spelt right?)",
        "ipvs.masqueradeAll: unknown field, ignored (is it spelt right?)",
    ]


def test_a_key_given_twice_warns_and_the_last_one_counts(write: Any) -> None:
    values, warnings = read(write, "ipvs:\n  scheduler: rr\n  scheduler: sh\n")
    assert values == {"ipvs_scheduler": "sh"}
    assert warnings == [f"{warnings[0].split(':')[0]}: line 5: scheduler is given twice; "
                        "the last one counts"]
    path = write(json.dumps({"apiVersion": "kubeproxy.config.k8s.io/v1alpha1",
                             "kind": "KubeProxyConfiguration"})[:-1] + ', "mode": "", '
                 '"mode": "ipvs"}', "c.json")
    assert defaults_from_file(path)[1] == [f"{path}: mode is given twice; the last one counts"]


def test_localhost_node_port_addresses_warn_that_ipvs_mode_does_not_serve_them(
        write: Any) -> None:
    values, warnings = read(write, {"nodePortAddresses": ["localhost", "10.0.0.0/8"]})
    assert values == {"nodeport_addresses": "127.0.0.0/8,::1/128,10.0.0.0/8"}
    assert len(warnings) == 1 and "nodePortAddresses: 'localhost'" in warnings[0]


def test_empty_mode_is_taken_as_ipvs(write: Any) -> None:
    assert read(write, {"mode": "", "ipvs": {"scheduler": "sh"}}) == (
        {"ipvs_scheduler": "sh"}, [])
