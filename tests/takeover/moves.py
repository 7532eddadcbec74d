"""A live node moved between kube-proxy and ipvsproxy, under real traffic (issue 36). Runs inside
the lab guest, with the real kube-apiserver and kube-proxy v1.35.4 (the differential suite's
environment, tests/differential/proxies.py).

One move: the cluster of tests/takeover/cluster.py is loaded through the API server, pods and
clients come up (network namespaces: pods.sh, each pod running tests/takeover/pod.py), the old
proxy programs the node and answers every client, then the clients' traffic starts
(tests/takeover/traffic.py: new TCP connections at a fixed rate, long-lived connections that
send and read back every 100 ms, UDP request and reply), the old proxy is stopped (SIGTERM: no
proxy cleans up on it), a service gains an endpoint and another loses one, one is deleted and
one created through the API server, the new proxy starts, and once the kernel holds those
changes the traffic goes on a while, then stops and is counted. Afterwards the node's state
(tests/differential/snapshot.py) is compared with the state the new proxy programs on a clean
node from the same objects.

    python -m tests.takeover.moves [--size 200] [--moves ipvs,back,iptables,nftables,cleanup]

`make takeover` runs every move at 200 Services; tests/kernel/test_takeover.py one at 20.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tests.differential import proxies, run, snapshot
from tests.differential.cluster import Change
from tests.differential.proxies import Daemon, Env, RunError, sh
from tests.takeover import cluster as C

ROOT = Path(__file__).resolve().parents[2]
PODS_SH = ROOT / "integration" / "vm" / "pods.sh"
HERE = Path(__file__).resolve().parent
WAIT = proxies.WAIT
# What each move is: the old proxy, what runs between the two (besides the changes), the new one
MOVES = {
    "ipvs": ("kube-proxy IPVS -> ipvsproxy", "kube-proxy ipvs", "ipvsproxy"),
    "back": ("ipvsproxy -> kube-proxy IPVS", "ipvsproxy", "kube-proxy ipvs"),
    "iptables": ("kube-proxy iptables -> ipvsproxy", "kube-proxy iptables", "ipvsproxy"),
    "nftables": ("kube-proxy nftables -> ipvsproxy", "kube-proxy nftables", "ipvsproxy"),
    # the procedure before issue 36: kube-proxy --cleanup, then ipvsproxy (no takeover)
    "cleanup": ("kube-proxy IPVS, --cleanup, ipvsproxy (the old procedure)", "kube-proxy ipvs",
                "ipvsproxy without takeover"),
}


@dataclass
class Result:
    move: str
    counts: dict[str, Any] = field(default_factory=dict)  # per client: traffic.py's RESULT
    followed: float = 0.0  # new proxy started -> the kernel held the changes, seconds
    differences: list[str] = field(default_factory=list)  # after the move vs a clean node
    leftovers: list[str] = field(default_factory=list)  # differences that are not the proxy's
    log: list[str] = field(default_factory=list)  # the new proxy's takeover lines
    long_total: int = 0  # long-lived connections made
    seconds: float = 0.0  # the whole move, its comparison included
    error: str = ""  # the move could not be completed: why
    compared: bool = False  # the node compared with a clean node afterwards

    def figures(self) -> dict[str, int]:
        out = {"new ok": 0, "new failed": 0, "long ok": 0, "long broken": 0, "udp ok": 0,
               "udp lost": 0}
        for c in self.counts.values():
            out["new ok"] += c["ok"]["new"]
            out["new failed"] += len(c["failed"]["new"])
            out["long ok"] += c["ok"]["long"]
            out["long broken"] += len(c["failed"]["long"])
            out["udp ok"] += c["ok"]["udp"]
            out["udp lost"] += len(c["failed"]["udp"])
        return out


# ------------------------------------------------------------------------------ the node


class Pods:
    """pods.sh's pods and clients, each pod serving tests/takeover/pod.py."""

    def __init__(self) -> None:
        self.procs: list[subprocess.Popen[bytes]] = []

    def up(self) -> None:
        sh(f"{PODS_SH} up {' '.join(sorted(C.PODS))} {' '.join(C.CLIENT_PODS)}")
        for name in C.PODS:
            self.procs.append(subprocess.Popen(
                ["ip", "netns", "exec", name, sys.executable, str(HERE / "pod.py"), name],
                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL))
        # one probe for all (a Python start is a second or more under the lab's emulation)
        wait_answer("cli", [(ip, C.TCP) for ip in C.PODS.values()], [], "the pods")

    def down(self) -> None:
        for p in self.procs:
            p.kill()
            p.wait()
        sh(f"{PODS_SH} down", check=False)


_PROBE = r"""
import socket, sys, json
tcp, udp = json.loads(sys.argv[1])
for host, port in tcp:
    try:
        with socket.create_connection((host, port), timeout=3) as s:
            s.settimeout(3); s.sendall(b"probe\n")
            assert s.makefile("rb").readline().endswith(b"probe\n")
    except (OSError, AssertionError) as e:
        sys.exit(f"TCP {host}:{port}: {e!r}")
for host, port in udp:
    try:
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
            s.settimeout(3); s.sendto(b"probe", (host, port))
            assert s.recv(512).endswith(b"probe")
    except (OSError, AssertionError) as e:
        sys.exit(f"UDP {host}:{port}: {e!r}")
"""


def wait_answer(ns: str, tcp: list[tuple[str, int]], udp: list[tuple[str, int]], what: str,
                timeout: float = WAIT) -> None:
    """Until every target answers from namespace `ns`."""
    deadline = time.monotonic() + timeout
    while True:
        p = subprocess.run(["ip", "netns", "exec", ns, sys.executable, "-c", _PROBE,
                            json.dumps([tcp, udp])], capture_output=True, text=True, check=False)
        if p.returncode == 0:
            return
        if time.monotonic() > deadline:
            raise RunError(f"{what} did not answer from {ns} within {timeout:.0f}s: "
                           f"{p.stderr.strip()[-500:]}")
        time.sleep(1.0)


class Clients:
    """traffic.py in each client namespace, from start() to stop()."""

    def __init__(self, plan: C.Plan, work: Path, rate: float) -> None:
        self.plan, self.work, self.rate = plan, work, rate
        self.procs: dict[str, subprocess.Popen[bytes]] = {}

    def start(self) -> None:
        self.stop_file = self.work / "traffic.stop"
        self.stop_file.unlink(missing_ok=True)
        n = len(self.plan.traffic)
        for ns, t in self.plan.traffic.items():
            cfg = self.work / f"traffic-{ns}.json"
            cfg.write_text(json.dumps({**t.config(self.rate / n), "stop": str(self.stop_file)}))
            self.procs[ns] = subprocess.Popen(
                ["ip", "netns", "exec", ns, sys.executable, str(HERE / "traffic.py"), str(cfg),
                 str(self.work / f"result-{ns}.json")])

    def stop(self) -> dict[str, Any]:
        self.stop_file.touch()
        out = {}
        for ns, p in self.procs.items():
            p.wait(120)
            out[ns] = json.loads((self.work / f"result-{ns}.json").read_text())
        self.procs = {}
        return out


# ------------------------------------------------------------------------------ proxies


def config(env: Env, mode: str) -> Path:
    """The KubeProxyConfiguration of the differential suite, in this mode."""
    path = env.work / f"kube-proxy-{mode}.conf"
    doc = json.loads(proxies.kube_proxy_config(env.params, env.kubeconfig))
    doc["mode"] = mode
    doc["iptables"] = {"syncPeriod": "30s", "minSyncPeriod": "1s"}
    doc["nftables"] = {"syncPeriod": "30s", "minSyncPeriod": "1s"}
    path.write_text(json.dumps(doc, indent=1))
    return path


def daemon(env: Env, which: str) -> Daemon:
    if which.startswith("kube-proxy"):
        mode = which.split()[1]
        return Daemon(which, [str(env.bin / "kube-proxy"), f"--config={config(env, mode)}",
                              "--v=2"], env.work / f"{which.replace(' ', '-')}.log")
    argv = [sys.executable, "-m", "ipvsproxy", "--log-format", "json", "run",
            "--config", str(config(env, "ipvs"))]
    if which == "ipvsproxy":
        argv.append("--adopt-kube-proxy")
    return Daemon(which, argv, env.work / f"{which.replace(' ', '-')}.log")


def ipvs_dests(svc: C.Svc) -> set[str]:
    """The real servers taking new connections at a service's ClusterIP in the kernel's IPVS:
    weight > 0 (one removed while connections remain drains at weight 0, as with kube-proxy)."""
    proto = "-u" if svc.udp else "-t"
    out = sh(f"ipvsadm -Ln {proto} {svc.cluster_ip}:{svc.port}", check=False)
    return {f[1].rpartition(":")[0] for f in map(str.split, out.splitlines())
            if len(f) >= 4 and f[0] == "->" and f[1][0].isdigit() and int(f[3]) > 0}


def _missing(svc: C.Svc) -> bool:
    """No virtual server at its ClusterIP."""
    proto = "-u" if svc.udp else "-t"
    return subprocess.run(f"ipvsadm -Ln {proto} {svc.cluster_ip}:{svc.port}", shell=True,
                          capture_output=True, check=False).returncode != 0


def changes(plan: C.Plan) -> list[Change]:
    """What happens to the cluster while no proxy runs."""
    return [
        Change("replace", C.slice_obj(plan.grown, (*plan.grown.pods, "pod4")), "grown"),
        Change("replace", C.slice_obj(plan.shrunk, plan.shrunk.pods[1:]), "shrunk"),
        Change("delete", C.slice_obj(plan.deleted), "deleted"),
        Change("delete", C.service_obj(plan.deleted), "deleted"),
        Change("create", C.service_obj(plan.created), "created"),
        Change("create", C.slice_obj(plan.created), "created"),
    ]


def not_followed(plan: C.Plan) -> list[str]:
    """The changes made while no proxy ran that the kernel does not hold yet."""
    out = []
    if C.PODS["pod4"] not in ipvs_dests(plan.grown):
        out.append(f"grown {plan.grown.cluster_ip}: no pod4")
    if C.PODS[plan.shrunk.pods[0]] in ipvs_dests(plan.shrunk):
        out.append(f"shrunk {plan.shrunk.cluster_ip}: {plan.shrunk.pods[0]} still in")
    if not _missing(plan.deleted):
        out.append(f"deleted {plan.deleted.cluster_ip}: virtual server still there")
    if _missing(plan.created):
        out.append(f"created {plan.created.cluster_ip}: no virtual server")
    return out



# ------------------------------------------------------------------------------ one move


def load(env: Env, plan: C.Plan) -> None:
    env.api.reset(env.params.namespaces, env.params.node_name)
    for obj in C.objects(plan):
        env.api.write(Change("create", obj, "load"))
    for s in plan.services:
        if s.kind == "load-balancer":
            env.api.write(Change("status", C.lb_status(s), "load"))


def serving(plan: C.Plan) -> None:
    """Until every client's targets answer."""
    for ns, t in plan.traffic.items():
        wait_answer(ns, [*t.new, *t.long], t.udp, "the services")


def move(env: Env, plan: C.Plan, name: str, rate: float, before: float, after: float,
         n: int, compare: bool = True) -> Result:
    what, old_name, new_name = MOVES[name]
    started = time.monotonic()
    res = Result(what, long_total=sum(len(t.long) for t in plan.traffic.values()))
    node_sysctls(env)
    load(env, plan)
    old = daemon(env, old_name)
    old.start()
    try:
        serving(plan)
        # a node the old proxy has served: its first whole sync ended (kube-proxy's IPVS mode
        # writes its sets last, after IPVS and the addresses that already serve)
        old.settle()
    except RunError as exc:
        raise RunError(f"{old_name} never served the cluster: {exc}\n{old.tail()}") from None
    clients = Clients(plan, env.work, rate)
    clients.start()
    new: Daemon | None = None
    try:
        time.sleep(before)
        old.stop()
        if name == "cleanup":
            subprocess.run([str(env.bin / "kube-proxy"), "--cleanup"], capture_output=True,
                           check=False)
        env.api.write_all(changes(plan))
        new = daemon(env, new_name)
        t0 = time.monotonic()
        new.start()
        while not_followed(plan):
            new.check(proxies.metrics())
            if time.monotonic() - t0 > WAIT:
                said = [ln for ln in new.log.read_text(errors="replace").splitlines()
                        if "taking over" in ln or '"started"' in ln][:5]
                raise RunError(f"{new_name} did not follow the changes within {WAIT:.0f}s "
                               f"({not_followed(plan)}):\n"
                               f"{new.tail()}\n{said}\n{sh('ipset save', check=False)[:3000]}")
            time.sleep(0.5)
        res.followed = time.monotonic() - t0
        time.sleep(after)
    finally:
        res.counts = clients.stop()
    assert new is not None
    try:
        sentinel = run._sentinel(env.params, n)
        env.api.write_all(sentinel.first)
        moved = run._converge_after(env, new, sentinel)
        res.log = [ln[:300] for ln in new.log_at_snapshot.splitlines()
                   if "taking over" in ln or "adopt" in ln]
    finally:
        new.stop()
    if name == "back":  # ipvsproxy's own records: kube-proxy serves from the rest now
        env.ipvsproxy("cleanup", "--records-only")
        moved = snapshot.normalize(snapshot.read())
    scrub()
    if not compare:
        res.seconds = time.monotonic() - started
        return res
    # the same proxy from a clean node, for comparison
    node_sysctls(env)
    fresh_d = daemon(env, new_name)
    fresh_d.start()
    try:
        sentinel = run._sentinel(env.params, n + 1)
        env.api.write_all(sentinel.first)
        fresh = run._converge_after(env, fresh_d, sentinel)
    finally:
        fresh_d.stop()
    # the clean node's own sentinel came after the moved node's snapshot: not a difference
    theirs = sentinel.first[0].obj["spec"]["clusterIPs"]
    if name == "back":
        env.ipvsproxy("cleanup", "--records-only")  # nothing there: the same steps as above
        fresh = snapshot.normalize(snapshot.read())
    diffs = snapshot.compare(fresh, moved)
    res.compared = True
    for items in diffs.values():
        for d in items:
            if d.candidate is None and any(ip in d.key for ip in theirs):
                continue
            (res.leftovers if leftover(d, old_name) else res.differences).append(str(d))
    scrub()
    res.seconds = time.monotonic() - started
    return res


def node_sysctls(env: Env) -> None:
    """The node's sysctls as before any proxy ran, on a node with a pod network: it forwards
    (the CNI bridge plugin and kubeadm's preflight see to it; kube-proxy's iptables and nftables
    modes rely on it and do not set it, and without it a ClusterIP never answers a pod)."""
    env.reset_sysctls()
    snapshot.write_sysctls({"net/ipv4/ip_forward": "1"})


def leftover(d: snapshot.Difference, old: str) -> bool:
    """A difference the new proxy leaves on purpose: state of the old proxy's that is not a
    proxy's to remove. kube-proxy's iptables mode makes the kubelet's KUBE-FIREWALL chain
    (iptablesKubeletJumpChains; its CleanupLeftovers keeps it too) and sets route_localnet."""
    if old != "kube-proxy iptables" or d.candidate is None:
        return False
    if d.key == "net/ipv4/conf/all/route_localnet":  # KUBE-FIREWALL guards it (CVE-2020-8558)
        return d.candidate == "1"
    return "KUBE-FIREWALL" in d.key and d.reference is None


def scrub() -> None:
    """proxies.scrub, and kube-proxy's nftables tables (a move that failed before its takeover
    may leave them)."""
    sh("nft delete table ip kube-proxy; nft delete table ip6 kube-proxy", check=False)
    proxies.scrub()


def run_moves(names: list[str], size: int, rate: float, before: float, after: float,
              work: Path | None = None, json_path: str = "",
              compare: bool = True) -> list[Result]:
    """Each move in turn on one node; one that cannot be completed is recorded with its error
    and the next one runs. `json_path`: the results so far, written after each move.
    `compare`: also program a clean node with the new proxy and compare (a minute or two)."""
    plan = C.plan(size)
    out = []
    pods = Pods()
    with proxies.environment(C.PARAMS, work) as env:
        pods.up()
        try:
            for i, name in enumerate(names):
                scrub()
                t0 = time.monotonic()
                try:
                    out.append(move(env, plan, name, rate, before, after, 2 * i, compare))
                except RunError as exc:
                    msg = str(exc)  # its first line says what; the tail, the logs
                    if len(msg) > 3000:
                        msg = f"{msg[:1500]}\n...\n{msg[-1500:]}"
                    out.append(Result(MOVES[name][0], error=msg,
                                      seconds=time.monotonic() - t0))
                    print(f"{name}: could not be completed: {exc}", flush=True)
                print(table(out[-1:]), flush=True)
                if json_path:
                    Path(json_path).write_text(json.dumps([r.__dict__ for r in out], indent=1))
        finally:
            pods.down()
            scrub()
    return out


def table(results: list[Result]) -> str:
    rows = ["| move | new TCP failed | long-lived broken | UDP lost | changes followed after |"
            " state vs a clean node |", "|---|---|---|---|---|---|"]
    for r in results:
        if r.error:
            rows.append(f"| {r.move} | could not be completed: {r.error.splitlines()[0][:200]} "
                        "| | | | |")
            continue
        f = r.figures()
        rows.append(f"| {r.move} | {f['new failed']} of {f['new ok'] + f['new failed']} | "
                    f"{f['long broken']} of {r.long_total} | "
                    f"{f['udp lost']} of {f['udp ok'] + f['udp lost']} | {r.followed:.1f} s | "
                    + (f"{len(r.differences)} differences" if r.compared else "not compared")
                    + (f" ({len(r.leftovers)} kept on purpose)" if r.leftovers else "") + " |")
    return "\n".join(rows)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--size", type=int, default=200)
    ap.add_argument("--moves", default="cleanup,ipvs,back,iptables,nftables")
    ap.add_argument("--rate", type=float, default=50.0, help="new TCP connections per second")
    ap.add_argument("--before", type=float, default=10.0, help="traffic seconds before")
    ap.add_argument("--after", type=float, default=20.0, help="traffic seconds after")
    ap.add_argument("--json", default="")
    ap.add_argument("--work", default="", help="keep the proxies' logs and configs here")
    args = ap.parse_args(argv)
    t0 = time.monotonic()
    results = run_moves(args.moves.split(","), args.size, args.rate, args.before, args.after,
                        Path(args.work) if args.work else None, args.json)
    print(table(results))
    for r in results:
        for d in r.differences:
            print(f"{r.move}: difference: {d}")
        for line in r.log:
            print(f"{r.move}: {line}")
    print(f"{len(results)} moves at {args.size} services in {time.monotonic() - t0:.0f} s")
    return 1 if any(r.error for r in results) else 0


if __name__ == "__main__":
    sys.exit(main())
