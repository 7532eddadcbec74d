"""The lab guest's side of the differential suite: the node, the two proxies as processes, and
the API server they both watch. Runs inside the lab guest (root, real IPVS).

The node: the kernel modules, the NIC `diff0` holding the Node object's addresses, the boot
values of the sysctls, and `scrub` (whatever a proxy left after its own cleanup, reported and
removed). The proxies: the KubeProxyConfiguration both read, kube-proxy's sync metrics and when
they say everything is synced (`converged`), `Daemon` (a proxy process started, settled and
snapshotted, stopped) and `Env` (where the API server, the binaries and the work folder are;
how each proxy runs and cleans up). `environment()` sets all of it up, with etcd and
kube-apiserver started in the guest unless the host provides an API server. Waits have generous
limits (software emulation is 10x slower than hardware) and fail with the process's log.
run.py drives them.
"""

from __future__ import annotations

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
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

from tests.differential import snapshot
from tests.differential.api import Api
from tests.differential.cluster import Params
from tests.differential.snapshot import Snapshot

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
    if not left:  # nothing below would find anything: ~15 processes saved, seconds in the lab
        return left
    sh("ipvsadm -C", check=False)
    # one iptables-restore per family and one ipset restore, not a process per rule, chain
    # and set (~100 of them after a proxy's run, each a second or so under the lab's emulation)
    said = []
    for tool in ("iptables", "ip6tables"):
        batch: list[str] = []
        for table in ("nat", "filter"):
            text = sh(f"{tool}-save -t {table}", check=False)
            jumps = [f"-D {line[3:]}" for line in text.splitlines()
                     if line.startswith("-A ") and re.search(r" -[jg] (KUBE-|IPVSPROXY-)", line)
                     and line.split()[1] in snapshot.BUILTIN_CHAINS]
            chains = [ln[1:].split()[0] for ln in text.splitlines()
                      if ln.startswith(":") and ln[1:].startswith(snapshot.OWN_PREFIXES)]
            if jumps or chains:
                batch += [f"*{table}", *jumps, *(f"-F {c}" for c in chains),
                          *(f"-X {c}" for c in chains), "COMMIT"]
        if batch:
            said.append(_restore([f"{tool}-restore", "--noflush"], "\n".join(batch) + "\n"))
    sets = [n for n in sh("ipset list -n", check=False).split()
            if n.startswith(snapshot.OWN_PREFIXES)]
    if sets:
        said.append(_restore(["ipset", "restore"], "".join(f"destroy {n}\n" for n in sets)))
    sh("ip link del kube-ipvs0 2>/dev/null", check=False)
    still = snapshot.normalize(snapshot.read()).is_clean()
    if still:
        raise RunError(f"the kernel could not be cleaned: {still} {[x for x in said if x]}")
    return left


def _restore(argv: list[str], text: str) -> str:
    """Run a restore tool on `text`; what it said when it failed, else ""."""
    p = subprocess.run(argv, input=text, text=True, capture_output=True, check=False)
    return f"{argv[0]}: {p.stderr.strip()}" if p.returncode else ""


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
        self.started_at = 0  # where this run's output begins in the log (bytes)
        self.log_at_snapshot = ""  # this run's output up to the last snapshot

    def start(self) -> None:
        with self.log.open("ab") as f:
            f.write(f"==== {' '.join(self.argv)}\n".encode())
            f.flush()
            self.started_at = f.tell()
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
                    with self.log.open("rb") as f:
                        f.seek(self.started_at)
                        self.log_at_snapshot = f.read().decode(errors="replace")
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
