"""The chaos run (issue 9), inside the lab: `ipvsproxy run` against the test API server while a
driver makes random changes to Services and EndpointSlices, interleaved with faults (the API
server killed and restarted, watches cut, 410 Gone forced, the daemon SIGKILLed and restarted,
kernel state tampered with, foreign IPVS services, sets and chains added). When the driver
stops, the kernel must hold exactly the desired state of the API objects within two sync
periods (checked by `ipvsproxy sync --once --dry-run` on a dump of them: no operation left),
every foreign object must be as it was made, and no daemon log may hold a traceback.

`make chaos` runs it at the issue's size (500 services, 2,000 changes); test_chaos.py runs a
smaller one in `make test`; `make chaos CHAOS_ARGS=--help` lists the knobs. (make chaos imports
main() rather than running this file as __main__: the forkserver that starts the daemon would
import a __main__ module again in every child.)
"""

from __future__ import annotations

import argparse
import collections
import json
import random
import re
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tests.apiserver import ApiServer
from tests.kernel import forked
from tests.kernel.conftest import SCHEDULER_MODULES, sh
from tests.kernel.test_daemon import HEALTHZ, METRICS, NODE_OBJ, metrics_or_empty
from tests.kernel.test_traffic import FLAGS

NODE_IF = "ipvsp-chaos"
SCHEDULERS = ["rr", "wrr", "lc", "wlc", "sh", "mh", "dh", "sed", "nq"]
FOREIGN_NET = "198.51.100"  # foreign virtual servers: never one of the cluster's addresses
FAULTS = ["api_restart", "watch_cut", "gone_410", "daemon_kill", "ipvs_del_service",
          "ipvs_del_dest", "ipvs_edit_dest", "ipset_del", "iptables_flush", "addr_del",
          "foreign_add"]


@dataclass
class Report:
    services: int
    changes: collections.Counter[str] = field(default_factory=collections.Counter)
    faults: collections.Counter[str] = field(default_factory=collections.Counter)
    repairs: float = 0.0  # ipvsproxy_drift_repaired_total, summed over the daemon's lives
    drive_seconds: float = 0.0
    converge_seconds: float | None = None  # from the driver's stop to no operation left
    repair_seconds: float | None = None  # from a last tampering, cluster quiet, to repaired
    left: list[str] = field(default_factory=list)  # operations still planned at the deadline
    check_seconds: float = 0.0  # how long the last `sync --dry-run` check took
    foreign_changed: list[str] = field(default_factory=list)
    tracebacks: int = 0
    daemon_logs: list[str] = field(default_factory=list)

    def summary(self) -> dict[str, Any]:
        return {"services": self.services, "changes": sum(self.changes.values()),
                "changes_by_kind": dict(self.changes), "faults": sum(self.faults.values()),
                "faults_by_kind": dict(self.faults), "repairs": self.repairs,
                "drive_seconds": round(self.drive_seconds, 1),
                "converge_seconds": None if self.converge_seconds is None
                else round(self.converge_seconds, 1),
                "repair_seconds": None if self.repair_seconds is None
                else round(self.repair_seconds, 1),
                "check_seconds": self.check_seconds, "operations_left": len(self.left),
                "foreign_changed": self.foreign_changed,
                "tracebacks": self.tracebacks}


# ------------------------------------------------------------------------ random objects

def cluster_ip(i: int) -> str:
    return f"10.96.{100 + i // 250}.{i % 250 + 1}"


def random_service(i: int, rng: random.Random) -> dict[str, Any]:
    type_ = rng.choices(["ClusterIP", "NodePort", "LoadBalancer"], [70, 20, 10])[0]
    ports = []
    for j in range(rng.choice([1, 1, 1, 2])):
        port: dict[str, Any] = {"name": f"p{j}", "port": 80 + j, "targetPort": 8080 + j,
                                "protocol": rng.choices(["TCP", "UDP"], [85, 15])[0]}
        if type_ != "ClusterIP":
            port["nodePort"] = 30000 + 2 * i + j
        ports.append(port)
    spec: dict[str, Any] = {"type": type_, "clusterIP": cluster_ip(i), "ports": ports}
    if rng.random() < 0.2:
        spec["sessionAffinity"] = "ClientIP"
        spec["sessionAffinityConfig"] = {"clientIP": {"timeoutSeconds": rng.choice([60, 10800])}}
    if type_ != "ClusterIP" and rng.random() < 0.3:
        spec["externalTrafficPolicy"] = "Local"
        if type_ == "LoadBalancer":
            spec["healthCheckNodePort"] = 32100 + i
    if rng.random() < 0.1:
        spec["internalTrafficPolicy"] = "Local"
    ann = {"ipvsproxy.io/scheduler": rng.choice(SCHEDULERS)} if rng.random() < 0.3 else {}
    obj: dict[str, Any] = {"kind": "Service",
                           "metadata": {"namespace": "chaos", "name": f"s{i}",
                                        "annotations": ann},
                           "spec": spec}
    if type_ == "LoadBalancer":
        obj["status"] = {"loadBalancer": {"ingress": [{"ip": f"198.18.{i // 250}.{i % 250 + 1}"}]}}
    return obj


def random_slice(i: int, svc: dict[str, Any] | None, rng: random.Random) -> dict[str, Any]:
    ports = [{"name": p["name"], "port": p["targetPort"], "protocol": p["protocol"]}
             for p in (svc["spec"]["ports"] if svc else [{"name": "p0", "targetPort": 8080,
                                                          "protocol": "TCP"}])]
    hosts = rng.sample(range(2, 250), rng.choice([0, 1, 2, 3, 3, 5, 8]))
    endpoints = []
    for h in hosts:
        subnet = rng.choice([1, 2])
        endpoints.append({"addresses": [f"10.244.{subnet}.{h}"],
                          "nodeName": "node-a" if subnet == 1 else "node-b",
                          "conditions": {"ready": rng.random() < 0.9,
                                         "terminating": rng.random() < 0.05}})
    ann = {"ipvsproxy.io/weight": str(rng.randint(0, 100))} if rng.random() < 0.2 else {}
    return {"kind": "EndpointSlice", "addressType": "IPv4",
            "metadata": {"namespace": "chaos", "name": f"s{i}-1", "annotations": ann,
                         "labels": {"kubernetes.io/service-name": f"s{i}"}},
            "ports": ports, "endpoints": endpoints}


# ---------------------------------------------------------------------------- the daemon

class Daemon:
    """The daemon under test, through its restarts; its logs are kept, one file per life."""

    def __init__(self, api: ApiServer, tmp: Path, sync_period: float) -> None:
        self.kubeconfig = api.kubeconfig(tmp / "kubeconfig")
        self.tmp, self.sync_period = tmp, sync_period
        self.lives = 0
        self.repairs = 0.0
        self.proc: forked.Proc | None = None

    def start(self) -> None:
        self.lives += 1
        self.proc = forked.start(
            ["--log-format", "json", "run", "--kubeconfig", str(self.kubeconfig), *FLAGS,
             "--ipvs-sync-period", f"{self.sync_period}s", "--ipvs-min-sync-period", "0.5s",
             "--healthz-bind-address", HEALTHZ, "--metrics-bind-address", METRICS,
             "--service-metrics", "false"],
            self.log(self.lives))
        # Started means running: the child has opened its log. A kill that came before that
        # (two daemon_kill faults close together while the host's tests ran beside the lab)
        # left a life with no log at all, and killed nothing that had begun.
        deadline = time.monotonic() + 60
        while not self.log(self.lives).exists():
            assert self.proc.poll() is None, f"daemon life {self.lives} exited at once"
            assert time.monotonic() < deadline, f"daemon life {self.lives} did not start in 60s"
            time.sleep(0.05)

    def log(self, life: int) -> Path:
        return self.tmp / f"daemon-{life}.log"

    def drift_repaired(self) -> float:
        return metrics_or_empty().get("ipvsproxy_drift_repaired_total", 0.0)

    def kill(self) -> None:
        assert self.proc is not None
        self.repairs += self.drift_repaired()  # counters start again with the next life
        self.proc.kill()
        self.proc.wait(60)

    def stop(self) -> int:
        assert self.proc is not None
        self.repairs += self.drift_repaired()
        self.proc.terminate()
        return self.proc.wait(120)


# ------------------------------------------------------------------------------ the faults

def ours(command: str) -> list[list[str]]:
    """The `ipvsadm -Sn` lines of one command (-A: virtual servers, -a: real servers) that are
    not foreign, split into words: -a -t VIP:PORT -r RIP:PORT -m -w 1."""
    return [f for f in map(str.split, sh("ipvsadm -Sn").splitlines())
            if f[:1] == [command] and not f[2].startswith(FOREIGN_NET)]


def foreign_state(n: int) -> str:
    return "\n".join([
        sh(f"ipvsadm -Ln -t {FOREIGN_NET}.{n}:80"),
        sh(f"ipset save FOREIGN-{n}"),
        sh(f"iptables -t filter -S FOREIGN-{n}"),
    ])


def fault(kind: str, api: ApiServer, daemon: Daemon, rng: random.Random,
          foreign: dict[int, str]) -> None:
    if kind == "api_restart":
        api.stop()
        time.sleep(rng.uniform(0.5, 3.0))
        api.start()
    elif kind == "watch_cut":
        api.cut_watches()
    elif kind == "gone_410":
        api.compact()  # every watch that reconnects from an older resourceVersion gets 410
        api.cut_watches()
    elif kind == "daemon_kill":
        daemon.kill()
        daemon.start()
    elif kind == "ipvs_del_service" and (vs := ours("-A")):
        _, proto, vip, *_ = rng.choice(vs)
        sh(f"ipvsadm -D {proto} {vip}", check=False)
    elif kind == "ipvs_del_dest" and (rs := ours("-a")):
        _, proto, vip, _, rip, *_ = rng.choice(rs)
        sh(f"ipvsadm -d {proto} {vip} -r {rip}", check=False)
    elif kind == "ipvs_edit_dest" and (rs := ours("-a")):
        _, proto, vip, _, rip, method, *_ = rng.choice(rs)
        sh(f"ipvsadm -e {proto} {vip} -r {rip} {method} -w 77", check=False)
    elif kind == "ipset_del":
        members = sh("ipset list KUBE-CLUSTER-IP 2>/dev/null | sed '1,/Members:/d'",
                     check=False).split()
        if members:
            sh(f"ipset del KUBE-CLUSTER-IP {rng.choice(members)}", check=False)
    elif kind == "iptables_flush":
        sh("iptables -t nat -F KUBE-SERVICES", check=False)
    elif kind == "addr_del":
        addrs = re.findall(r"inet (\S+)", sh("ip -4 addr show dev kube-ipvs0", check=False))
        if addrs:
            sh(f"ip addr del {rng.choice(addrs)} dev kube-ipvs0", check=False)
    elif kind == "foreign_add":
        n = len(foreign) + 1
        sh(f"ipvsadm -A -t {FOREIGN_NET}.{n}:80 -s wlc && "
           f"ipvsadm -a -t {FOREIGN_NET}.{n}:80 -r 10.9.9.{n}:80 -m -w 3 && "
           f"ipset create FOREIGN-{n} hash:ip && ipset add FOREIGN-{n} 10.9.9.{n} && "
           f"iptables -t filter -N FOREIGN-{n} && "
           f"iptables -t filter -A FOREIGN-{n} -s 10.9.9.{n} -j ACCEPT")
        foreign[n] = foreign_state(n)


def remove_foreign(foreign: dict[int, str]) -> None:
    for n in foreign:
        sh(f"ipvsadm -D -t {FOREIGN_NET}.{n}:80; iptables -t filter -F FOREIGN-{n}; "
           f"iptables -t filter -X FOREIGN-{n}; ipset destroy FOREIGN-{n}", check=False)


# -------------------------------------------------------------------------------- the run

def plan_left(api: ApiServer, tmp: Path) -> list[str]:
    """What `ipvsproxy sync --once --dry-run` would still do to reach the API's state."""
    dump = tmp / "objects.json"  # JSON: PyYAML in the guest costs seconds at 500 services
    dump.write_text(json.dumps({"kind": "List", "items": api.objects()}))
    p = forked.run(["sync", "--once", "--from-file", str(dump), *FLAGS, "--dry-run"])
    if p.returncode != 0:
        return [f"sync --dry-run exited {p.returncode}: {p.stderr.strip()[-500:]}"]
    return p.stdout.splitlines()


def converge(api: ApiServer, tmp: Path, deadline: float, report: Report) -> float | None:
    """Seconds until a check finds nothing left to do, or None (and what is left, in the
    report) when no check that ended by `deadline` found that. The figure is an upper bound:
    the kernel was converged when the check read it, somewhere within its last
    `report.check_seconds`."""
    t0 = time.monotonic()
    while True:
        c0 = time.monotonic()
        left = plan_left(api, tmp)
        end = time.monotonic()
        report.check_seconds = round(end - c0, 1)
        if end > deadline:
            report.left = left or ["the check ended after the deadline"]
            return None
        if not left:
            return end - t0
        time.sleep(1.0)


def run(tmp: Path, services: int = 500, changes: int = 2000, fault_every: int = 20,
        sync_period: float = 30.0, seed: int = 1, pause: float = 0.05) -> Report:
    rng = random.Random(seed)
    report = Report(services)
    sh("modprobe -a " + " ".join(SCHEDULER_MODULES))
    forked.run(["cleanup"])
    sh("ipvsadm -C")
    sh(f"ip link add {NODE_IF} type dummy && ip addr add 192.168.1.10/24 dev {NODE_IF} "
       f"&& ip link set {NODE_IF} up")
    api = ApiServer()
    api.start()
    api.put(NODE_OBJ)
    model: dict[int, dict[str, Any]] = {}
    for i in range(services // 2):  # half exist when the daemon starts
        model[i] = random_service(i, rng)
        api.load([model[i], random_slice(i, model[i], rng)])
    daemon = Daemon(api, tmp, sync_period)
    foreign: dict[int, str] = {}
    # every kind of fault as often as the others, in a random order of its own
    schedule = [FAULTS[k % len(FAULTS)] for k in range(changes // fault_every)]
    random.Random(seed + 1).shuffle(schedule)
    try:
        daemon.start()
        t0 = time.monotonic()
        for step in range(1, changes + 1):
            i = rng.randrange(services)
            what = rng.choices(["service", "delete_service", "slice", "delete_slice"],
                               [35, 8, 50, 7])[0]
            if what == "service":
                model[i] = random_service(i, rng)
                api.put(model[i])
            elif what == "slice":
                api.put(random_slice(i, model.get(i), rng))
            else:
                kind = "Service" if what == "delete_service" else "EndpointSlice"
                try:
                    api.delete(kind, "chaos", f"s{i}" if kind == "Service" else f"s{i}-1")
                except KeyError:
                    what = "delete_missing"  # nothing to delete: counted, not applied
                if kind == "Service":
                    model.pop(i, None)
            report.changes[what] += 1
            if step % fault_every == 0:
                kind = schedule[step // fault_every - 1]
                fault(kind, api, daemon, rng, foreign)
                report.faults[kind] += 1
            time.sleep(pause)
        report.drive_seconds = time.monotonic() - t0
        # the API is up and the daemon alive (a fault's restart is synchronous): converge
        t1 = time.monotonic()
        report.converge_seconds = converge(api, tmp, t1 + 2 * sync_period, report)
        if report.converge_seconds is not None:
            # one more round of tampering with the cluster quiet: a full sync with no change
            # to apply repairs it, and counts it (ipvsproxy_drift_repaired_total)
            for kind in ("ipvs_del_service", "ipvs_del_dest", "ipset_del", "iptables_flush",
                         "addr_del"):
                fault(kind, api, daemon, rng, foreign)
                report.faults[kind] += 1
            t2 = time.monotonic()
            report.repair_seconds = converge(api, tmp, t2 + 2 * sync_period, report)
        report.foreign_changed = [f"foreign {n}" for n, state in foreign.items()
                                  if foreign_state(n) != state]
        assert daemon.stop() == 0
    finally:
        if daemon.proc is not None and daemon.proc.poll() is None:
            daemon.proc.kill()
        api.stop()
        remove_foreign(foreign)
        forked.run(["cleanup"])
        sh(f"ip link del {NODE_IF}", check=False)
    report.repairs = daemon.repairs
    for life in range(1, daemon.lives + 1):
        text = daemon.log(life).read_text(errors="replace")
        report.tracebacks += text.count("Traceback")
        report.daemon_logs.append(str(daemon.log(life)))
    return report


def log_tails(r: Report, lines: int = 25) -> str:
    """The end of each of the daemon's logs, to see why it did not converge."""
    out = []
    for path in r.daemon_logs:
        tail = Path(path).read_text(errors="replace").splitlines()[-lines:]
        out.append(f"--- {path}\n" + "\n".join(tail))
    return "\n".join(out)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--services", type=int, default=500)
    ap.add_argument("--changes", type=int, default=2000)
    ap.add_argument("--fault-every", type=int, default=20)
    ap.add_argument("--sync-period", type=float, default=30.0)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--out", type=Path, default=Path("/tmp/ipvsproxy-chaos"))
    args = ap.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    r = run(args.out, args.services, args.changes, args.fault_every, args.sync_period, args.seed)
    print(json.dumps(r.summary(), indent=1))
    if r.left:
        print("still to do at the deadline:\n" + "\n".join(r.left[:50]))
        print(log_tails(r))
    ok = (r.converge_seconds is not None and r.repair_seconds is not None and r.repairs > 0
          and not r.foreign_changed and not r.tracebacks)
    print("chaos: " + ("converged" if ok else "FAILED"))
    return 0 if ok else 1


if __name__ == "__main__":
    raise SystemExit(main())
