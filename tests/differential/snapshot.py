"""The kernel state a service proxy leaves, read, normalized and compared.

`read()` runs the operator's tools (inside the lab guest): `ipvsadm -Sn`, `ipset save`,
`iptables-save`/`ip6tables-save` of nat and filter, `ip -o addr show dev kube-ipvs0`,
`ip -d -o link show kube-ipvs0`, `ipvsadm -L --timeout` and the sysctls kube-proxy 1.35 sets
(pkg/proxy/ipvs/proxier.go NewProxier, cmd/kube-proxy/app/conntrack.go), and returns their text.
`normalize()` turns that text into a `Snapshot`: maps and sets, so that order that means
nothing (the order of virtual servers, of set members, of addresses) is gone, and order that
means something is kept: a chain's rules are compared as a sequence of runs, each run a maximal
block of consecutive rules with the same target, compared as a multiset (rules that give the
same verdict may be swapped without changing what a packet meets; a rule with another verdict
between them may not). Built-in chains keep only their jumps into KUBE-* and IPVSPROXY-*
chains, in order.

`compare(reference, candidate)` returns the differences grouped by kind (`KINDS`); the
reference is kube-proxy's snapshot, the candidate ipvsproxy's. Pure apart from `read()`.
"""

from __future__ import annotations

import re
import shlex
import subprocess
from collections import Counter
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from ipaddress import ip_address
from pathlib import Path
from typing import Any

# The sysctls kube-proxy 1.35 sets in IPVS mode (NewProxier) and on every Linux mode
# (conntrack.go setupConntrack), plus the ones older releases set, to see that nobody does.
SYSCTLS = (
    "net/ipv4/vs/conntrack",
    "net/ipv4/vs/conn_reuse_mode",
    "net/ipv4/vs/expire_nodest_conn",
    "net/ipv4/vs/expire_quiescent_template",
    "net/ipv4/ip_forward",
    "net/ipv4/conf/all/arp_ignore",
    "net/ipv4/conf/all/arp_announce",
    "net/ipv4/conf/all/route_localnet",
    "net/ipv6/conf/all/forwarding",
    "net/netfilter/nf_conntrack_max",
    "net/netfilter/nf_conntrack_tcp_timeout_established",
    "net/netfilter/nf_conntrack_tcp_timeout_close_wait",
    "net/netfilter/nf_conntrack_tcp_be_liberal",
    "net/netfilter/nf_conntrack_udp_timeout",
    "net/netfilter/nf_conntrack_udp_timeout_stream",
)
KINDS = ("ipvs service", "ipvs dest", "ipset type/options", "ipset member", "iptables rule",
         "address", "sysctl", "listener")
NODE_PORTS = range(30000, 32768)  # health-check node ports are listened on in this range
BUILTIN_CHAINS = frozenset({"INPUT", "OUTPUT", "FORWARD", "PREROUTING", "POSTROUTING"})
OWN_PREFIXES = ("KUBE-", "IPVSPROXY-")


# ------------------------------------------------------------------------------ reading


def _run(cmd: str) -> str:
    p = subprocess.run(cmd, shell=True, text=True, capture_output=True, check=False)
    return p.stdout if p.returncode == 0 else f"#error {p.returncode}: {p.stderr.strip()}\n"


def read() -> dict[str, str]:
    """The raw text of every source, by source name (run as root in the lab guest)."""
    raw = {
        "ipvs": _run("ipvsadm -Sn"),
        "ipset": _run("ipset save"),
        "iptables4": _run("iptables-save -t nat; iptables-save -t filter"),
        "iptables6": _run("ip6tables-save -t nat; ip6tables-save -t filter"),
        "addresses": _run("ip -o addr show dev kube-ipvs0 2>/dev/null || true"),
        "link": _run("ip -d -o link show kube-ipvs0 2>/dev/null || true"),
        "timeouts": _run("ipvsadm -L --timeout"),
        "listeners": _run("ss -Hltn"),
    }
    lines = []
    for s in SYSCTLS:
        path = Path("/proc/sys") / s
        try:
            lines.append(f"{s} = {path.read_text().strip()}")
        except OSError:
            lines.append(f"{s} = <absent>")
    raw["sysctls"] = "\n".join(lines) + "\n"
    return raw


def write_sysctls(values: Mapping[str, str]) -> None:
    """Put sysctls back (`<absent>` ones are skipped), e.g. to the boot values before each
    proxy runs, so that what each one sets shows."""
    for k, v in values.items():
        if v != "<absent>":
            path = Path("/proc/sys") / k
            if path.exists():
                path.write_text(v + "\n")


def sysctl_values(raw_sysctls: str) -> dict[str, str]:
    out = {}
    for line in raw_sysctls.splitlines():
        if " = " in line:
            k, v = line.split(" = ", 1)
            out[k.strip()] = v.strip()
    return out


# ------------------------------------------------------------------------------ normalized


@dataclass(frozen=True, slots=True)
class Snapshot:
    # "TCP 10.96.0.1:443" -> "-s rr -p 10800"
    ipvs_services: Mapping[str, str] = field(default_factory=dict)
    # "TCP 10.96.0.1:443 -> 10.244.1.5:8080" -> "-m -w 1"
    ipvs_dests: Mapping[str, str] = field(default_factory=dict)
    # set name -> "hash:ip,port family inet hashsize 1024 maxelem 65536" (initval dropped)
    ipset_types: Mapping[str, str] = field(default_factory=dict)
    ipset_members: Mapping[str, frozenset[str]] = field(default_factory=dict)
    # "v4 nat KUBE-SERVICES" -> runs (each a sorted tuple of rule texts), in chain order
    iptables: Mapping[str, tuple[tuple[str, ...], ...]] = field(default_factory=dict)
    addresses: frozenset[str] = frozenset()  # "10.96.0.1/32" on kube-ipvs0
    link: str = ""  # "absent" or "dummy DOWN" ...
    sysctls: Mapping[str, str] = field(default_factory=dict)  # also "ipvs timeout tcp" etc.
    errors: tuple[str, ...] = ()  # sources that could not be read
    # TCP ports listened on in the node port range: a daemon's health-check node ports
    listeners: frozenset[str] = frozenset()

    def is_clean(self) -> list[str]:
        """What a service proxy left in the kernel (empty when it left nothing)."""
        left = [f"virtual server {k}" for k in self.ipvs_services]
        left += [f"ipset {n}" for n in self.ipset_types if n.startswith(OWN_PREFIXES)]
        left += [f"chain {k}" for k, runs in self.iptables.items()
                 if k.split()[2] not in BUILTIN_CHAINS]
        left += [f"jump {r}" for k, runs in self.iptables.items()
                 if k.split()[2] in BUILTIN_CHAINS for run in runs for r in run]
        if self.link != "absent":
            left.append(f"kube-ipvs0 ({self.link})")
        return left + [f"unreadable: {e}" for e in self.errors]


def to_plain(s: Snapshot) -> dict[str, Any]:
    """A snapshot as JSON-able data (from_plain reads it back)."""
    return {"ipvs_services": dict(s.ipvs_services), "ipvs_dests": dict(s.ipvs_dests),
            "ipset_types": dict(s.ipset_types),
            "ipset_members": {k: sorted(v) for k, v in s.ipset_members.items()},
            "iptables": {k: [list(r) for r in v] for k, v in s.iptables.items()},
            "addresses": sorted(s.addresses), "link": s.link, "sysctls": dict(s.sysctls),
            "errors": list(s.errors), "listeners": sorted(s.listeners)}


def from_plain(d: Mapping[str, Any]) -> Snapshot:
    return Snapshot(dict(d["ipvs_services"]), dict(d["ipvs_dests"]), dict(d["ipset_types"]),
                    {k: frozenset(v) for k, v in d["ipset_members"].items()},
                    {k: tuple(tuple(r) for r in v) for k, v in d["iptables"].items()},
                    frozenset(d["addresses"]), d["link"], dict(d["sysctls"]),
                    tuple(d.get("errors", ())), frozenset(d.get("listeners", ())))


def _addr(text: str) -> str:
    """An address in canonical form (brackets off an IPv6 one)."""
    return str(ip_address(text.strip("[]")))


def _hostport(text: str) -> str:
    host, _, port = text.rpartition(":")
    a = ip_address(host.strip("[]"))
    return f"[{a}]:{port}" if a.version == 6 else f"{a}:{port}"


_PROTO = {"-t": "TCP", "--tcp-service": "TCP", "-u": "UDP", "--udp-service": "UDP",
          "--sctp-service": "SCTP", "-f": "FWM", "--fwmark-service": "FWM"}


def parse_ipvs(text: str) -> tuple[dict[str, str], dict[str, str]]:
    services: dict[str, str] = {}
    dests: dict[str, str] = {}
    for line in text.splitlines():
        words = line.split()
        if len(words) < 3 or words[0] not in ("-A", "-a"):
            continue
        proto = _PROTO[words[1]]
        vs = f"{proto} {words[2] if proto == 'FWM' else _hostport(words[2])}"
        rest = words[3:]
        if words[0] == "-A":
            services[vs] = " ".join(rest)
        else:
            i = rest.index("-r")
            rs = _hostport(rest[i + 1])
            dests[f"{vs} -> {rs}"] = " ".join(rest[:i] + rest[i + 2:])
    return services, dests


def parse_ipset(text: str) -> tuple[dict[str, str], dict[str, frozenset[str]]]:
    types: dict[str, str] = {}
    members: dict[str, set[str]] = {}
    for line in text.splitlines():
        words = line.split()
        if len(words) >= 3 and words[0] == "create":
            opts = words[2:]
            keep = []
            i = 0
            while i < len(opts):
                if opts[i] == "initval":  # random per set
                    i += 2
                    continue
                keep.append(opts[i])
                i += 1
            types[words[1]] = " ".join(keep)
            members.setdefault(words[1], set())
        elif len(words) >= 3 and words[0] == "add":
            members.setdefault(words[1], set()).add(" ".join(words[2:]))
    return types, {k: frozenset(v) for k, v in members.items()}


def _target(rule: str) -> str:
    """A rule's target with its options: what it does to a packet that matches."""
    words = shlex.split(rule)
    if "-j" in words:
        return " ".join(words[words.index("-j"):])
    if "-g" in words:
        return " ".join(words[words.index("-g"):])
    return ""


def runs_of(rules: Iterable[str]) -> tuple[tuple[str, ...], ...]:
    """Consecutive rules with the same target, each block as a sorted tuple."""
    out: list[list[str]] = []
    last = None
    for r in rules:
        t = _target(r)
        if out and t == last:
            out[-1].append(r)
        else:
            out.append([r])
        last = t
    return tuple(tuple(sorted(run)) for run in out)


def parse_iptables(text: str, family: int) -> dict[str, tuple[tuple[str, ...], ...]]:
    """Every KUBE-*/IPVSPROXY-* chain (declared ones too, even empty), and the jumps into one
    from a built-in chain (kept in order, as one run each)."""
    chains: dict[str, list[str]] = {}
    table = ""
    for line in text.splitlines():
        if line.startswith("*"):
            table = line[1:].strip()
        elif line.startswith(":"):
            name = line[1:].split()[0]
            if name.startswith(OWN_PREFIXES):
                chains.setdefault(f"v{family} {table} {name}", [])
        elif line.startswith("-A "):
            name = line.split()[1]
            key = f"v{family} {table} {name}"
            jump = name in BUILTIN_CHAINS and re.search(r" -[jg] (KUBE-|IPVSPROXY-)", line)
            if name.startswith(OWN_PREFIXES) or jump:
                chains.setdefault(key, []).append(line)
    out: dict[str, tuple[tuple[str, ...], ...]] = {}
    for key, rules in chains.items():
        if key.split()[2] in BUILTIN_CHAINS:
            out[key] = tuple((r,) for r in rules)
        else:
            out[key] = runs_of(rules)
    return out


def parse_addresses(text: str) -> frozenset[str]:
    out = set()
    for line in text.splitlines():
        m = re.search(r"\binet6? (\S+)", line)
        if m:
            addr, _, plen = m.group(1).partition("/")
            out.add(f"{_addr(addr)}/{plen}")
    return frozenset(out)


def parse_link(text: str) -> str:
    line = text.strip()
    if not line:
        return "absent"
    flags = re.search(r"<([^>]*)>", line)
    up = "UP" if flags and "UP" in flags.group(1).split(",") else "DOWN"
    kind = "dummy" if re.search(r"\bdummy\b", line) else "other"
    return f"{kind} {up}"


def parse_listeners(text: str) -> frozenset[str]:
    """`ss -Hltn` -> "tcp/31747" for each port in the node port range (both families and any
    bind address count as one: each proxy's health-check server listens where it likes)."""
    out = set()
    for line in text.splitlines():
        words = line.split()
        if len(words) >= 4:
            port = words[3].rpartition(":")[2]
            if port.isdigit() and int(port) in NODE_PORTS:
                out.add(f"tcp/{port}")
    return frozenset(out)


def parse_timeouts(text: str) -> dict[str, str]:
    m = re.search(r"Timeout \(tcp tcpfin udp\):\s*(\d+)\s+(\d+)\s+(\d+)", text)
    if not m:
        return {}
    return {"ipvs timeout tcp": m.group(1), "ipvs timeout tcpfin": m.group(2),
            "ipvs timeout udp": m.group(3)}


def normalize(raw: Mapping[str, str]) -> Snapshot:
    errors = tuple(f"{k}: {v.strip()}" for k, v in raw.items() if v.startswith("#error"))

    def text(k: str) -> str:
        v = raw.get(k, "")
        return "" if v.startswith("#error") else v

    services, dests = parse_ipvs(text("ipvs"))
    types, members = parse_ipset(text("ipset"))
    rules = parse_iptables(text("iptables4"), 4)
    rules.update(parse_iptables(text("iptables6"), 6))
    sysctls = sysctl_values(text("sysctls"))
    sysctls.update(parse_timeouts(text("timeouts")))
    return Snapshot(services, dests, types, members, rules, parse_addresses(text("addresses")),
                    parse_link(text("link")), sysctls, errors,
                    parse_listeners(text("listeners")))


# ------------------------------------------------------------------------------ compare


@dataclass(frozen=True, slots=True)
class Difference:
    kind: str  # one of KINDS
    key: str  # what differs: "TCP 10.96.0.1:443", "KUBE-CLUSTER-IP 10.96.0.1,tcp:443", ...
    reference: str | None  # kube-proxy's value; None: kube-proxy has none
    candidate: str | None  # ipvsproxy's value; None: ipvsproxy has none

    def __str__(self) -> str:
        if self.reference is None:
            return f"[{self.kind}] only ipvsproxy: {self.key} {self.candidate or ''}".rstrip()
        if self.candidate is None:
            return f"[{self.kind}] only kube-proxy: {self.key} {self.reference or ''}".rstrip()
        return (f"[{self.kind}] {self.key}: kube-proxy {self.reference!r}, "
                f"ipvsproxy {self.candidate!r}")


def _map_diff(kind: str, ref: Mapping[str, str], cand: Mapping[str, str]) -> list[Difference]:
    out = []
    for k in sorted(set(ref) | set(cand)):
        a, b = ref.get(k), cand.get(k)
        if a != b:
            out.append(Difference(kind, k, a, b))
    return out


def compare(ref: Snapshot, cand: Snapshot, listeners: bool = False,
            ) -> dict[str, list[Difference]]:
    """Differences by kind (only kinds that have some), reference = kube-proxy. `listeners`:
    compare the health-check node ports listened on too (when both ran as daemons)."""
    out: dict[str, list[Difference]] = {k: [] for k in KINDS}
    out["ipvs service"] = _map_diff("ipvs service", ref.ipvs_services, cand.ipvs_services)
    out["ipvs dest"] = _map_diff("ipvs dest", ref.ipvs_dests, cand.ipvs_dests)
    out["ipset type/options"] = _map_diff("ipset type/options", ref.ipset_types,
                                          cand.ipset_types)
    for name in sorted(set(ref.ipset_members) | set(cand.ipset_members)):
        a = ref.ipset_members.get(name, frozenset())
        b = cand.ipset_members.get(name, frozenset())
        out["ipset member"] += [Difference("ipset member", f"{name} {e}", "member", None)
                                for e in sorted(a - b)]
        out["ipset member"] += [Difference("ipset member", f"{name} {e}", None, "member")
                                for e in sorted(b - a)]
    for key in sorted(set(ref.iptables) | set(cand.iptables)):
        out["iptables rule"] += _chain_diff(key, ref.iptables.get(key), cand.iptables.get(key))
    out["address"] = [Difference("address", a, "bound", None)
                      for a in sorted(ref.addresses - cand.addresses)]
    out["address"] += [Difference("address", a, None, "bound")
                       for a in sorted(cand.addresses - ref.addresses)]
    if ref.link != cand.link:
        out["address"].append(Difference("address", "kube-ipvs0 link", ref.link, cand.link))
    out["sysctl"] = _map_diff("sysctl", ref.sysctls, cand.sysctls)
    if listeners:
        out["listener"] = [Difference("listener", p, "listening", None)
                           for p in sorted(ref.listeners - cand.listeners)]
        out["listener"] += [Difference("listener", p, None, "listening")
                            for p in sorted(cand.listeners - ref.listeners)]
    return {k: v for k, v in out.items() if v}


def _chain_diff(key: str, a: tuple[tuple[str, ...], ...] | None,
                b: tuple[tuple[str, ...], ...] | None) -> list[Difference]:
    if a == b:
        return []
    if a is None or b is None:  # the chain exists on one side only
        only = a if b is None else b
        assert only is not None
        side = ("chain", None) if b is None else (None, "chain")
        out = [Difference("iptables rule", key, *side)]
        rside = ("rule", None) if b is None else (None, "rule")
        out += [Difference("iptables rule", f"{key} {r}", *rside) for run in only for r in run]
        return out
    ca = Counter(r for run in a for r in run)
    cb = Counter(r for run in b for r in run)
    out = [Difference("iptables rule", f"{key} {r}", "rule", None)
           for r in sorted((ca - cb).elements())]
    out += [Difference("iptables rule", f"{key} {r}", None, "rule")
            for r in sorted((cb - ca).elements())]
    if not out:  # the same rules, in an order that means something else
        out.append(Difference("iptables rule", f"{key} (order)",
                              " | ".join(" ; ".join(run) for run in a),
                              " | ".join(" ; ".join(run) for run in b)))
    return out


def count(diffs: Mapping[str, list[Difference]]) -> dict[str, int]:
    return {k: len(v) for k, v in diffs.items()}


def render(diffs: Mapping[str, list[Difference]], limit: int = 50) -> str:
    lines = []
    for kind, items in diffs.items():
        lines.append(f"{kind}: {len(items)}")
        lines += [f"  {d}" for d in items[:limit]]
        if len(items) > limit:
            lines.append(f"  ... {len(items) - limit} more")
    return "\n".join(lines)
