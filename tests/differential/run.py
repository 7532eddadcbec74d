"""Drive kube-proxy --proxy-mode=ipvs and ipvsproxy against the same API server, in the lab.

Runs inside the lab guest (root, real IPVS), on the node, processes and API server of
proxies.py. Per generated cluster (`differential`):

1. the cluster is loaded into the real kube-apiserver (etcd and kube-apiserver started in the
   guest by integration/upstream/controlplane.py, or one the host provides through a kubeconfig
   in IPVSPROXY_UPSTREAM_KUBECONFIG), on a node whose NIC `diff0` holds the Node's addresses;
2. the real `kube-proxy --proxy-mode=ipvs` (v1.35, proxies.py's KubeProxyConfiguration) runs
   until its metrics say it has synced everything it was told and its clusterIP virtual servers
   are those of the API objects (`_converge`), and the kernel is snapshotted; then it is
   stopped and `kube-proxy --cleanup` runs, and whatever it leaves is reported and removed;
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
import json
import sys
import time
from collections import Counter
from dataclasses import dataclass, field
from ipaddress import ip_address, ip_network
from pathlib import Path
from typing import Any

from tests.differential import changes, deviations, generate, snapshot
from tests.differential.cluster import (
    FEATURES,
    LABEL_HEADLESS,
    LABEL_MANAGED_BY,
    LABEL_PROXY_NAME,
    LABEL_SERVICE_NAME,
    MANAGED_BY,
    Change,
    Cluster,
    Params,
)
from tests.differential.proxies import (
    WAIT,
    Daemon,
    Env,
    RunError,
    environment,
    host_addresses,
    metrics,
    scrub,
    sh,
)
from tests.differential.snapshot import Difference, Snapshot

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


def _save(env: Env, name: str, objects: list[Any], ctx: deviations.Context,
          **snaps: Snapshot) -> None:
    """The objects and the snapshots, for a look afterwards (deviations.py re-classifies them
    on the host: `python -m tests.differential.deviations FILE`)."""
    (env.work / f"{name}.json").write_text(json.dumps(
        {"objects": objects, "snapshots": {k: snapshot.to_plain(s) for k, s in snaps.items()},
         "kube_proxy_no_zone": sorted(ctx.kube_proxy_no_zone)}, indent=1))


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
                       "labels": {LABEL_SERVICE_NAME: name,
                                  LABEL_MANAGED_BY: MANAGED_BY}},
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
                or LABEL_PROXY_NAME in labels or LABEL_HEADLESS in labels:
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
                 t: dict[str, float], snaps: dict[str, Snapshot],
                 logs: dict[str, str] | None = None) -> None:
    """Start a daemon on the loaded cluster, snapshot it settled (snaps["first"]); apply the
    changes, snapshot it converged (snaps["after"]); stop it. A RunError leaves in `snaps`
    what was taken before it. `logs` gets the daemon's output up to each snapshot."""
    logs = {} if logs is None else logs
    t0 = time.monotonic()
    d.start()
    try:
        snaps["first"] = _converge(env, d, "")
        logs["first"] = d.log_at_snapshot
        t[d.name] = time.monotonic() - t0
        if not changes:
            return
        t0 = time.monotonic()
        for c in changes:
            env.api.write(c)
        env.api.write_all(sentinel[0])
        snaps["after"] = _converge(env, d, sentinel[1])
        logs["after"] = d.log_at_snapshot
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
    kp_logs: dict[str, str] = {}
    _daemon_pass(env, env.kube_proxy(), changes, sentinel, t, kp, kp_logs)  # fatal if it fails
    ref, ref_after = kp["first"], kp.get("after")
    objects_after = env.api.dump(env.params.namespaces, env.params.node_name)
    ctx_after = deviations.Context.from_objects(objects_after, env.params)
    ctx.kube_proxy_no_zone = deviations.zone_unknown(kp_logs.get("first", ""))
    ctx_after.kube_proxy_no_zone = deviations.zone_unknown(kp_logs.get("after", ""))
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
    _save(env, f"cluster-{cluster.seed}", objects, ctx, **saved)
    if ref_after is not None and run_after is not None:
        diffs["changes"] = snapshot.compare(ref_after, run_after, listeners=True)
        classified["changes"] = _classify(diffs["changes"], ctx_after)
        _save(env, f"cluster-{cluster.seed}-changes", objects_after, ctx_after,
              **{"kube-proxy": ref_after, "run": run_after})
    return Outcome(
        f"cluster seed {cluster.seed}", len(cluster.objects()), len(changes),
        dict(cluster.features()),
        {k: {kind: [str(x) for x in v] for kind, v in dd.items()} for k, dd in diffs.items()},
        classified, {k: v for k, v in left.items() if v}, t,
        [ln for ln in once.stderr.splitlines() if "warn" in ln.lower()][:50], failures)


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
        "features covered": f"{len(set(feats) & set(FEATURES))}/"
                            f"{len(FEATURES)}",
        "differences by kind": {c: dict(sorted(v.items())) for c, v in by_kind.items()},
        "differences by class": {c: dict(sorted(v.items())) for c, v in by_class.items()},
        "failures": sum(len(o.failures) for o in outcomes),
        "unexplained": sum(len(o.unexplained()) for o in outcomes),
        "seconds": round(seconds),
        "seconds per cluster": [round(sum(o.timings.values())) for o in outcomes],
    }


if __name__ == "__main__":
    sys.exit(main())
