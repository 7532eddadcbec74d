"""Drive kube-proxy --proxy-mode=ipvs and ipvsproxy against the same API server, in the lab.

Runs inside the lab guest (root, real IPVS). Per generated cluster (`differential`):

1. the cluster is loaded into the real kube-apiserver (etcd and kube-apiserver started in the
   guest by integration/upstream/controlplane.py, or one the host provides through a kubeconfig
   in IPVSPROXY_UPSTREAM_KUBECONFIG), on a node whose NIC `diff0` holds the Node's addresses;
2. the real `kube-proxy --proxy-mode=ipvs` (v1.35, KubeProxyConfiguration below) runs until its
   metrics say it has synced everything it was told and its clusterIP virtual servers are those
   of the API objects (`_converge`), and the kernel is snapshotted; then it is stopped and
   `kube-proxy --cleanup` runs, and whatever it leaves is reported and removed;
3. `ipvsproxy sync --once --kubeconfig`, snapshot, `ipvsproxy cleanup`, leftovers reported;
4. `ipvsproxy run --config` (the same KubeProxyConfiguration file) until synced, snapshot,
   SIGTERM, `ipvsproxy cleanup`;
5. both ipvsproxy snapshots are compared with kube-proxy's and every difference classified
   (deviations.py).

With a change series, each daemon (kube-proxy in step 2, `ipvsproxy run` in step 4) goes on
after its first snapshot: the changes are applied through the API server, then a sentinel
Service and EndpointSlice; once the daemon has programmed the sentinel and settled, the kernel
is snapshotted again, and the two converged states are compared (the cluster is loaded afresh
before each proxy, so both start from the same state).

Before each proxy runs, the sysctls either of them may set are put back to their boot values,
so each snapshot shows what that proxy set. Waits have generous limits (software emulation is
10x slower than hardware) and fail with the process's log; nothing asserts how long anything
took. A proxy that fails (a failed sync, an exit) is a finding of that comparison, not an
error of the run. `main()` is `make conformance`: many clusters, each with a change series,
figures printed and written as JSON.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import re
import signal
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, field
from ipaddress import ip_address, ip_network
from pathlib import Path
from typing import Any

from tests.differential import changes, deviations, generate, snapshot
from tests.differential.api import Api
from tests.differential.generate import Change, Cluster, Params
from tests.differential.snapshot import Difference, Snapshot

ROOT = Path(__file__).resolve().parents[2]
NODE_IF = "diff0"
METRICS = "http://127.0.0.1:10249/metrics"
MODULES = ("ip_vs", "ip_vs_rr", "ip_vs_wrr", "ip_vs_lc", "ip_vs_wlc", "ip_vs_sh", "ip_vs_mh",
           "ip_vs_dh", "ip_vs_sed", "ip_vs_nq", "nf_conntrack", "dummy", "xt_ipvs", "xt_set",
           "xt_physdev", "xt_addrtype", "xt_comment", "xt_mark", "xt_conntrack",
           "xt_MASQUERADE", "ip_set_hash_ipport", "ip_set_hash_ipportip",
           "ip_set_hash_ipportnet", "ip_set_bitmap_port", "ip_set_hash_ip", "sctp")
WAIT = 600.0  # longest wait for a process to be ready or synced (software emulation)


class RunError(Exception):
    """A proxy or the control plane did not get where it had to; the message carries logs."""


def sh(cmd: str, check: bool = True) -> str:
    p = subprocess.run(cmd, shell=True, text=True, capture_output=True, check=False)
    if check and p.returncode != 0:
        raise RunError(f"`{cmd}` exited {p.returncode}: {p.stdout}{p.stderr}")
    return p.stdout


def upstream_bin() -> Path:
    """The folder with kube-proxy, etcd and kube-apiserver (integration/upstream/build.py)."""
    env = os.environ.get("IPVSPROXY_UPSTREAM_BIN")
    if env:
        return Path(env)
    from integration.upstream import build

    # build.built() keys the cache by the Go version, and `go` is not on the lab guest's PATH
    # (and slow to start there): the newest complete build of the pinned version is the one.
    version = build.kubernetes_version()
    done = sorted((p for p in build.CACHE.glob(f"{version}-*") if (p / ".complete").exists()),
                  key=lambda p: (p / ".complete").stat().st_mtime)
    if not done:
        raise RunError(f"kube-proxy {version} is not built (expected in {build.CACHE}): run "
                       "`make setup` (python -m integration.upstream.build)")
    os.environ["IPVSPROXY_UPSTREAM_BIN"] = str(done[-1])
    return done[-1]


# ------------------------------------------------------------------------------ the node


def prepare_node(p: Params) -> dict[str, str]:
    """Modules, the node's NIC with the Node object's addresses, and the boot values of the
    sysctls (returned, to put back before each proxy runs)."""
    sh("modprobe -a " + " ".join(MODULES), check=False)
    if not Path(f"/sys/class/net/{NODE_IF}").exists():
        sh(f"ip link add {NODE_IF} type dummy")
        sh(f"ip addr add {p.node_ips[0]}/24 dev {NODE_IF}")
        sh(f"ip -6 addr add {p.node_ips[1]}/64 dev {NODE_IF} nodad")
        sh(f"ip link set {NODE_IF} up")
    wait_addresses_stable()
    return snapshot.sysctl_values(snapshot.read()["sysctls"])


def host_addresses() -> list[str]:
    """Every address of the node except kube-ipvs0's: what NodePorts are served on."""
    out = []
    for line in sh("ip -o addr show").splitlines():
        m = re.match(r"\d+: (\S+)\s+inet6? (\S+)", line)
        if m and m.group(1) != "kube-ipvs0":
            out.append(f"{m.group(1)} {m.group(2)}{' tentative' if 'tentative' in line else ''}")
    return sorted(out)


def wait_addresses_stable(quiet: float = 3.0, timeout: float = 120.0) -> list[str]:
    """Until no address is tentative and the set has not changed for `quiet` seconds (an
    IPv6 address autoconfigured meanwhile would be a NodePort address for one proxy only)."""
    deadline = time.monotonic() + timeout
    last = host_addresses()
    since = time.monotonic()
    while True:
        time.sleep(0.5)
        now = host_addresses()
        if now != last or any(a.endswith("tentative") for a in now):
            last, since = now, time.monotonic()
        elif time.monotonic() - since >= quiet:
            return now
        if time.monotonic() > deadline:
            raise RunError(f"the node's addresses did not settle: {now}")


def scrub() -> list[str]:
    """Remove whatever a proxy left (after its own cleanup), return what there was."""
    left = snapshot.normalize(snapshot.read()).is_clean()
    sh("ipvsadm -C", check=False)
    for fam, tool in ((4, "iptables"), (6, "ip6tables")):
        del fam
        for table in ("nat", "filter"):
            text = sh(f"{tool}-save -t {table}", check=False)
            for line in text.splitlines():
                if line.startswith("-A ") and re.search(r" -[jg] (KUBE-|IPVSPROXY-)", line) \
                        and line.split()[1] in snapshot.BUILTIN_CHAINS:
                    sh(f"{tool} -t {table} -D {line[3:]}", check=False)
            chains = [ln[1:].split()[0] for ln in text.splitlines()
                      if ln.startswith(":") and ln[1:].startswith(snapshot.OWN_PREFIXES)]
            for c in chains:
                sh(f"{tool} -t {table} -F {c}", check=False)
            for c in chains:
                sh(f"{tool} -t {table} -X {c}", check=False)
    for name in sh("ipset list -n", check=False).split():
        if name.startswith(snapshot.OWN_PREFIXES):
            sh(f"ipset destroy {name}", check=False)
    sh("ip link del kube-ipvs0 2>/dev/null", check=False)
    still = snapshot.normalize(snapshot.read()).is_clean()
    if still:
        raise RunError(f"the kernel could not be cleaned: {still}")
    return left


# ------------------------------------------------------------------------------ proxies


def kube_proxy_config(p: Params, kubeconfig: Path) -> str:
    """kube-proxy's configuration: IPVS mode, rr, this node, both families' pod CIDRs, and
    conntrack settings that leave the conntrack sysctls alone (maxPerCore 0, timeouts 0)."""
    return json.dumps({
        "apiVersion": "kubeproxy.config.k8s.io/v1alpha1",
        "kind": "KubeProxyConfiguration",
        "mode": "ipvs",
        "clientConnection": {"kubeconfig": str(kubeconfig)},
        "hostnameOverride": p.node_name,
        "clusterCIDR": ",".join(p.cluster_cidrs),
        # minSyncPeriod 1s (kube-proxy's IPVS default is 0: a full sync per event) only
        # coalesces the change series' events; ipvsproxy's default is 1s anyway
        "ipvs": {"scheduler": "rr", "syncPeriod": "30s", "minSyncPeriod": "1s"},
        "conntrack": {"maxPerCore": 0, "min": 0, "tcpEstablishedTimeout": "0s",
                      "tcpCloseWaitTimeout": "0s"},
        "metricsBindAddress": "127.0.0.1:10249",
        "healthzBindAddress": "127.0.0.1:10256",
    }, indent=1)


def metrics() -> dict[str, float]:
    try:
        with urllib.request.urlopen(METRICS, timeout=10) as r:
            text = r.read().decode()
    except OSError:
        return {}
    out: dict[str, float] = {}
    for line in text.splitlines():
        if line.startswith(("kubeproxy_sync_proxy_rules_", "ipvsproxy_syncs_total")):
            name, _, value = line.rpartition(" ")
            with contextlib.suppress(ValueError):
                out[name] = float(value)
    return out


def converged(m: dict[str, float]) -> bool:
    """Every family has synced since its last queued change, and nothing is pending."""
    fams = ("IPv4", "IPv6")
    last = [m.get(f'kubeproxy_sync_proxy_rules_last_timestamp_seconds{{ip_family="{f}"}}', 0)
            for f in fams]
    queued = [m.get('kubeproxy_sync_proxy_rules_last_queued_timestamp_seconds'
                    f'{{ip_family="{f}"}}', 0) for f in fams]
    pending = (m.get("kubeproxy_sync_proxy_rules_endpoint_changes_pending", 0)
               + m.get("kubeproxy_sync_proxy_rules_service_changes_pending", 0))
    return all(x > 0 for x in last) and all(a >= b for a, b in zip(last, queued, strict=True)) \
        and pending == 0


class Daemon:
    """A proxy process with kube-proxy's metrics: started, waited for, stopped."""

    def __init__(self, name: str, argv: list[str], log: Path) -> None:
        self.name, self.argv, self.log = name, argv, log
        self.proc: subprocess.Popen[bytes] | None = None
        self.raw: dict[str, str] = {}  # the text the last snapshot was made of

    def start(self) -> None:
        with self.log.open("ab") as f:
            f.write(f"==== {' '.join(self.argv)}\n".encode())
            f.flush()
            self.proc = subprocess.Popen(self.argv, stdout=f, stderr=subprocess.STDOUT,
                                         stdin=subprocess.DEVNULL, start_new_session=True)

    def tail(self, n: int = 40) -> str:
        return "\n".join(self.log.read_text(errors="replace").splitlines()[-n:])

    def settle(self, timeout: float = WAIT) -> Snapshot:
        """Wait until the metrics say it has synced everything, then snapshot; the snapshot
        counts only if no sync happened while it was taken and a second look 2 s later
        shows none either."""
        deadline = time.monotonic() + timeout
        while True:
            m = metrics()
            self.check(m)
            if converged(m):
                self.raw = snapshot.read()
                snap = snapshot.normalize(self.raw)
                time.sleep(2.0)
                m2 = metrics()
                if converged(m2) and _sync_times(m2) == _sync_times(m):
                    return snap
            if time.monotonic() > deadline:
                raise RunError(f"{self.name} did not sync within {timeout:.0f}s "
                               f"(metrics {_sync_times(m)}):\n{self.tail()}")
            time.sleep(0.5)

    def check(self, m: dict[str, float]) -> None:
        """RunError at once when the process is gone or ipvsproxy counts a failed sync."""
        if self.proc is None or self.proc.poll() is not None:
            raise RunError(f"{self.name} exited ({self.proc and self.proc.returncode}):\n"
                           f"{self.tail()}")
        failed = sum(v for k, v in m.items() if k.startswith("ipvsproxy_syncs_total")
                     and 'result="failed"' in k)
        if failed:
            raise RunError(f"{self.name}: {failed:.0f} failed sync(s); the last error: "
                           f"{self.last_error()}")

    def last_error(self) -> str:
        for line in reversed(self.tail(2000).splitlines()):
            if line.startswith("{") and '"level": "error"' in line:
                try:
                    rec = json.loads(line)
                except ValueError:
                    return line[:1000]
                return f"{rec.get('event')}: {rec.get('error', '')}"[:1000]
        return self.tail(20)

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(60)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self.proc = None
        # the next daemon binds the same ports
        deadline = time.monotonic() + 30
        while metrics() and time.monotonic() < deadline:
            time.sleep(0.2)


def _sync_times(m: dict[str, float]) -> list[float]:
    return sorted(v for k, v in m.items() if "timestamp" in k)


@dataclass
class Env:
    """Where things are: the API server, the binaries, a folder for configs and logs."""

    params: Params
    kubeconfig: Path
    api: Api
    bin: Path
    work: Path
    baseline: dict[str, str] = field(default_factory=dict)
    timings: dict[str, float] = field(default_factory=dict)  # of setting it up

    @property
    def config_file(self) -> Path:
        path = self.work / "kube-proxy.conf"
        if not path.exists():
            path.write_text(kube_proxy_config(self.params, self.kubeconfig))
        return path

    def kube_proxy(self) -> Daemon:
        return Daemon("kube-proxy", [str(self.bin / "kube-proxy"), f"--config={self.config_file}",
                                     "--v=2"], self.work / "kube-proxy.log")

    def ipvsproxy_run(self) -> Daemon:
        return Daemon("ipvsproxy run", [sys.executable, "-m", "ipvsproxy", "--log-format",
                                        "json", "run", "--config", str(self.config_file)],
                      self.work / "ipvsproxy-run.log")

    def ipvsproxy(self, *args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([sys.executable, "-m", "ipvsproxy", *args], text=True,
                              capture_output=True, check=False, cwd=ROOT)

    def sync_once(self) -> subprocess.CompletedProcess[str]:
        p = self.params
        return self.ipvsproxy("sync", "--once", "--kubeconfig", str(self.kubeconfig),
                              "--hostname-override", p.node_name,
                              "--cluster-cidr", ",".join(p.cluster_cidrs))

    def kube_proxy_cleanup(self) -> list[str]:
        """`kube-proxy --cleanup`, then what it left (removed by scrub)."""
        subprocess.run([str(self.bin / "kube-proxy"), "--cleanup", "--v=2"], capture_output=True,
                       check=False)
        return scrub()

    def ipvsproxy_cleanup(self) -> list[str]:
        self.ipvsproxy("cleanup")
        return scrub()

    def reset_sysctls(self) -> None:
        snapshot.write_sysctls({k: v for k, v in self.baseline.items()
                                if not k.startswith("ipvs timeout")})


# ------------------------------------------------------------------------------ one cluster


@dataclass
class Outcome:
    """One cluster: what ran, the differences by comparison and kind, each classified.

    Comparisons: "once" (`sync --once` against kube-proxy, on the loaded cluster), "run"
    (`ipvsproxy run`, same) and "changes" (each daemon after the change series)."""

    name: str
    objects: int
    changes: int
    features: dict[str, int]
    diffs: dict[str, dict[str, list[str]]]  # comparison -> kind -> difference texts
    classified: dict[str, list[tuple[str, str]]]  # comparison -> [(difference, class)]
    leftovers: dict[str, list[str]]  # after whose cleanup -> what was left
    timings: dict[str, float]
    problems: list[str] = field(default_factory=list)  # ipvsproxy's warnings about objects
    failures: dict[str, str] = field(default_factory=dict)  # comparison -> a proxy that failed

    def unexplained(self, *comparisons: str) -> list[str]:
        which = comparisons or tuple({*self.classified, *self.failures})
        return [f"{c}: {f}" for c, f in self.failures.items() if c in which] + [
            d for c, items in self.classified.items() if c in which for d, cls in items
            if cls.startswith(deviations.UNEXPLAINED)]

    def summary(self, *comparisons: str) -> str:
        which = comparisons or tuple(self.classified)
        lines = [f"{self.name}: {self.objects} objects, {self.changes} changes; timings "
                 + ", ".join(f"{k} {v:.0f}s" for k, v in self.timings.items())]
        for run, items in self.classified.items():
            if run not in which:
                continue
            by: Counter[str] = Counter(cls for _, cls in items)
            lines.append(f"  {run}: {len(items)} differences; "
                         + "; ".join(f"{c}: {n}" for c, n in sorted(by.items())))
            lines += [f"    {cls}: {d}" for d, cls in items
                      if cls.startswith(deviations.UNEXPLAINED)][:80]
        for who, left in self.leftovers.items():
            if left:
                lines.append(f"  left after {who}: {left}")
        lines += [f"  FAILED ({c}): {f[:3000]}" for c, f in self.failures.items()
                  if c in which]
        return "\n".join(lines)


def _classify(diffs: dict[str, list[Difference]], ctx: deviations.Context,
              ) -> list[tuple[str, str]]:
    return [(str(d), cls) for d, cls in deviations.classify_all(diffs, ctx)]


def _load(env: Env, cluster: Cluster) -> None:
    env.api.reset(env.params.namespaces, env.params.node_name)
    env.api.load(cluster)


def _last_error(text: str) -> str:
    lines = [ln for ln in text.splitlines() if ln.strip()]
    tb = [i for i, ln in enumerate(lines) if ln.startswith("Traceback")]
    if tb:
        return "\n".join(lines[tb[-1]:])[-3000:]
    return "\n".join(lines[-10:])[-3000:]


def _save(env: Env, name: str, objects: list[Any], **snaps: Snapshot) -> None:
    """The objects and the snapshots, for a look afterwards (deviations.py re-classifies them
    on the host: `python -m tests.differential.deviations FILE`)."""
    (env.work / f"{name}.json").write_text(json.dumps(
        {"objects": objects, "snapshots": {k: snapshot.to_plain(s) for k, s in snaps.items()}},
        indent=1))


def _sentinel(p: Params, n: int) -> tuple[list[Change], str]:
    """A Service and its EndpointSlice written last: once a proxy programs both, it has seen
    every Service and EndpointSlice event before them (each watch delivers in order)."""
    ip = f"10.96.255.{200 + n % 50}"
    name = f"sentinel-{n}"
    svc = {"apiVersion": "v1", "kind": "Service",
           "metadata": {"namespace": p.namespaces[0], "name": name},
           "spec": {"type": "ClusterIP", "clusterIP": ip, "clusterIPs": [ip],
                    "ipFamilies": ["IPv4"], "ipFamilyPolicy": "SingleStack",
                    "internalTrafficPolicy": "Cluster",
                    "ports": [{"protocol": "TCP", "port": 7777, "targetPort": 7777}]}}
    sl = {"apiVersion": "discovery.k8s.io/v1", "kind": "EndpointSlice",
          "metadata": {"namespace": p.namespaces[0], "name": name,
                       "labels": {generate.LABEL_SERVICE_NAME: name,
                                  generate.LABEL_MANAGED_BY: generate.MANAGED_BY}},
          "addressType": "IPv4", "ports": [{"name": "", "protocol": "TCP", "port": 7777}],
          "endpoints": [{"addresses": ["10.244.9.9"]}]}
    return [Change("create", svc, "sentinel"), Change("create", sl, "sentinel")], \
        f"-a -t {ip}:7777 -r 10.244.9.9:7777 "


def cluster_ip_frontends(objects: list[Any], params: Params) -> tuple[set[str], set[str]]:
    """The virtual servers every proxy must have for these objects (each clusterIP:port of a
    proxied Service), and every one it may have inside the service ranges (those, and the
    externalIPs there, which kube-proxy programs and ipvsproxy refuses)."""
    must: set[str] = set()
    may: set[str] = set()
    for o in objects:
        spec = o.get("spec", {})
        labels = o.get("metadata", {}).get("labels", {})
        if o.get("kind") != "Service" or spec.get("type") == "ExternalName" \
                or spec.get("clusterIPs", ["None"]) == ["None"] \
                or generate.LABEL_PROXY_NAME in labels or generate.LABEL_HEADLESS in labels:
            continue
        for p in spec.get("ports", []):
            for a in spec.get("clusterIPs", []):
                must.add(deviations._vs(p["protocol"], a, p["port"]))
            for a in spec.get("externalIPs", []):
                ip = deviations._sloppy(a)
                if ip is not None:
                    may.add(deviations._vs(p["protocol"], ip, p["port"]))
    return must, must | may


def _in_service_ranges(vs: str, params: Params) -> bool:
    host = vs.partition(" ")[2].rpartition(":")[0].strip("[]")
    return any(ip_address(host) in ip_network(n) for n in params.service_cidrs)


def _converge(env: Env, d: Daemon, sentinel: str) -> Snapshot:
    """After the changes: until the sentinel's real server is programmed and the clusterIP
    virtual servers are those of the API server's objects, then settled. (The metrics alone
    can say "synced" for a sync that started before the last changes arrived.)"""
    deadline = time.monotonic() + WAIT
    must, may = cluster_ip_frontends(env.api.dump(env.params.namespaces, env.params.node_name),
                                     env.params)
    while True:
        if not sentinel or sentinel in sh("ipvsadm -Sn", check=False):
            snap = d.settle()
            have = {k for k in snap.ipvs_services if _in_service_ranges(k, env.params)}
            if must <= have <= may:
                return snap
        d.check(metrics())
        if time.monotonic() > deadline:
            have = {k for k in snapshot.normalize(snapshot.read()).ipvs_services
                    if _in_service_ranges(k, env.params)}
            raise RunError(f"{d.name} did not converge within {WAIT:.0f}s: missing "
                           f"{sorted(must - have)}, not in the API {sorted(have - may)} "
                           f"(sentinel {sentinel in sh('ipvsadm -Sn', check=False)}):\n"
                           f"{d.tail()}")
        time.sleep(2.0)


def _daemon_pass(env: Env, d: Daemon, changes: list[Change], sentinel: tuple[list[Change], str],
                 t: dict[str, float], snaps: dict[str, Snapshot]) -> None:
    """Start a daemon on the loaded cluster, snapshot it settled (snaps["first"]); apply the
    changes, snapshot it converged (snaps["after"]); stop it. A RunError leaves in `snaps`
    what was taken before it."""
    t0 = time.monotonic()
    d.start()
    try:
        snaps["first"] = _converge(env, d, "")
        t[d.name] = time.monotonic() - t0
        if not changes:
            return
        t0 = time.monotonic()
        for c in changes:
            env.api.write(c)
        env.api.write_all(sentinel[0])
        snaps["after"] = _converge(env, d, sentinel[1])
        t[f"{d.name} changes"] = time.monotonic() - t0
    finally:
        d.stop()


def differential(env: Env, cluster: Cluster, changes: list[Change] | None = None) -> Outcome:
    """The module docstring's steps for one cluster, and the change series after each
    daemon's first snapshot (the cluster is loaded again before each proxy runs)."""
    changes = changes or []
    sentinel = _sentinel(env.params, cluster.seed)
    t: dict[str, float] = {}
    failures: dict[str, str] = {}
    t0 = time.monotonic()
    _load(env, cluster)
    t["load"] = time.monotonic() - t0
    objects = env.api.dump(env.params.namespaces, env.params.node_name)
    ctx = deviations.Context.from_objects(objects, env.params)
    addresses = host_addresses()
    scrub()

    env.reset_sysctls()
    kp: dict[str, Snapshot] = {}
    _daemon_pass(env, env.kube_proxy(), changes, sentinel, t, kp)  # a failure here is fatal
    ref, ref_after = kp["first"], kp.get("after")
    objects_after = env.api.dump(env.params.namespaces, env.params.node_name)
    ctx_after = deviations.Context.from_objects(objects_after, env.params)
    left = {"kube-proxy --cleanup": env.kube_proxy_cleanup()}

    if changes:
        _load(env, cluster)
    env.reset_sysctls()
    t0 = time.monotonic()
    once = env.sync_once()
    raw_once = snapshot.read()
    snap_once = snapshot.normalize(raw_once)
    t["sync --once"] = time.monotonic() - t0
    if once.returncode != 0:
        # 1 is "an operation failed" (reported, the rest programmed): a finding too
        failures["once"] = (f"ipvsproxy sync --once exited {once.returncode}: "
                            f"{_last_error(once.stderr)}")
    left["ipvsproxy cleanup (after sync --once)"] = env.ipvsproxy_cleanup()

    env.reset_sysctls()
    ours: dict[str, Snapshot] = {}
    try:
        _daemon_pass(env, env.ipvsproxy_run(), changes, sentinel, t, ours)
    except RunError as exc:
        failures["run" if "first" not in ours else "changes"] = str(exc)
    snap_run, run_after = ours.get("first"), ours.get("after")
    left["ipvsproxy cleanup (after run)"] = env.ipvsproxy_cleanup()
    if host_addresses() != addresses:
        raise RunError(f"the node's addresses changed during the run: {addresses} -> "
                       f"{host_addresses()}")

    diffs = {"once": snapshot.compare(ref, snap_once)}
    classified = {"once": _classify(diffs["once"], ctx)}
    saved = {"kube-proxy": ref, "once": snap_once}
    if snap_run is not None:
        diffs["run"] = snapshot.compare(ref, snap_run, listeners=True)
        classified["run"] = _classify(diffs["run"], ctx)
        saved["run"] = snap_run
    _save(env, f"cluster-{cluster.seed}", objects, **saved)
    if ref_after is not None and run_after is not None:
        diffs["changes"] = snapshot.compare(ref_after, run_after, listeners=True)
        classified["changes"] = _classify(diffs["changes"], ctx_after)
        _save(env, f"cluster-{cluster.seed}-changes", objects_after,
              **{"kube-proxy": ref_after, "run": run_after})
    return Outcome(
        f"cluster seed {cluster.seed}", len(cluster.objects()), len(changes),
        dict(cluster.features()),
        {k: {kind: [str(x) for x in v] for kind, v in dd.items()} for k, dd in diffs.items()},
        classified, {k: v for k, v in left.items() if v}, t,
        [ln for ln in once.stderr.splitlines() if "warn" in ln.lower()][:50], failures)


# ------------------------------------------------------------------------------ set-up


@contextlib.contextmanager
def environment(params: Params, work: Path | None = None) -> Iterator[Env]:
    """The node prepared and an API server to use: the host's (IPVSPROXY_UPSTREAM_KUBECONFIG,
    a kubeconfig that works from the guest) or etcd + kube-apiserver started here."""
    work = work or Path(tempfile.mkdtemp(prefix="ipvsproxy-diff-"))
    work.mkdir(parents=True, exist_ok=True)
    t0 = time.monotonic()
    bin_dir = upstream_bin()
    baseline = prepare_node(params)
    timings = {"node": time.monotonic() - t0}
    given = os.environ.get("IPVSPROXY_UPSTREAM_KUBECONFIG")
    cp = None
    try:
        if given:
            kubeconfig = Path(given)
        else:
            from integration.upstream.controlplane import ControlPlane

            cp = ControlPlane(bin_dir=bin_dir, advertise_address=params.node_ips[0])
            t0 = time.monotonic()
            cp.start(timeout=WAIT)
            timings["control plane"] = time.monotonic() - t0
            kubeconfig = cp.kubeconfig(work / "admin.kubeconfig")
        env = Env(params, kubeconfig, Api.from_kubeconfig(kubeconfig), bin_dir, work,
                  baseline, timings)
        yield env
    finally:
        scrub()
        snapshot.write_sysctls({k: v for k, v in baseline.items()
                                if not k.startswith("ipvs timeout")})
        if cp is not None:
            cp.close()
        sh(f"ip link del {NODE_IF}", check=False)


# ------------------------------------------------------------------------------ make conformance


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description="The differential suite at full size "
                                             "(make conformance), inside the lab guest.")
    ap.add_argument("--clusters", type=int, default=12)
    ap.add_argument("--services", type=int, default=20)
    ap.add_argument("--changes", type=int, default=40, help="changes per cluster")
    ap.add_argument("--seed", type=int, default=100, help="first seed")
    ap.add_argument("--json", type=Path, default=None, help="write the figures here")
    ap.add_argument("--work", type=Path, default=None,
                    help="keep configs, logs and snapshots here (default: a temporary folder)")
    args = ap.parse_args(argv)
    params = Params(services=args.services)
    outcomes: list[Outcome] = []
    started = time.monotonic()
    with environment(params, args.work) as env:
        print(f"set up in {sum(env.timings.values()):.0f}s: {env.timings}", flush=True)
        for i in range(args.clusters):
            cluster = generate.generate(args.seed + i, params)
            try:
                o = differential(env, cluster, changes.changes(cluster, args.changes,
                                                               args.seed + i))
            except RunError as exc:  # kube-proxy or the control plane: noted, go on
                o = Outcome(f"cluster seed {cluster.seed}", len(cluster.objects()),
                            args.changes, dict(cluster.features()), {}, {}, {}, {},
                            failures={"reference": str(exc)[:3000]})
            print(o.summary(), flush=True)
            outcomes.append(o)
    figures = report(outcomes, time.monotonic() - started)
    print(json.dumps(figures, indent=1))
    if args.json:
        args.json.write_text(json.dumps({"figures": figures, "outcomes": [
            o.__dict__ for o in outcomes]}, indent=1, default=str))
    return 1 if any(o.unexplained() for o in outcomes) else 0


def report(outcomes: list[Outcome], seconds: float) -> dict[str, Any]:
    """The figures for the README: clusters, objects, changes, differences by kind and by
    class, per comparison."""
    by_kind: dict[str, Counter[str]] = {}
    by_class: dict[str, Counter[str]] = {}
    feats: Counter[str] = Counter()
    for o in outcomes:
        feats.update(o.features)
        for comp, kinds in o.diffs.items():
            for kind, items in kinds.items():
                by_kind.setdefault(comp, Counter())[kind] += len(items)
        for comp, pairs in o.classified.items():
            for _, cls in pairs:
                by_class.setdefault(comp, Counter())[cls] += 1
    return {
        "clusters": len(outcomes),
        "objects": sum(o.objects for o in outcomes),
        "changes": sum(o.changes for o in outcomes),
        "features covered": f"{len(set(feats) & set(generate.FEATURES))}/"
                            f"{len(generate.FEATURES)}",
        "differences by kind": {c: dict(sorted(v.items())) for c, v in by_kind.items()},
        "differences by class": {c: dict(sorted(v.items())) for c, v in by_class.items()},
        "failures": sum(len(o.failures) for o in outcomes),
        "unexplained": sum(len(o.unexplained()) for o in outcomes),
        "seconds": round(seconds),
        "seconds per cluster": [round(sum(o.timings.values())) for o in outcomes],
    }


if __name__ == "__main__":
    sys.exit(main())
