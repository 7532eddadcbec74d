"""ipvsproxy and kube-proxy side by side (issue 33), inside one lab boot, against the real
kube-apiserver on the host (bench/peers_host.py starts it and loads each size's cluster).

At each size (services of bench/cluster_gen.py x endpoints), each proxy in turn, each from a
clean kernel, with the same KubeProxyConfiguration (mode apart; kube-proxy's IPVS defaults as
a row of their own), the proxy started as a user starts it (a new process), from a copy in the
guest's tmpfs as its image puts it on a node (bench/node_install.py: the lab's 9p root costs a
Python start thousands of emulated round trips a node never pays; --from 9p for the old way):

1. cold node: from the process's start until the kernel holds every service's endpoints (a few
   sampled services polled every 0.5 s, then the whole cluster checked at once, again until
   nothing is missing; the time is the end of the check that found nothing missing; see
   bench/peers_kernel.py for what "holds" means in each mode), and the CPU that took;
2. idle: CPU seconds over IDLE seconds with nothing changing, per sync period (IPVS modes
   resync in full every period; kube-proxy's nftables and iptables modes only every hour);
3. endpoint changes: CHANGES measured EndpointSlice updates (each replaces one pod of another
   service) and as many background ones between them, sent at RATE a second, open loop; each
   measured one timed from the API server's answer to the PUT until the kernel holds the new
   pod (each polled at 5% of its age, at most POLLS polls a second in all); p50, p99 and CPU
   seconds per 1,000 changes (the proxy's whole CPU from the first update until the kernel
   held the last);
4. memory: resident set (VmRSS) 5 s after the cold node was complete and after the changes;
5. dataplane: new TCP connections per second and connect latency through the dataplane
   ClusterIP from a client namespace (bench/peers_dataplane.py).

CPU is the process's and the children it waited for (/proc/PID/stat utime+stime+cutime+cstime):
kube-proxy runs ipset, iptables-restore and nft as children. Nothing is read from a proxy's
log or metrics. Every figure is printed as ipvsproxy / peer, measured in the same boot; the
table and the raw figures (JSON) go to bench/results/peers-*.json.

    python -m bench.peers --sizes 1000,10000 [--changes 200] [--proxies ...]
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import random
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from bench import procstat
from bench.cluster_gen import CLUSTER_CIDR, NODE, NODE_IP, generate, pod_ip
from bench.node_install import Installed, install
from bench.peers_cluster import (
    DP_IP,
    DP_NAME,
    DP_NAMESPACE,
    DP_POD_PORT,
    DP_PODS,
    DP_PORT,
    Change,
    Connection,
    Service,
    change_series,
    cpu_seconds,
    path,
    percentile,
    services,
    slice_of,
)

ROOT = Path(__file__).resolve().parents[1]
NODE_IF = "bench0"
SYNC_PERIOD = 30.0
RSS_EVERY = 2.0  # the change series samples the proxy's resident memory this often (seconds)
POLLS = 50.0  # the change series' kernel polls a second, at most, over all pending changes
TICKS = os.sysconf("SC_CLK_TCK")
MODULES = ("ip_vs ip_vs_rr ip_vs_wrr ip_vs_sh nf_conntrack dummy veth bridge xt_ipvs xt_set "
           "xt_physdev xt_addrtype xt_comment xt_mark xt_conntrack xt_MASQUERADE xt_statistic "
           "xt_nat xt_tcpudp xt_recent ip_set_hash_ipport ip_set_hash_ipportip "
           "ip_set_hash_ipportnet ip_set_bitmap_port ip_set_hash_ip ip_set_hash_net nf_tables "
           "nft_chain_nat nft_ct nft_nat nft_numgen nft_fib_ipv4 nft_fib_ipv6 nft_masq "
           "nft_reject_inet nft_compat nft_limit nft_fib_inet sctp")


@dataclass(frozen=True)
class Variant:
    """One proxy as it runs: which binary, which mode, and its minSyncPeriod."""

    name: str
    binary: str  # ipvsproxy or kube-proxy
    mode: str  # ipvs, nftables, iptables
    min_sync: str = "1s"
    note: str = ""


VARIANTS = {v.name: v for v in (
    Variant("ipvsproxy", "ipvsproxy", "ipvs",
            note="its defaults are these (sync 30s, min 1s)"),
    Variant("kube-proxy-ipvs", "kube-proxy", "ipvs"),
    Variant("kube-proxy-ipvs-defaults", "kube-proxy", "ipvs", "0s",
            note="kube-proxy's IPVS defaults: minSyncPeriod 0s"),
    Variant("kube-proxy-nftables", "kube-proxy", "nftables"),
    Variant("kube-proxy-iptables", "kube-proxy", "iptables"),
)}


def sh(cmd: str, check: bool = True) -> str:
    p = subprocess.run(cmd, shell=True, text=True, capture_output=True, check=False)
    if check and p.returncode != 0:
        raise RuntimeError(f"`{cmd}` exited {p.returncode}: {p.stdout}{p.stderr}")
    return p.stdout


def config(v: Variant, kubeconfig: Path) -> str:
    """The KubeProxyConfiguration every proxy reads: the same sync periods for each mode,
    this node, the pod CIDR, NodePorts on the node's address only, and conntrack settings
    that leave the conntrack sysctls alone (as the differential suite runs kube-proxy)."""
    periods = {"syncPeriod": f"{SYNC_PERIOD:.0f}s", "minSyncPeriod": "1s"}
    return json.dumps({
        "apiVersion": "kubeproxy.config.k8s.io/v1alpha1", "kind": "KubeProxyConfiguration",
        "mode": v.mode, "clientConnection": {"kubeconfig": str(kubeconfig)},
        "hostnameOverride": NODE, "clusterCIDR": CLUSTER_CIDR,
        "nodePortAddresses": [f"{NODE_IP}/32"],
        "ipvs": {"scheduler": "rr", **periods, "minSyncPeriod": v.min_sync},
        "iptables": periods, "nftables": periods,
        "conntrack": {"maxPerCore": 0, "min": 0, "tcpEstablishedTimeout": "0s",
                      "tcpCloseWaitTimeout": "0s"},
        "metricsBindAddress": "127.0.0.1:10249", "healthzBindAddress": "127.0.0.1:10256",
    }, indent=1)


def upstream_bin() -> Path:
    from tests.differential.proxies import upstream_bin as found

    return found()


# Where the proxies start from: installed in the guest's tmpfs as a node has them
# (bench/node_install.py), or None: from the checkout and the upstream cache, over 9p (--from 9p)
INSTALLED: Installed | None = None
PROFILE = False  # --profile: ipvsproxy runs under cProfile (its figures are then not comparable)


def argv(v: Variant, conf: Path, profile: Path | None = None) -> list[str]:
    """The proxy's command; `profile`: ipvsproxy's main thread (its syncs) under cProfile,
    written there."""
    if v.binary == "ipvsproxy":
        python, script = (INSTALLED.ipvsproxy() if INSTALLED else
                          [sys.executable, str(Path(sys.executable).with_name("ipvsproxy"))])
        # -P: the modules from the install, not from the working directory (-m puts it first)
        prof = [] if profile is None else ["-P", "-m", "cProfile", "-o", str(profile)]
        return [python, *prof, script, "--log-format", "json", "run", "--config", str(conf)]
    binary = INSTALLED.kube_proxy() if INSTALLED else str(upstream_bin() / "kube-proxy")
    return [binary, f"--config={conf}"]


# ------------------------------------------------------------------------------ the node


def node_up(remote: Any) -> None:
    from tests.kernel.test_real_apiserver import GUEST, HOST, _nic

    sh("modprobe -a " + MODULES, check=False)
    dev = _nic()
    sh(f"sysctl -qw net.ipv6.conf.{dev}.disable_ipv6=1")
    sh(f"ip link set {dev} up && ip addr add {GUEST}/32 dev {dev} && "
       f"ip route add {HOST}/32 dev {dev}")
    sh(f"ip link add {NODE_IF} type dummy && ip addr add {NODE_IP}/24 dev {NODE_IF} "
       f"&& ip link set {NODE_IF} up")
    deadline = time.monotonic() + 120
    while True:
        try:
            if remote.request("GET", "/readyz", raw=True, timeout=10) == "ok":
                return
        except Exception as exc:
            if time.monotonic() > deadline:
                raise RuntimeError(f"the API server on the host does not answer: {exc}") from exc
        time.sleep(1)


# net/netfilter/ipvs: a deleted real server waits in the IPVS trash for IP_VS_DEST_TRASH_PERIOD
# (120 s, purged every 60 s), and every real server added walks that whole list
# (ip_vs_ctl.c ip_vs_trash_get_dest). After the flush of 140,000 of them, the next cold start
# at 10,000 services took 215 s instead of 128 s (make profile-cold, 2026-11-27): whichever
# proxy came second paid for the first one's state.
TRASH_WAIT = 185.0


def fresh_ipvs() -> None:
    """An empty IPVS trash for the next proxy: the ip_vs modules reloaded (which frees it), or,
    if they cannot be removed, a wait until the kernel has purged it."""
    loaded = [line.split()[0] for line in Path("/proc/modules").read_text().splitlines()
              if line.startswith(("ip_vs", "xt_ipvs"))]
    if not loaded:
        return
    # users first: xt_ipvs and the schedulers, then ip_vs itself
    order = sorted(loaded, key=lambda m: (m == "ip_vs", m))
    sh("modprobe -r " + " ".join(order), check=False)
    still = any(line.startswith("ip_vs ") for line in
                Path("/proc/modules").read_text().splitlines())
    sh("modprobe -a " + MODULES, check=False)
    if still:
        print(f"clean: ip_vs could not be unloaded; waiting {TRASH_WAIT:.0f}s for its trash",
              flush=True)
        time.sleep(TRASH_WAIT)


def clean(sysctls: dict[str, str]) -> None:
    """A clean kernel for the next proxy: each proxy's own cleanup, then whatever is left."""
    script = Path(sys.executable).with_name("ipvsproxy")
    subprocess.run([str(script), "cleanup"], capture_output=True, check=False)
    subprocess.run([str(upstream_bin() / "kube-proxy"), "--cleanup"], capture_output=True,
                   check=False)
    sh("ipvsadm -C; nft flush ruleset; ipset destroy; ip link del kube-ipvs0; conntrack -F",
       check=False)
    fresh_ipvs()
    from tests.differential import snapshot

    snapshot.write_sysctls(sysctls)
    left = sh("ipvsadm -Sn; ipset list -n; nft list ruleset", check=False).strip()
    if left:
        raise RuntimeError(f"the kernel could not be cleaned: {left[:500]}")


# ------------------------------------------------------------------------------ a process


def cpu(pid: int) -> float:
    return cpu_seconds(Path(f"/proc/{pid}/stat").read_text(), TICKS)


def memory(pid: int) -> dict[str, float]:
    """VmRSS and what it is made of (MB): RssAnon, the process's own heap and stacks; RssFile
    and RssShmem, the pages of its binary and libraries it touched (a Go binary's text, an
    interpreter's libraries; Shmem where they sit in tmpfs, bench/node_install.py); VmHWM, the
    peak; and its Threads."""
    got = procstat.status(pid)
    if "VmRSS" not in got:
        raise RuntimeError("no VmRSS")
    return {k: got[k] / (1 if k == "Threads" else 1024)
            for k in ("VmRSS", "RssAnon", "RssFile", "RssShmem", "VmHWM", "Threads") if k in got}


class Proxy:
    def __init__(self, v: Variant, work: Path, kubeconfig: Path, logs: Path) -> None:
        self.v = v
        conf = work / f"{v.name}.conf"
        conf.write_text(config(v, kubeconfig))
        self.log = logs / f"{v.name}.log"
        self.argv = argv(v, conf, logs / f"{v.name}.prof" if PROFILE else None)
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self) -> float:
        with self.log.open("ab") as f:
            f.write(f"==== {' '.join(self.argv)}\n".encode())
            f.flush()
            t0 = time.perf_counter()
            self.proc = subprocess.Popen(self.argv, stdout=f, stderr=subprocess.STDOUT,
                                         stdin=subprocess.DEVNULL, start_new_session=True,
                                         env=INSTALLED.env if INSTALLED else None)
        return t0

    @property
    def pid(self) -> int:
        assert self.proc is not None
        return self.proc.pid

    def alive(self) -> None:
        if self.proc is None or self.proc.poll() is not None:
            tail = "\n".join(self.log.read_text(errors="replace").splitlines()[-30:])
            raise RuntimeError(f"{self.v.name} exited:\n{tail}")

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(120)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self.proc = None


# ----------------------------------------------------------------------------- measuring


Expected = list[tuple[Service, list[str]]]


def cold(p: Proxy, probe: Any, expected: Expected, t0: float, cap: float, rng: random.Random,
         pause: float = 0.5) -> dict[str, Any]:
    """From the process's start until nothing of `expected` is missing.

    A few services sampled are polled first (cheap); then one read of everything finds what is
    still missing, and only that is polled again, so the time taken is the kernel's, give or take
    a short check, not a full read's (16-21 s at 10,000 services under emulation, 12% of a
    cold node). What was present stays present: the last check is confirmed by one more read of
    everything (not timed), and anything gone by then is polled on."""
    from bench.peers_kernel import all_present

    sample = [(s, ips[-1]) for s, ips in rng.sample(expected, min(16, len(expected)))]
    sample += [(s, ips[-1]) for s, ips in expected[-2:]]
    out: dict[str, Any] = {}
    while not all_present(probe, sample):
        p.alive()
        if time.perf_counter() - t0 > cap:
            return {"capped": cap}
        time.sleep(pause)
    out["sampled_s"] = time.perf_counter() - t0
    checks, left = 0, None
    while True:
        p.alive()
        t = time.perf_counter()
        left = probe.absent(expected) if left is None else probe.still_absent(left)
        end = time.perf_counter()
        checks += 1
        if not left:
            out.update(cold_s=end - t0, check_s=end - t, checks=checks, cpu_s=cpu(p.pid))
            c = time.perf_counter()
            left = probe.absent(expected)
            out["confirm_s"] = time.perf_counter() - c
            if not left:
                return out
            out = {"sampled_s": out["sampled_s"], "gone_after_confirm": len(left)}
        if end - t0 > cap:
            return {"capped": cap, "missing": len(left)}
        time.sleep(pause)


def idle(p: Proxy, seconds: float) -> dict[str, Any]:
    """CPU over `seconds` with nothing to do, sampled every second (the bursts: its syncs)."""
    samples = [cpu(p.pid)]
    t0 = time.perf_counter()
    while time.perf_counter() - t0 < seconds:
        time.sleep(1.0)
        samples.append(cpu(p.pid))
    took = time.perf_counter() - t0
    steps = [b - a for a, b in itertools.pairwise(samples)]
    bursts: list[float] = []
    quiet = True
    for s in steps:
        if s >= 0.05:
            if quiet:
                bursts.append(0.0)
            bursts[-1] += s
            quiet = False
        else:
            quiet = True
    total = samples[-1] - samples[0]
    return {"cpu_s": total, "seconds": took, "per_period_s": total / took * SYNC_PERIOD,
            "bursts": [round(b, 2) for b in bursts]}


def changes(p: Proxy, probe: Any, series: list[Change], svc_objs: dict[int, Any], m: int,
            conn: Connection, rate: float, cap: float) -> dict[str, Any]:
    """The change series, open loop at `rate` a second; every change polled until the kernel
    holds its new pod (each poll at 5% of its age, at least 10 ms apart). The proxy's resident
    memory is sampled every RSS_EVERY seconds meanwhile: one sample at the end falls inside or
    between a large cluster's periodic full syncs by chance (at 50,000 services a full sync's
    read runs most of the time and holds both sides), the mean over the series does not."""
    pending: dict[int, tuple[Change, float, float]] = {}  # n -> (change, acked, next poll)
    latency: dict[int, float] = {}
    lost: list[int] = []
    put_s: list[float] = []
    rss: list[float] = []
    sent = polls = 0
    start = time.perf_counter()
    cpu0 = cpu(p.pid)
    next_rss = start
    while sent < len(series) or pending:
        now = time.perf_counter()
        if sent < len(series) and now >= start + sent / rate:
            c = series[sent]
            obj = slice_of(c, svc_objs[c.svc.index], m)
            t = time.perf_counter()
            status, body = conn.request("PUT", path(obj, name=True), obj)
            acked = time.perf_counter()
            if status >= 300:
                raise RuntimeError(f"PUT {obj['metadata']}: {status} {body.get('message')}")
            put_s.append(acked - t)
            pending[sent] = (c, acked, acked)
            sent += 1
            continue
        if now >= next_rss:
            rss.append(memory(p.pid)["VmRSS"])
            next_rss = now + RSS_EVERY
        due = [n for n, (_, _, nxt) in pending.items() if nxt <= now]
        for n in due:
            c, acked, _ = pending[n]
            if probe.has(c.svc, c.new_ip(m)):
                latency[n] = time.perf_counter() - acked
                del pending[n]
            elif now - acked > cap:
                lost.append(n)
                del pending[n]
            else:
                # 5% of its age, and never more than POLLS a second in all: a proxy far behind
                # has hundreds of changes pending, and polling each every few milliseconds
                # would take the CPU the proxy needs
                wait = max(0.01, 0.05 * (now - acked), len(pending) / POLLS)
                pending[n] = (c, acked, time.perf_counter() + wait)
                polls += 1
        if not due:
            p.alive()
            nxt = min([x for _, _, x in pending.values()]
                      + ([start + sent / rate] if sent < len(series) else []))
            time.sleep(max(0.0, min(0.05, nxt - time.perf_counter())))
    took = time.perf_counter() - start
    used = cpu(p.pid) - cpu0
    measured = [latency[n] for n, c in enumerate(series) if c.measured and n in latency]
    return {"changes": len(series), "measured": len(measured), "lost": len(lost),
            "p50_s": percentile(measured, 0.5) if measured else None,
            "p99_s": percentile(measured, 0.99) if measured else None,
            "max_s": max(measured) if measured else None,
            "cpu_s": used, "cpu_per_1000_s": used / len(series) * 1000, "seconds": took,
            "put_p50_s": percentile(put_s, 0.5), "polls": polls,
            "rss_mean_mb": sum(rss) / len(rss) if rss else None,
            "rss_max_mb": max(rss) if rss else None, "rss_samples": len(rss)}


def revert(series: list[Change], svc_objs: dict[int, Any], m: int, conn: Connection) -> None:
    """Every changed service's slice back to version 0, for the next proxy's cold start."""
    first = {c.svc.index: c.svc for c in series}
    for i, svc in sorted(first.items()):
        obj = slice_of(Change(svc, 0, False), svc_objs[i], m)
        status, body = conn.request("PUT", path(obj, name=True), obj)
        if status >= 300:
            raise RuntimeError(f"revert {obj['metadata']}: {status} {body.get('message')}")


def run_variant(v: Variant, size: int, m: int, expected: Expected, series: list[Change],
                svc_objs: dict[int, Any], args: argparse.Namespace, work: Path,
                kubeconfig: Path, remote: Any, sysctls: dict[str, str]) -> dict[str, Any]:
    from bench.peers_dataplane import measure
    from bench.peers_kernel import probe as make_probe

    clean(sysctls)
    p = Proxy(v, work, kubeconfig, args.logs / f"{size}")
    probe = make_probe(v.mode)
    out: dict[str, Any] = {"variant": v.name, "mode": v.mode, "min_sync": v.min_sync}
    conn = Connection(remote.url, remote.ca_pem, remote.admin_token)
    try:
        t0 = p.start()
        out["cold"] = c = cold(p, probe, expected, t0, args.cold_cap, random.Random(size))
        if "capped" in c:
            print(f"measured: {size} {v.name}: cold node did not finish in {args.cold_cap:.0f}s",
                  flush=True)
            return out
        print(f"measured: {size} {v.name}: cold node {c['cold_s']:.1f}s (sampled "
              f"{c['sampled_s']:.1f}s, last check {c['check_s']:.2f}s of {c['checks']}, "
              f"confirmed in {c['confirm_s']:.1f}s), "
              f"CPU {c['cpu_s']:.1f}s", flush=True)
        time.sleep(5.0)
        out["memory_first"] = mem = memory(p.pid)
        out["rss_first_mb"] = mem["VmRSS"]
        out["idle"] = idle(p, args.idle)
        print(f"measured: {size} {v.name}: RSS {out['rss_first_mb']:.0f} MB, idle CPU "
              f"{out['idle']['per_period_s']:.2f}s per {SYNC_PERIOD:.0f}s "
              f"(bursts {out['idle']['bursts']})", flush=True)
        out["changes"] = ch = changes(p, probe, series, svc_objs, m, conn, args.rate,
                                      args.change_cap)
        out["memory_after"] = mem = memory(p.pid)
        out["rss_after_mb"] = mem["VmRSS"]
        # every measured change may be past the cap (kube-proxy IPVS at 10,000 services)
        p50, p99 = (f"{ch[k]:.3f}s" if ch[k] is not None else f"> {args.change_cap:.0f}s"
                    for k in ("p50_s", "p99_s"))
        print(f"measured: {size} {v.name}: {ch['measured']} changes p50 "
              f"{p50} p99 {p99}, CPU {ch['cpu_per_1000_s']:.1f}s "
              f"per 1,000 ({ch['lost']} lost), RSS {mem['VmRSS']:.0f} MB (anon "
              f"{mem.get('RssAnon', 0):.0f}, file {_mapped(mem) or 0:.0f}, peak "
              f"{mem.get('VmHWM', 0):.0f}, {mem.get('Threads', 0):.0f} threads)", flush=True)
        if size in args.dataplane_sizes or not args.dataplane_sizes:
            try:
                out["dataplane"] = d = measure(DP_IP, DP_PORT, args.dp_samples,
                                               args.dp_seconds)
            except RuntimeError as exc:
                out["dataplane_error"] = str(exc)
                print(f"FAILED: {size} {v.name}: dataplane: {exc}", flush=True)
                return out
            print(f"measured: {size} {v.name}: dataplane {d['connections_per_s']:.0f} conn/s, "
                  f"connect p50 {d['connect_p50_ms']:.2f} ms p99 {d['connect_p99_ms']:.2f} ms",
                  flush=True)
    finally:
        p.stop()
        probe.close()
        revert(series, svc_objs, m, conn)
        conn.close()
        out["log_tail"] = "\n".join(p.log.read_text(errors="replace").splitlines()[-5:])
    return out


def warm_up(variants: list[Variant], work: Path, kubeconfig: Path, sysctls: dict[str, str],
            logs: Path) -> None:
    """Each proxy once on the base cluster (the dataplane service), untimed: it loads the kernel
    modules its mode uses, which otherwise the first timed proxy would pay for."""
    from bench.peers_kernel import probe as make_probe

    dp = Service(-1, DP_NAMESPACE, DP_NAME, "TCP", DP_IP, DP_PORT, "p", DP_POD_PORT)
    for v in {(v.binary, v.mode): v for v in variants}.values():
        clean(sysctls)
        p = Proxy(v, work, kubeconfig, logs)
        probe = make_probe(v.mode)
        try:
            t0 = p.start()
            while not probe.has(dp, DP_PODS[0]):
                p.alive()
                if time.perf_counter() - t0 > 600:
                    raise RuntimeError(f"{v.name} did not program the dataplane service")
                time.sleep(0.5)
            print(f"warm-up: {v.name} programmed the base cluster in "
                  f"{time.perf_counter() - t0:.1f}s", flush=True)
        finally:
            p.stop()
            probe.close()


# --------------------------------------------------------------------------------- table

ROWS = (  # key, label, unit, target against kube-proxy IPVS (None: none)
    ("cold", "cold node: start to every endpoint in the kernel", "s", 0.5),
    ("cold_cpu", "  CPU seconds of that first sync", "s", None),
    ("p50", "endpoint change to kernel, p50", "s", None),
    ("p99", "endpoint change to kernel, p99", "s", 0.5),
    ("cpu_change", "CPU seconds per 1,000 endpoint changes", "s", 0.5),
    ("idle", f"idle: CPU seconds per {SYNC_PERIOD:.0f} s sync period", "s", None),
    ("rss_first", "resident memory after the first sync", "MB", 1.0),
    ("rss_after", "resident memory after the changes", "MB", 1.0),
    ("rss_mean", f"  mean over the change series (every {RSS_EVERY:.0f} s)", "MB", None),
    ("peak", "  peak (VmHWM) by the end of the changes", "MB", None),
    ("anon_after", "  of it the process's own (RssAnon: heap, stacks)", "MB", None),
    ("file_after", "  of it its binary's and libraries' pages (RssFile+Shmem)", "MB", None),
    ("dp_rate", "dataplane: new TCP connections per second (higher is better)", "/s", None),
    ("dp_p50", "dataplane: connect latency p50", "ms", None),
    ("dp_p99", "dataplane: connect latency p99", "ms", None),
)


def figures(r: dict[str, Any]) -> dict[str, float | None]:
    c, ch, d = r.get("cold", {}), r.get("changes", {}), r.get("dataplane", {})
    return {"cold": c.get("cold_s"), "cold_cpu": c.get("cpu_s"), "p50": ch.get("p50_s"),
            "p99": ch.get("p99_s"), "cpu_change": ch.get("cpu_per_1000_s"),
            "idle": r.get("idle", {}).get("per_period_s"), "rss_first": r.get("rss_first_mb"),
            "rss_after": r.get("rss_after_mb"), "rss_mean": ch.get("rss_mean_mb"),
            "peak": r.get("memory_after", {}).get("VmHWM"),
            "anon_after": r.get("memory_after", {}).get("RssAnon"),
            "file_after": _mapped(r.get("memory_after", {})),
            "dp_rate": d.get("connections_per_s"),
            "dp_p50": d.get("connect_p50_ms"), "dp_p99": d.get("connect_p99_ms")}


def _mapped(mem: dict[str, float]) -> float | None:
    """The binary's and libraries' pages: on disk (RssFile) or in tmpfs (RssShmem)."""
    return None if "RssFile" not in mem else mem["RssFile"] + mem.get("RssShmem", 0.0)


def rows(size: int, results: dict[str, dict[str, Any]], cap: float,
         change_cap: float = 1800.0) -> list[dict[str, Any]]:
    """One row per figure: every proxy's value and ipvsproxy / that proxy."""
    figs = {name: figures(r) for name, r in results.items()}
    ours = figs.get("ipvsproxy", {})
    out = []
    for key, label, unit, target in ROWS:
        row: dict[str, Any] = {"size": size, "figure": label, "key": key, "unit": unit,
                               "values": {}, "ratios": {}}
        for name, f in figs.items():
            val = f[key]
            if val is None and "capped" in results[name].get("cold", {}):
                row["values"][name] = f"> {cap:.0f} s" if key == "cold" else "-"
            elif val is None and key in ("p50", "p99") and \
                    results[name].get("changes", {}).get("lost"):
                row["values"][name] = f"> {change_cap:.0f} s"  # none reached the kernel in time
            else:
                row["values"][name] = val
            if name != "ipvsproxy" and isinstance(val, float) and isinstance(ours.get(key),
                                                                              float) and val:
                row["ratios"][name] = ours[key] / val  # type: ignore[operator]
        if target is not None:
            got = row["ratios"].get("kube-proxy-ipvs")
            row["target"] = target
            row["met"] = None if got is None else got <= target
        out.append(row)
    return out


def fmt(v: Any, unit: str) -> str:
    if v is None:
        return "-"
    if isinstance(v, str):
        return v
    if unit == "MB":
        return f"{v:.0f}"
    if unit == "/s":
        return f"{v:,.0f}"
    if unit == "ms":
        return f"{v:.2f}"
    return f"{v:.3f}" if v < 1 else f"{v:.1f}" if v < 100 else f"{v:,.0f}"


def table(all_rows: list[dict[str, Any]], names: list[str]) -> str:
    """Markdown: one line per (size, figure); ipvsproxy's value, then each peer's value and
    the ratio ipvsproxy / peer; the target against kube-proxy IPVS."""
    peers = [n for n in names if n != "ipvsproxy"]
    head = ["services", "figure", "ipvsproxy"]
    for n in peers:
        head += [n, "ratio"]
    head += ["target (vs kube-proxy-ipvs)", "met?"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for r in all_rows:
        cells = [f"{r['size']:,}", f"{r['figure']} ({r['unit']})",
                 fmt(r["values"].get("ipvsproxy"), r["unit"])]
        for n in peers:
            ratio = r["ratios"].get(n)
            cells += [fmt(r["values"].get(n), r["unit"]), "-" if ratio is None else f"{ratio:.2f}"]
        cells += ["-" if "target" not in r else f"<= {r['target']}",
                  "-" if r.get("met") is None else "yes" if r["met"] else "NO"]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


# ---------------------------------------------------------------------------------- main


def main(argv_: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--sizes", default="1000")
    ap.add_argument("--dests", type=int, default=10)
    ap.add_argument("--changes", type=int, default=200, help="measured endpoint changes")
    ap.add_argument("--background", type=int, default=200, help="background changes among them")
    ap.add_argument("--rate", type=float, default=4.0, help="changes a second, all together")
    ap.add_argument("--proxies", default=",".join(VARIANTS))
    ap.add_argument("--idle", type=float, default=2 * SYNC_PERIOD)
    ap.add_argument("--cold-cap", type=float, default=3600.0,
                    help="seconds a cold node may take before the proxy's rows are skipped")
    ap.add_argument("--change-cap", type=float, default=1800.0)
    ap.add_argument("--dataplane-sizes", default="", help="sizes with the dataplane rows "
                    "(empty: every size)")
    ap.add_argument("--dp-samples", type=int, default=1000)
    ap.add_argument("--dp-seconds", type=float, default=10.0)
    ap.add_argument("--from", dest="start_from", choices=("node", "9p"), default="node",
                    help="node: each proxy copied into the guest's tmpfs as a node has it "
                         "(bench/node_install.py); 9p: from the checkout over the lab's 9p")
    ap.add_argument("--profile", action="store_true",
                    help="run ipvsproxy under cProfile (its main thread: the syncs) and print "
                         "where its time went; its figures are then inflated, not for tables")
    ap.add_argument("--skip", default="",
                    help="proxy@size,...: not run at that size (kube-proxy-iptables@10000: its "
                         "first sync at 10,000 services did not end in 20 minutes here)")
    ap.add_argument("--commit", default="")
    ap.add_argument("--out", default=str(ROOT / "bench" / "results"))
    args = ap.parse_args(argv_)
    sizes = [int(s) for s in args.sizes.split(",")]
    args.dataplane_sizes = {int(s) for s in args.dataplane_sizes.split(",") if s}
    variants = [VARIANTS[n] for n in args.proxies.split(",")]
    skips = set()
    for item in filter(None, args.skip.split(",")):
        name, _, at = item.partition("@")
        if name not in VARIANTS or name == "ipvsproxy" or not at.isdigit():
            ap.error(f"--skip {item}: a peer's name @ a size")
        skips.add((name, int(at)))
    # the proxies' logs, where the host can read them: bench/results/peers-logs/
    args.logs = Path(args.out) / "peers-logs"
    (args.logs / "warm-up").mkdir(parents=True, exist_ok=True)
    if variants[0].name != "ipvsproxy":
        ap.error("--proxies: ipvsproxy comes first (the ratios are ipvsproxy / peer)")

    import tempfile

    from bench import peers_dataplane
    from integration.upstream.remote import Remote
    from tests.differential import snapshot

    remote = Remote.from_file(os.environ["IPVSPROXY_CONTROLPLANE"])
    work = Path(tempfile.mkdtemp(prefix="peers-"))
    node_up(remote)
    kubeconfig = remote.kubeconfig(work / "admin.kubeconfig")
    global INSTALLED, PROFILE
    PROFILE = args.profile
    if args.start_from == "node":
        t = time.perf_counter()
        INSTALLED = install(Path("/tmp/ipvsproxy-node"), upstream_bin() / "kube-proxy")
        print(f"installed: ipvsproxy and kube-proxy in the guest's tmpfs, as on a node "
              f"({time.perf_counter() - t:.0f}s)", flush=True)
    # a cluster node forwards (its CNI sets ip_forward; kube-proxy's iptables and nftables
    # modes rely on it and do not set it): take it into the state each proxy starts from, or
    # clean() turns it off again and those modes' ClusterIPs drop every packet from a pod
    # (their dataplane rows timed out on 2026-11-27 while IPVS, local to kube-ipvs0, worked)
    sh("sysctl -qw net.ipv4.ip_forward=1")
    sysctls = snapshot.sysctl_values(snapshot.read()["sysctls"])
    peers_dataplane.up()
    started = time.strftime("%Y-%m-%d %H:%M")
    doc: dict[str, Any] = {"date": started, "commit": args.commit, "kernel": os.uname().release,
                           "emulated": True, "started_from": args.start_from,
                           "sync_period_s": SYNC_PERIOD, "rate": args.rate,
                           "sizes": {}, "rows": []}
    try:
        warm_up(variants, work, kubeconfig, sysctls, args.logs / "warm-up")
        for size in sizes:
            t = time.perf_counter()
            loaded = remote.call("POST", f"/load?services={size}&dests={args.dests}",
                                    timeout=4 * 3600)
            print(f"loaded: {loaded} (guest waited {time.perf_counter() - t:.0f}s)", flush=True)
            docs = generate(size, args.dests)
            svcs = services(docs)
            svc_objs = {s.index: d for s, d in zip(
                svcs, (d for d in docs if d["kind"] == "Service"
                       and d["metadata"]["name"].startswith("svc-")), strict=True)}
            del docs
            dp = Service(-1, DP_NAMESPACE, DP_NAME, "TCP", DP_IP, DP_PORT, "p", DP_POD_PORT)
            expected: Expected = [(s, [pod_ip(s.index, j, args.dests) for j in range(args.dests)])
                                  for s in svcs] + [(dp, list(DP_PODS))]
            series = change_series(svcs, args.changes, args.background)
            (args.logs / f"{size}").mkdir(parents=True, exist_ok=True)
            results: dict[str, dict[str, Any]] = {}
            for v in variants:
                if (v.name, size) in skips:
                    print(f"skipped: {size} {v.name} (--skip)", flush=True)
                    continue
                try:
                    results[v.name] = run_variant(v, size, args.dests, expected, series,
                                                  svc_objs, args, work, kubeconfig, remote,
                                                  sysctls)
                except Exception as exc:  # the other proxies still run
                    import traceback

                    traceback.print_exc()
                    results[v.name] = {"variant": v.name, "error": f"{type(exc).__name__}: "
                                                                   f"{exc}"[:3000]}
            doc["sizes"][str(size)] = {"loaded": loaded, "variants": results}
            doc["rows"] += rows(size, results, args.cold_cap, args.change_cap)
            print("\n" + table([r for r in doc["rows"] if r["size"] == size],
                               [v.name for v in variants]) + "\n", flush=True)
    finally:
        clean(sysctls)
        peers_dataplane.down()
        sh(f"ip link del {NODE_IF}", check=False)
        out = Path(args.out)
        out.mkdir(parents=True, exist_ok=True)
        stamp = time.strftime("%Y%m%dT%H%M%S")
        (out / f"peers-{stamp}.json").write_text(json.dumps(doc, indent=1, default=str) + "\n")
    print(f"\nipvsproxy and kube-proxy v1.35.4, side by side: {started}, commit {args.commit}, "
          f"kernel {doc['kernel']}, proxies started from {args.start_from} (software emulation: "
          f"ratios only; ratio = ipvsproxy / peer)\n")
    print(table(doc["rows"], [v.name for v in variants]))
    if PROFILE:
        import pstats

        for prof in sorted(args.logs.glob("*/ipvsproxy.prof")):
            print(f"\n{prof} (cumulative, the daemon's main thread):")
            pstats.Stats(str(prof)).sort_stats("cumulative").print_stats("ipvsproxy/", 45)
    for v in variants:
        if v.note:
            print(f"- {v.name}: {v.note}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
