"""One tenant's Service against the daemon (issue 32): the attacks a namespace editor can make,
each measured from outside the daemon, for docs/reliability.md's table. Not a test: figures.

Inside the lab (it programs the kernel):

    python -m integration.vm.lab --memory 4G --rwdir bench/results -- \
        'python -m bench.attacks [--build REV]'

runs `ipvsproxy run` (from this checkout, or from commit REV's tree: `--build` measures the
code before a fix the same way) against the test API server (tests/apiserver.py) holding a
generated cluster, and then, one after the other:

- amplification: a Service of 500 ports x 400 externalIPs (28 KB) is added; the kernel's virtual
  servers, the daemon's resident memory and the seconds of its next full syncs;
- source ranges: a LoadBalancer with 8,000 loadBalancerSourceRanges is added, and at once one
  endpoint of another service changes: how long until the kernel has that endpoint;
- a scheduler the kernel lacks (`ipvsproxy.io/scheduler: nosuch`): the daemon's failed syncs and
  full syncs over three sync periods, and /healthz and /livez at the end;
- a colliding externalIP toggled 10 times: the full and incremental syncs it caused;
- a 250 KB `ipvsproxy.io/scheduler-flags`, written twice: the bytes the daemon logged.
Prints a table and writes bench/results/attacks-<build>.json.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
import urllib.error
import urllib.request
from ipaddress import ip_address
from pathlib import Path
from typing import Any

from bench import procstat
from bench.cluster_bench import FLAGS, clean, node_down, node_up
from bench.cluster_gen import endpoint_slice, generate, pod_ip

HEALTHZ = "127.0.0.1:10256"
METRICS = "127.0.0.1:10249"
SYNC_PERIOD = 10.0
REPO = Path(__file__).resolve().parents[1]
RESULTS = REPO / "bench" / "results"


def metrics() -> dict[str, float]:
    from tests.kernel.test_daemon import metrics_or_empty

    return metrics_or_empty()


def status(path: str) -> int:
    try:
        with urllib.request.urlopen(f"http://{HEALTHZ}{path}", timeout=5) as r:
            return int(r.status)
    except urllib.error.HTTPError as e:
        return int(e.code)


def count(m: dict[str, float], mode: str, result: str = "ok") -> float:
    return m.get(f'ipvsproxy_syncs_total{{mode="{mode}",result="{result}"}}', 0.0)


def wait_full_syncs(n: int, timeout: float = 1800) -> dict[str, float]:
    """Until n more full syncs (ok or failed) have ended; the metrics then."""
    start = metrics()
    base = count(start, "full") + count(start, "full", "failed")
    t0 = time.monotonic()
    while True:
        m = metrics()
        if count(m, "full") + count(m, "full", "failed") >= base + n:
            return m
        assert time.monotonic() - t0 < timeout, "no full sync"
        time.sleep(0.5)


def full_sync_seconds(log: Path, since: int) -> list[float]:
    """The `seconds` of the full syncs the daemon logged after byte `since` of its log."""
    out = []
    with log.open("rb") as f:
        f.seek(since)
        for line in f:
            try:
                rec = json.loads(line)
            except ValueError:
                continue
            if rec.get("event") == "sync" and rec.get("mode") == "full":
                out.append(float(rec["seconds"]))
    return out


def build_tree(rev: str, tmp: Path) -> Path:
    tree = tmp / f"build-{rev[:12]}"
    if not tree.exists():
        tree.mkdir(parents=True)
        subprocess.run(f"git -C {REPO} archive {rev} | tar -x -C {tree}", shell=True,
                       check=True)
    return tree


def run(build: Path, label: str, services: int, tmp: Path) -> dict[str, Any]:
    from tests.apiserver import ApiServer

    docs = generate(services, 10)
    svcs = {d["metadata"]["name"]: d for d in docs if d["kind"] == "Service"}
    clean()
    api = ApiServer()
    api.start()
    api.load(docs)
    log = tmp / f"daemon-{label}.log"
    argv = ["--log-format", "json", "run", "--kubeconfig",
            str(api.kubeconfig(tmp / "kubeconfig")), *FLAGS,
            "--ipvs-sync-period", f"{SYNC_PERIOD}s", "--ipvs-min-sync-period", "0.5s",
            "--healthz-bind-address", HEALTHZ, "--metrics-bind-address", METRICS,
            "--service-metrics", "false"]
    out: dict[str, Any] = {"build": label, "services": services}
    with log.open("wb") as f:
        d = subprocess.Popen([sys.executable, "-m", "ipvsproxy", *argv], cwd=build,
                             env={**os.environ, "PYTHONPATH": str(build)}, stdout=f,
                             stderr=subprocess.STDOUT)
    try:
        t0 = time.monotonic()
        while count(metrics(), "full") < 1:
            assert d.poll() is None, log.read_text()[-3000:]
            assert time.monotonic() - t0 < 1800, "never synced"
            time.sleep(0.5)
        m = wait_full_syncs(1)
        out["base"] = {"virtual_servers": m.get("ipvsproxy_virtual_servers"),
                       "rss_mb": procstat.kb(d.pid, "VmRSS") / 1024,
                       "full_sync_s": full_sync_seconds(log, 0)[-1]}
        print(f"{label}: base {out['base']}", flush=True)

        # -- amplification: 500 ports x 400 externalIPs
        big = {"kind": "Service", "apiVersion": "v1",
               "metadata": {"namespace": "t1", "name": "big"},
               "spec": {"type": "ClusterIP", "clusterIP": "10.96.250.1",
                        "clusterIPs": ["10.96.250.1"],
                        "ports": [{"name": f"p{i}", "port": 1000 + i, "protocol": "TCP"}
                                  for i in range(500)],
                        "externalIPs": [f"203.0.{113 + i // 250}.{i % 250 + 1}"
                                        for i in range(400)]}}
        since = log.stat().st_size
        t1 = time.monotonic()
        api.put(big)
        m = wait_full_syncs(2, timeout=7200)
        out["amplification"] = {
            "virtual_servers": m.get("ipvsproxy_virtual_servers"),
            "rss_mb": procstat.kb(d.pid, "VmRSS") / 1024,
            "hwm_mb": procstat.kb(d.pid, "VmHWM") / 1024,
            "full_syncs_s": full_sync_seconds(log, since),
            "two_full_syncs_after_s": time.monotonic() - t1,
            "healthz": status("/healthz")}
        print(f"{label}: amplification {out['amplification']}", flush=True)
        api.delete("Service", "t1", "big")
        wait_full_syncs(2, timeout=7200)

        # -- 8,000 source ranges, and one endpoint change of another service right after
        ranges = {"kind": "Service", "apiVersion": "v1",
                  "metadata": {"namespace": "t1", "name": "ranges"},
                  "spec": {"type": "LoadBalancer", "clusterIP": "10.96.250.2",
                           "clusterIPs": ["10.96.250.2"],
                           "ports": [{"name": "p", "port": 443, "protocol": "TCP",
                                      "nodePort": 31999}],
                           "loadBalancerSourceRanges": [f"10.{i // 250}.{i % 250}.0/24"
                                                        for i in range(8000)]},
                  "status": {"loadBalancer": {"ingress": [{"ip": "198.51.100.250"}]}}}
        from ipvsproxy.core.ipvs import Protocol, ServiceKey
        from ipvsproxy.kernel.ipvs import IpvsClient

        victim = next(s for n, s in svcs.items() if n.startswith("svc-")
                      and s["spec"]["type"] == "ClusterIP")
        i = int(victim["metadata"]["name"].split("-")[1])
        p = victim["spec"]["ports"][0]
        key = ServiceKey.inet(Protocol[p["protocol"]], ip_address(victim["spec"]["clusterIP"]),
                              p["port"])
        new = ip_address(pod_ip(i, 1, 10, 11))
        api.put(ranges)
        t1 = time.monotonic()
        api.put(endpoint_slice(i, victim, 10, 11))
        with IpvsClient() as ipvs:
            while True:
                vs = ipvs.get_service(key)
                if vs is not None and any(x.dest.key.addr == new for x in vs.dests):
                    break
                assert time.monotonic() - t1 < 3600
                time.sleep(0.01)
        out["source_ranges"] = {"endpoint_change_s": time.monotonic() - t1}
        print(f"{label}: source ranges {out['source_ranges']}", flush=True)
        api.delete("Service", "t1", "ranges")
        wait_full_syncs(1)

        # -- a scheduler the kernel lacks
        nosuch = json.loads(json.dumps(victim))
        nosuch["metadata"] = {"namespace": "t1", "name": "nosuch",
                              "annotations": {"ipvsproxy.io/scheduler": "nosuch"}}
        nosuch["spec"]["clusterIP"] = "10.96.250.3"
        nosuch["spec"]["clusterIPs"] = ["10.96.250.3"]
        before = metrics()
        api.put(nosuch)
        time.sleep(3 * SYNC_PERIOD)
        m = wait_full_syncs(1)
        out["scheduler"] = {
            "failed_syncs": count(m, "full", "failed") + count(m, "incremental", "failed")
            - count(before, "full", "failed") - count(before, "incremental", "failed"),
            "full_syncs": count(m, "full") + count(m, "full", "failed")
            - count(before, "full") - count(before, "full", "failed"),
            "healthz": status("/healthz"), "livez": status("/livez")}
        print(f"{label}: scheduler {out['scheduler']}", flush=True)
        api.delete("Service", "t1", "nosuch")
        wait_full_syncs(1)

        # -- a colliding externalIP toggled: another tenant's ClusterIP:port
        grab = json.loads(json.dumps(victim))
        grab["metadata"] = {"namespace": "t1", "name": "grab"}
        grab["spec"]["clusterIP"] = "10.96.250.4"
        grab["spec"]["clusterIPs"] = ["10.96.250.4"]
        before = metrics()
        for n in range(10):
            grab["spec"]["externalIPs"] = [victim["spec"]["clusterIP"]] if n % 2 == 0 else []
            api.put(grab)
            time.sleep(1.5)
        m = metrics()
        out["collision"] = {
            "full_syncs": count(m, "full") - count(before, "full"),
            "incremental_syncs": count(m, "incremental") - count(before, "incremental"),
            "seconds": 15.0, "periodic_full_expected": 15.0 / SYNC_PERIOD}
        print(f"{label}: collision {out['collision']}", flush=True)

        # -- a 250 KB scheduler-flags annotation, written twice
        flood = json.loads(json.dumps(grab))
        flood["metadata"]["annotations"] = {
            "ipvsproxy.io/scheduler-flags": ",".join(f"bogus{k}" for k in range(40_000))}
        since = log.stat().st_size
        for n in range(2):
            flood["metadata"]["annotations"]["ipvsproxy.io/scheduler-flags"] += f",x{n}"
            api.put(flood)
            time.sleep(3)
        wait_full_syncs(1)
        out["flags_flood"] = {"log_bytes": log.stat().st_size - since}
        print(f"{label}: flags flood {out['flags_flood']}", flush=True)
        out["final_rss_mb"] = procstat.kb(d.pid, "VmRSS") / 1024
    finally:
        d.terminate()
        d.wait(120)
        api.stop()
        clean()
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--build", default="", help="a commit to run the daemon of (default: this "
                                                "checkout)")
    ap.add_argument("--services", type=int, default=200)
    args = ap.parse_args(argv)
    tmp = Path(os.environ.get("TMPDIR", "/tmp")) / "ipvsproxy-attacks"
    tmp.mkdir(parents=True, exist_ok=True)
    build = build_tree(args.build, tmp) if args.build else REPO
    label = args.build[:7] if args.build else "this-checkout"
    node_up()
    try:
        out = run(build, label, args.services, tmp)
    finally:
        node_down()
    RESULTS.mkdir(exist_ok=True)
    (RESULTS / f"attacks-{label}.json").write_text(json.dumps(out, indent=1))
    print(json.dumps(out, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
