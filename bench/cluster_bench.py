"""Cluster-size benchmarks (issue 8, items 1, 2, 3 and 5), inside the lab, on a generated
cluster (bench/cluster_gen.py: 10,000 services x 10 endpoints and default/kubernetes).

1. Cold start: the installed command, `ipvsproxy sync --once --from-file`, started as a user
   starts it (a new process: interpreter start and imports included), from an empty kernel to
   fully programmed, once from the dump as JSON and once as YAML (as `kubectl get
   services,endpointslices,nodes -A -o json` / `-o yaml` write it), each against the C tools
   doing the same kernel work: what our sync left (`ipvsadm -Sn`, `ipset save`,
   `iptables-save`, the kube-ipvs0 addresses) loaded again from empty by `ipset restore`,
   `iptables-restore`, `ipvsadm -R` and `ip -batch`. Also the moment the kubernetes ClusterIP
   first answers (a prober connects to 10.96.0.1:443 every 20 ms and counts it up only when the
   API "server", a listener in a network namespace of its own behind IPVS, sends its banner),
   where the command's time went before that (its log line: the sync's own seconds, and when
   it had programmed the first services), and the sets' fill after the sync (members against
   maxelem: no overflow).
2. Full resync with nothing to change: observe + diff in process (the daemon holds the desired
   state already), against `ipvsadm -Sn` + `ipset save`: the best of RESYNC_REPEAT runs of
   each, taken in turn (a run is seconds, and both sides vary by 10-20% under emulation).
3. One endpoint change through the daemon (`ipvsproxy run` against the test API server): 200
   EndpointSlice updates, each replacing one pod of a ClusterIP service; the time from the
   update to the kernel holding the new real server, p50 and p99, at 10,000 and at 100
   services; and the kernel operations the daemon counted for them. Run twice: as the kernel
   runs by default, then with IPVS's rate estimator off (its pre-6.2 timer stalls a CPU for a
   time that grows with the number of services and real servers), each with the kernel's
   stalls measured and the slowest changes named with the syncs that started in them.
5. Memory: the daemon's resident set (VmRSS, and its peak VmHWM) with the 10,000 services
   loaded and programmed (target 150 MB; 450 MB at 50,000, `make bench-large`).

Other commands (the daemon, untimed syncs) run forked from a process that imported ipvsproxy
(tests/kernel/forked.py).
"""

from __future__ import annotations

import argparse
import gc
import json
import random
import re
import socket
import statistics
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from datetime import datetime
from ipaddress import ip_address
from pathlib import Path
from typing import Any

from bench import procstat
from bench.cluster_gen import (
    API_IP,
    API_PORT,
    CLUSTER_CIDR,
    KUBERNETES_IP,
    NODE,
    NODE_IP,
    endpoint_slice,
    generate,
    pod_ip,
)

# NodePorts on the node IP only (the lab's other addresses would multiply them)
FLAGS = ["--hostname-override", NODE, "--cluster-cidr", CLUSTER_CIDR, "--ip-families", "4",
         "--nodeport-addresses", f"{NODE_IP}/32"]
NODE_IF = "bench0"
API_NS = "bench-api"
METRICS = "127.0.0.1:10249"
BANNER = b"apiserver\n"

Row = Callable[..., None]
FORMATS = frozenset({"JSON", "YAML"})


def sh(cmd: str, stdin: str | None = None) -> str:
    return subprocess.run(cmd, shell=True, input=stdin, text=True, check=True,
                          capture_output=True).stdout


# ------------------------------------------------------------------------------ the node

def node_up() -> None:
    """The node's address, and the API server's: a namespace behind a veth pair, with a
    listener that sends BANNER to whoever connects."""
    sh(f"ip link add {NODE_IF} type dummy && ip addr add {NODE_IP}/24 dev {NODE_IF} "
       f"&& ip link set {NODE_IF} up")
    sh(f"ip netns add {API_NS} && ip link add bapi0 type veth peer name bapi1 netns {API_NS} "
       f"&& ip addr add 192.168.77.1/24 dev bapi0 && ip link set bapi0 up "
       f"&& ip -n {API_NS} addr add {API_IP}/24 dev bapi1 && ip -n {API_NS} link set bapi1 up "
       f"&& ip -n {API_NS} link set lo up && ip -n {API_NS} route add default via 192.168.77.1")
    server = (f"import socket\ns = socket.create_server(('{API_IP}', {API_PORT}))\n"
              "while True:\n    c, _ = s.accept()\n    c.sendall(%r)\n    c.close()\n" % BANNER)
    subprocess.Popen(["ip", "netns", "exec", API_NS, "python3", "-c", server])


def node_down() -> None:
    subprocess.run(f"ip netns pids {API_NS} | xargs -r kill; ip netns del {API_NS}; "
                   f"ip link del bapi0; ip link del {NODE_IF}", shell=True, check=False,
                   capture_output=True)


def clean() -> None:
    from tests.kernel import forked

    forked.check("cleanup")
    sh("ipvsadm -C; iptables -t nat -F; iptables -t nat -X; iptables -t filter -F; "
       "iptables -t filter -X; ipset destroy; ip link del kube-ipvs0 2>/dev/null; true")


class Prober(threading.Thread):
    """Connects to the kubernetes ClusterIP until the API server's banner comes back."""

    def __init__(self) -> None:
        super().__init__(daemon=True)
        self.t0 = time.perf_counter()
        self.answered: float | None = None
        self.stop = threading.Event()

    def run(self) -> None:
        while not self.stop.is_set():
            try:
                with socket.create_connection((KUBERNETES_IP, 443), timeout=0.2) as s:
                    s.settimeout(1.0)
                    if s.recv(64) == BANNER:
                        self.answered = time.perf_counter() - self.t0
                        return
            except OSError:
                pass
            self.stop.wait(0.02)


# ------------------------------------------------------------------------- 1. cold start

def c_tools_script() -> list[tuple[str, str]]:
    """What the kernel holds now, as (command, its input) for the C tools to load again."""
    addrs = re.findall(r"inet (\S+)", sh("ip -o -4 addr show dev kube-ipvs0"))
    batch = "link add kube-ipvs0 type dummy\n" + "".join(
        f"address add {a} dev kube-ipvs0\n" for a in addrs)
    return [("ipset restore", sh("ipset save")), ("iptables-restore", sh("iptables-save")),
            ("ipvsadm -R", sh("ipvsadm -Sn")), ("ip -batch -", batch)]


def warm_up(tmp: Path) -> None:
    """An untimed sync of a small cluster, cleaned up again: it loads the kernel modules that a
    node running any service proxy already has (ip_vs and its scheduler, the ip_set types, the
    xt matches, nf_tables: 28 modules, 2.2 s in the lab). Otherwise the first cold start, ours,
    would pay for loading them and the C tools after it would not."""
    from tests.kernel import forked

    small = tmp / "warm-up.json"
    small.write_text(json.dumps({"kind": "List", "items": generate(50, 2)}))
    clean()
    forked.check("sync", "--once", "--from-file", str(small), *FLAGS)
    clean()


def command() -> list[str]:
    """The installed `ipvsproxy` entry point, as a user runs it (the virtualenv's bin)."""
    script = Path(sys.executable).with_name("ipvsproxy")
    return [str(script)] if script.exists() else [sys.executable, "-m", "ipvsproxy"]


def write_dumps(docs: list[Any], tmp: Path, formats: frozenset[str] = FORMATS
                ) -> dict[str, Path]:
    """The cluster as `kubectl get services,endpointslices,nodes -A -o json` and `-o yaml`
    write it (JSON always: the untimed sync reads it): one `kind: List`, the YAML in block
    style."""
    import yaml

    dump = {"apiVersion": "v1", "kind": "List", "items": docs,
            "metadata": {"resourceVersion": ""}}
    out = {"JSON": tmp / "cluster.json"}
    out["JSON"].write_text(json.dumps(dump, indent=4))
    if "YAML" in formats:
        out["YAML"] = tmp / "cluster.yaml"
        with out["YAML"].open("w") as f:
            yaml.dump(dump, f, Dumper=getattr(yaml, "CSafeDumper", yaml.SafeDumper),
                      default_flow_style=False)
    return {k: v for k, v in out.items() if k in formats}


def ipset_fill() -> list[tuple[str, int, int]]:
    """(set, members, capacity) of every set in the kernel (`ipset list -t`): a hash set's
    maxelem, a bitmap's range."""
    out = []
    for block in sh("ipset list -t").split("Name: ")[1:]:
        name = block.split("\n", 1)[0].strip()
        members = re.search(r"^Number of entries: (\d+)", block, re.M)
        maxelem = re.search(r"\bmaxelem (\d+)", block)
        span = re.search(r"\brange (\d+)-(\d+)", block)
        assert members, block
        if maxelem:
            cap = int(maxelem.group(1))
        else:
            assert span, block
            cap = int(span.group(2)) - int(span.group(1)) + 1
        out.append((name, int(members.group(1)), cap))
    return out


def sync_log(stderr: str) -> dict[str, Any]:
    """The `sync` line of `ipvsproxy --log-format json sync --once`'s log."""
    for line in stderr.splitlines():
        if line.startswith("{"):
            entry = json.loads(line)
            if entry.get("event") == "sync":
                return dict(entry)
    raise AssertionError(f"no sync line in the log: {stderr[-2000:]}")


def cold_start(paths: dict[str, Path], n_vs: int, repeat: int, row: Row,
               info: Callable[[str, Any], None]) -> None:
    """Run when the kernel holds what an untimed sync of the cluster made: the C tools' input is
    taken from it. Each run then: `ipvsproxy sync --once --from-file` from an empty kernel, the
    installed command in a new process (interpreter start and imports included), from each of
    `paths` (JSON, YAML); then the C tools loading the same state. The kernel is cleaned
    before each."""
    argv = command()
    script = c_tools_script()
    saved = sh("ipvsadm -Sn")
    assert saved.count("-A ") == n_vs, (saved.count("-A "), n_vs)
    fill = ipset_fill()
    name, members, maxelem = max(fill, key=lambda f: f[1] / f[2])
    info("ipset sets after the sync (set: members / maxelem or range)",
         ", ".join(f"{n}: {k}/{x}" for n, k, x in fill))
    row(f"ipset fullest set ({name}), members / maxelem", members, maxelem, "maxelem", 0.999,
        unit="")
    ours: dict[str, list[float]] = {k: [] for k in paths}
    firsts: dict[str, list[float]] = {k: [] for k in paths}
    logs: dict[str, list[dict[str, Any]]] = {k: [] for k in paths}
    theirs: list[float] = []
    for _ in range(repeat):
        for kind, path in paths.items():
            clean()
            probe = Prober()
            probe.start()
            t0 = time.perf_counter()
            p = subprocess.run([*argv, "--log-format", "json", "sync", "--once", "--from-file",
                                str(path), *FLAGS],
                               capture_output=True, text=True, timeout=6000, check=False)
            ours[kind].append(time.perf_counter() - t0)
            probe.stop.set()
            probe.join()
            assert p.returncode == 0, p.stderr[-2000:]
            assert probe.answered is not None, "the kubernetes ClusterIP never answered"
            firsts[kind].append(probe.answered)
            logs[kind].append(sync_log(p.stderr))
            print(f"measured: cold start, the command from {kind}, {ours[kind][-1]:.1f}s, "
                  f"kubernetes answered at {probe.answered:.2f}s", flush=True)
            assert sh("ipvsadm -Sn") == saved, f"the sync from {kind} differs"
        clean()
        t0 = time.perf_counter()
        for cmd, text in script:
            sh(cmd, text)
        theirs.append(time.perf_counter() - t0)
        assert sh("ipvsadm -Sn") == saved, "the C tools did not load the same table"
        print(f"measured: the C tools {theirs[-1]:.1f}s", flush=True)
    n_rs = saved.count("-a ")
    ref = "ipset+iptables-restore+ipvsadm -R+ip -batch"
    for kind in paths:
        row(f"cold start {n_vs} VS, {n_rs} RS, `ipvsproxy sync --once` from {kind}",
            min(ours[kind]), min(theirs), ref, 1.0)
    best = {kind: ours[kind].index(min(ours[kind])) for kind in paths}  # the fastest run's
    for kind, i in best.items():
        # before the sync's clock: interpreter start, imports, reading and parsing the file
        log = logs[kind][i]
        before = ours[kind][i] - log["seconds"]
        info(f"  the command from {kind}: before the sync (start, imports, reading the file)",
             f"{before:.2f}s; first services programmed {log.get('first_services_seconds')}s "
             f"into the sync; the sync {log['seconds']:.1f}s")
    kind = next(iter(paths))
    i = best[kind]
    row(f"  first service (kubernetes) answers, the command from {kind}", firsts[kind][i],
        ours[kind][i], "the cold start", 0.05)


# --------------------------------------------------------------------------- 2. resync

RESYNC_REPEAT = 3


def resync(des: Any, repeat: int, row: Row) -> None:
    """Run after an ipvsproxy sync of the cluster: the kernel already holds `des`."""
    repeat = max(repeat, RESYNC_REPEAT)
    from ipvsproxy.core.gcpause import paused
    from ipvsproxy.core.plan import diff
    from ipvsproxy.kernel import dataplane

    best_ours = best_ref = float("inf")
    for _ in range(repeat):
        t0 = time.perf_counter()
        with paused():  # as in the daemon's full sync (Reconciler._full)
            plan = diff(des, dataplane.observe(des))
        best_ours = min(best_ours, time.perf_counter() - t0)
        assert not plan.steps, plan.lines()[:10]
        t0 = time.perf_counter()
        sh("ipvsadm -Sn")
        sh("ipset save")
        best_ref = min(best_ref, time.perf_counter() - t0)
    row(f"resync, nothing to change, {len(des.services)} VS (observe+diff)", best_ours,
        best_ref, "ipvsadm -Sn + ipset save", 1.0)


# ------------------------------------------------------------- 3. and 5. the daemon

def _metrics() -> dict[str, float]:
    from tests.kernel.test_daemon import metrics_or_empty

    return metrics_or_empty()


def daemon_run(n: int, m: int, changes: int, tmp: Path) -> dict[str, Any]:
    """The daemon against the test API server with n services x m endpoints: seconds to
    program them, its memory, then `changes` endpoint changes, one at a time."""
    from ipvsproxy.core.ipvs import Protocol, ServiceKey
    from ipvsproxy.kernel.ipvs import IpvsClient
    from tests.apiserver import ApiServer
    from tests.kernel import forked
    from tests.kernel.test_daemon import HEALTHZ, operations

    docs = generate(n, m)
    services = {d["metadata"]["name"]: d for d in docs if d["kind"] == "Service"}
    clean()
    api = ApiServer()
    api.start()
    api.load(docs)
    del docs  # the API server holds its own copy; the changes need only the Services
    # this process (the test API server, the poller) now holds two copies of the cluster:
    # out of its collector's way, so that its collections do not land on the measured changes
    gc.collect()
    gc.freeze()
    t0 = time.perf_counter()
    d = forked.start(["--log-format", "json", "run", "--kubeconfig",
                      str(api.kubeconfig(tmp / "kubeconfig")), *FLAGS,
                      # no periodic full resync in the way: under emulation one at 10,000
                      # services takes about a minute, and each change would wait for it
                      "--ipvs-sync-period", "1h",
                      "--ipvs-min-sync-period", "0s", "--healthz-bind-address", HEALTHZ,
                      "--metrics-bind-address", METRICS, "--service-metrics", "false"],
                     tmp / f"daemon-{n}.log")
    out: dict[str, Any] = {}
    try:
        want = len(services)  # >= 1 VS each
        while True:
            got = _metrics()
            if got.get('ipvsproxy_syncs_total{mode="full",result="ok"}', 0) >= 1:
                break
            assert d.poll() is None, (tmp / f"daemon-{n}.log").read_text()[-3000:]
            assert time.perf_counter() - t0 < 3000, "the daemon never synced"
            time.sleep(0.5)
        out["programmed_s"] = time.perf_counter() - t0
        print(f"measured: daemon at {n} services programmed in {out['programmed_s']:.1f}s",
              flush=True)
        assert got.get("ipvsproxy_virtual_servers", 0) >= want, got.get("ipvsproxy_virtual_servers")
        time.sleep(2.0)  # settle: the first sync's garbage is collected
        out["rss_mb"] = procstat.kb(d.pid, "VmRSS") / 1024
        out["hwm_mb"] = procstat.kb(d.pid, "VmHWM") / 1024
        # the changes: ClusterIP services whose replaced pod is not on this node (so the kernel
        # work is exactly one real server added and one deleted, no hairpin set entry); a
        # service changed again replaces the same pod again (cluster_gen.pod_ip: version v
        # replaces pod v % m), so each change is still one pod
        rng = random.Random(8)
        clusterip = [i for i in range(n) if services[f"svc-{i}"]["spec"]["type"] == "ClusterIP"]
        versions: dict[int, int] = {}

        def change() -> tuple[float, float]:
            """One change: (wall clock at the update, seconds until the kernel had it)."""
            i = rng.choice(clusterip)
            svc = services[f"svc-{i}"]
            if i in versions:
                version = versions[i] + m
            else:
                version = next(v for v in range(1, m + 1) if (i * 7 + v % m) % 50 != 0)
            versions[i] = version
            port = svc["spec"]["ports"][0]
            key = ServiceKey.inet(Protocol[port["protocol"]],
                                  ip_address(svc["spec"]["clusterIP"]), port["port"])
            new = ip_address(pod_ip(i, version % m, m, version))
            start = time.time()
            t1 = time.perf_counter()
            api.put(endpoint_slice(i, svc, m, version))
            while True:
                vs = ipvs.get_service(key)
                if vs is not None and any(x.dest.key.addr == new for x in vs.dests):
                    return start, time.perf_counter() - t1
                assert time.perf_counter() - t1 < 600, f"change {version} never arrived"
                time.sleep(0.002)

        first = _metrics()
        before = operations(first)
        # twice: as the kernel runs by default, then with its rate estimator off. Before
        # Linux 6.2 the estimator is a timer that walks every service's and real server's
        # counters in softirq every 2 s (net/netfilter/ipvs/ip_vs_est.c; kthreads since 6.2,
        # "ipvs: use kthreads for stats estimation"): at 50,000 services x 10 it holds one CPU
        # for ~250 ms of each 2 s under emulation, and a sync that lands there waits for it
        for est in ("1", "0"):
            sh(f"sysctl -qw net.ipv4.vs.run_estimation={est}")
            out[f"stalls{est}"] = kernel_stalls()
            with IpvsClient() as ipvs:
                timed = [change() for _ in range(changes)]
            lat = [d for _, d in timed]
            out[f"slowest{est}"] = slowest(lat, [t for t, _ in timed], tmp / f"daemon-{n}.log")
            lat.sort()
            out[f"p50_{est}"] = statistics.median(lat)
            out[f"p99_{est}"] = lat[max(0, round(0.99 * len(lat)) - 1)]
        sh("sysctl -qw net.ipv4.vs.run_estimation=1")
        time.sleep(1.0)  # the counters of the last sync
        last = _metrics()
        after = operations(last)
        out["ops"] = {k: after.get(k, 0) - before.get(k, 0) for k in after
                      if after.get(k, 0) != before.get(k, 0)}
        # the daemon's own time per sync (kube-proxy's SyncProxyRules latency) over the
        # changes: what of the end-to-end latency is the sync, and what is getting the event
        name = 'kubeproxy_sync_proxy_rules_duration_seconds_{}{{ip_family="IPv4"}}'
        syncs = last.get(name.format("count"), 0) - first.get(name.format("count"), 0)
        spent = last.get(name.format("sum"), 0) - first.get(name.format("sum"), 0)
        out["sync_mean"] = spent / syncs if syncs else float("nan")
        out["syncs"] = syncs
        # the C tool on the same kernel state: SIGTERM leaves the kernel as it is
        d.terminate()
        d.wait(120)
        keys = [ServiceKey.inet(Protocol[p["protocol"]], ip_address(s["spec"]["clusterIP"]),
                                p["port"])
                for s in (services[f"svc-{i}"] for i in clusterip) for p in s["spec"]["ports"][:1]]
        for i, est in enumerate(("1", "0")):
            sh(f"sysctl -qw net.ipv4.vs.run_estimation={est}")
            lat = peer_changes(keys, changes, rng, first=i * changes)
            out[f"peer_p50_{est}"] = statistics.median(lat)
            out[f"peer_p99_{est}"] = lat[max(0, round(0.99 * len(lat)) - 1)]
        sh("sysctl -qw net.ipv4.vs.run_estimation=1")
    finally:
        d.terminate()
        d.wait(120)
        api.stop()
        clean()
    return out


IPVSADM_PROTO = {"TCP": "-t", "UDP": "-u", "SCTP": "--sctp-service"}


def peer_changes(keys: list[Any], changes: int, rng: random.Random, first: int = 0
                 ) -> list[float]:
    """The kernel work of `changes` endpoint changes done by the C tool, one process each
    (`ipvsadm -R`: one real server added, one deleted, in a random virtual server of `keys`):
    the seconds from the process's start to its exit, sorted. What any proxy's change pays on
    this kernel, with no API server, event or diff in it. New real servers are numbered from
    `first`: a later call must not add one an earlier call left in the same service (ipvsadm
    fails on "Destination already exists")."""
    from ipvsproxy.kernel.ipvs import IpvsClient

    lat = []
    with IpvsClient() as ipvs:
        for k in range(first, first + changes):
            key = rng.choice(keys)
            old = ipvs.dests(key, stats=False)[0].dest.key
            vs = f"{IPVSADM_PROTO[key.protocol.name]} {key.addr}:{key.port}"
            new = f"10.250.{k >> 8 & 255}.{k & 255}:{old.port}"  # outside the cluster's pods
            script = f"-a {vs} -r {new} -m -w 1\n-d {vs} -r {old}\n"
            t0 = time.perf_counter()
            subprocess.run(["ipvsadm", "-R"], input=script, text=True, check=True)
            lat.append(time.perf_counter() - t0)
    return sorted(lat)


def kernel_stalls(seconds: float = 6.0) -> str:
    """How long the kernel kept this process off each CPU: a 1 ms busy loop pinned to the CPU,
    repeated; the loops that took over 20 ms (count, longest)."""
    import os

    cpus = sorted(os.sched_getaffinity(0))
    out = []
    try:
        for cpu in cpus:
            os.sched_setaffinity(0, {cpu})
            long: list[float] = []
            t0 = time.perf_counter()
            while time.perf_counter() - t0 < seconds / len(cpus):
                t = time.perf_counter()
                while time.perf_counter() - t < 0.001:
                    pass
                if (d := time.perf_counter() - t) > 0.02:
                    long.append(d)
            out.append(f"cpu{cpu}: {len(long)} over 20 ms"
                       + (f", longest {max(long) * 1000:.0f} ms" if long else ""))
    finally:
        os.sched_setaffinity(0, set(cpus))
    return "; ".join(out) + f" (in {seconds / len(cpus):.0f} s each)"


def slowest(lat: list[float], starts: list[float], log: Path, k: int = 4) -> str:
    """The k slowest changes, each with the syncs the daemon logged while it waited (mode and
    seconds): whether the time went into a sync or before it (the event's way to the store)."""
    syncs = []
    for line in log.read_text().splitlines():
        if line.startswith("{") and '"sync"' in line:
            e = json.loads(line)
            if e.get("event") == "sync":
                end = datetime.fromisoformat(e["timestamp"].replace("Z", "+00:00")).timestamp()
                syncs.append((end, e.get("mode"), e.get("seconds", 0.0)))
    out = []
    for i in sorted(range(len(lat)), key=lambda i: -lat[i])[:k]:
        t, d = starts[i], lat[i]
        # a sync that started after the update and before the kernel held it (its log line
        # may come after the poller saw the change)
        inside = [f"{mode} {sec * 1000:.0f} ms" for end, mode, sec in syncs
                  if t <= end - sec <= t + d]
        out.append(f"{d * 1000:.0f} ms (change {i}; syncs started in it: "
                   f"{', '.join(inside) or 'none'})")
    return "; ".join(out)


# ------------------------------------------------------------------------------- all

def memory_target(services: int) -> float:
    """The daemon's resident memory target (MB): 150 at 10,000 services (issue 8), 450 at
    50,000 (issue 22), on the line through them above 10,000."""
    return 150.0 + max(0, services - 10000) * (450.0 - 150.0) / 40000


def syncs(row: Row, info: Callable[[str, Any], None], services: int, dests: int, repeat: int,
          tmp: Path, parts: frozenset[str], formats: frozenset[str]) -> None:
    """1. and 2.: the cold starts (from the dump in each of `formats`) and the resync (those
    of them in `parts`)."""
    from tests.kernel import forked

    docs = generate(services, dests)
    paths = write_dumps(docs, tmp, formats)
    path = tmp / "cluster.json"
    des = desired(docs)
    del docs
    warm_up(tmp)
    # an untimed sync of the whole cluster first: the resync needs the kernel to hold it,
    # and the C tools' input is taken from it. It also makes every timed run a second one
    # for the kernel: at 50,000 services the first timed sync once took ~170 s longer than
    # the next (one sample each), which no later order would have charged to the C tools
    clean()
    forked.check("sync", "--once", "--from-file", str(path), *FLAGS)
    n_vs = len(des.services)
    if "resync" in parts:
        resync(des, repeat, row)
    del des
    if "cold" in parts:
        cold_start(paths, n_vs, repeat, row, info)


PARTS = frozenset({"cold", "resync", "daemon"})


def run_all(row: Row, info: Callable[[str, Any], None], services: int, dests: int,
            changes: int, repeat: int, tmp: Path, parts: frozenset[str] = PARTS,
            formats: frozenset[str] = FORMATS) -> None:
    node_up()
    try:
        if parts & {"cold", "resync"}:
            syncs(row, info, services, dests, repeat, tmp, parts, formats)
        if "daemon" not in parts:
            return
        small = daemon_run(100, dests, changes, tmp)
        big = daemon_run(services, dests, changes, tmp)
        for size, r in ((100, small), (services, big)):
            info(f"daemon at {size} services: programmed in", f"{r['programmed_s']:.1f}s")
            for est, how in (("1", "estimator on"), ("0", "estimator off")):
                info(f"daemon at {size} services, {how}: endpoint change p50 / p99",
                     f"{r['p50_' + est] * 1000:.0f} / {r['p99_' + est] * 1000:.0f} ms")
                info(f"daemon at {size} services, {how}: the kernel's stalls", r["stalls" + est])
                info(f"daemon at {size} services, {how}: the slowest changes", r["slowest" + est])
            info(f"daemon at {size} services: its own time per sync (mean of {r['syncs']:.0f})",
                 f"{r['sync_mean'] * 1000:.0f} ms")
            info(f"daemon at {size} services: kernel operations for {2 * changes} changes",
                 json.dumps(r["ops"], sort_keys=True))
        row(f"endpoint change p99, {services} vs 100 services", big["p99_1"], small["p99_1"],
            "p99 at 100 services", 1.5)
        row("  the same, the kernel's rate estimator off (net.ipv4.vs.run_estimation=0)",
            big["p99_0"], small["p99_0"], "p99 at 100 services", 1.5)
        for est, how in (("1", "as by default"), ("0", "the estimator off")):
            for size, r in ((100, small), (services, big)):
                info(f"ipvsadm -R at {size} services, {how}: one change's kernel work p50 / p99",
                     f"{r['peer_p50_' + est] * 1000:.0f} / {r['peer_p99_' + est] * 1000:.0f} ms")
            # no target: the kernel's own share, what no proxy can go under on this kernel
            row(f"  the C tool, one change's kernel work (ipvsadm -R), p99 {services} vs 100, "
                f"{how}", big["peer_p99_" + est], small["peer_p99_" + est],
                "its p99 at 100 services", None)
        target = memory_target(services)
        row(f"daemon memory, {services} services x {dests} (VmRSS, MB)", big["rss_mb"], target,
            f"target {target:.0f} MB", 1.0, unit="MB")
        info("daemon peak memory (VmHWM)", f"{big['hwm_mb']:.0f} MB")
    finally:
        node_down()


def config() -> Any:
    """The Config `sync` makes of FLAGS."""
    from ipvsproxy.settings.config import add_proxy_flags, from_args

    parser = argparse.ArgumentParser()
    add_proxy_flags(parser)
    return from_args(parser.parse_args(FLAGS))


def desired(docs: list[Any]) -> Any:
    """The desired state `sync` computes from docs on this node."""
    from ipvsproxy.core.cluster import build_snapshot
    from ipvsproxy.core.desired import compute_desired
    from ipvsproxy.kernel.host import host_facts

    return compute_desired(build_snapshot(docs, NODE), host_facts(), config())
