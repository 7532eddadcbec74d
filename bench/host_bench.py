"""Host-only benchmarks (issue 8): the figures that involve no kernel, measured on the host.

- Desired state: `compute_desired` over a generated cluster (bench/cluster_gen.py), 10,000
  services x 10 endpoints (target <= 1 s) and 50,000 (linear growth: cost per service at 50k
  over cost per service at 10k), the collector off around it as the product runs it, and the
  collector's full pass over the result apart. Parsing the objects into the store's values is
  reported too; the daemon does it once per object as it arrives, not per sync.
- Manifests (issue 22): the same 10,000-service dump read by `ipvsproxy.inputs.manifests` as YAML
  (as `kubectl get services,endpointslices,nodes -A -o yaml` writes it) and as JSON: the YAML in
  under 5x the JSON time (ipvsproxy/inputs/kubeyaml.py; PyYAML's pure-Python loader is shown beside
  it), each with the collector off, as the command reads it.
- Watch throughput: EndpointSlice MODIFIED events per second from a real WATCH (the test API
  server, tests/apiserver.py, in a process of its own, over loopback HTTP) through the official
  client, the reflector and into the store (target >= 20,000/s); and what the test API server
  sends alone, read off a plain socket, which caps that figure.
- Start-up of `ipvsproxy ls -Ln` on a real CPU: the installed command from exec to exit, next
  to `python -c pass` and `ipvsadm -Ln`. The lab's listing figure (kernel_bench) is timed in
  process, because the emulated interpreter's start is not what a node pays; this is what a
  node pays on top. Where the host has no IPVS (the build machine), both commands end at
  their "Can't initialize ipvs" error, after the same imports and argument parsing.

    python -m bench.host_bench [--services N] [--events N] [--out DIR]
"""

from __future__ import annotations

import argparse
import contextlib
import gc
import json
import multiprocessing as mp
import os
import platform
import shutil
import socket
import statistics
import subprocess
import sys
import threading
import time
from ipaddress import ip_address, ip_network
from pathlib import Path
from typing import Any
from urllib.parse import urlencode, urlsplit

from bench.cluster_gen import CLUSTER_CIDR, NODE, NODE_IP, endpoint_slice, generate

ROOT = Path(__file__).resolve().parents[1]


def desired_seconds(n: int, m: int, repeat: int) -> tuple[float, float, float, int]:
    """(best compute_desired time, the collector's pass after it, parse time, virtual servers)
    for n services x m endpoints.

    compute_desired runs as the product runs it: with the cyclic collector off around it, as
    `sync --once` has it for the whole command and the daemon's full sync for the whole sync.
    Alone, its own pause would end in a collection of the young generation, which then holds
    every object of the result (~25% of the time at 50,000 services); the product pays that
    once, after the sync (the daemon's settle: a full collection, then a freeze), and `sync
    --once` never. That pass is timed apart, as a full collection, once per repeat."""
    from ipvsproxy.core.cluster import build_snapshot
    from ipvsproxy.core.desired import HostFacts, compute_desired
    from ipvsproxy.core.gcpause import paused
    from ipvsproxy.settings.config import Config

    docs = generate(n, m)
    t0 = time.perf_counter()
    snap = build_snapshot(docs, NODE)
    parse = time.perf_counter() - t0
    del docs
    cfg = Config(hostname=NODE, cluster_cidrs=(ip_network(CLUSTER_CIDR),))
    host = HostFacts(addresses=(("eth0", ip_address(NODE_IP)),))
    best = collect = float("inf")
    vs = 0
    gc.collect()
    for _ in range(repeat):
        with paused():
            t0 = time.perf_counter()
            des = compute_desired(snap, host, cfg)
            best = min(best, time.perf_counter() - t0)
            t0 = time.perf_counter()
            gc.collect()
            collect = min(collect, time.perf_counter() - t0)
        assert not des.problems, des.problems[:3]
        vs = len(des.services)
        del des
    return best, collect, parse, vs


def _serve(conn: Any, n: int, events: int) -> None:
    """The API server's process: n EndpointSlices loaded, then `events` modifications recorded
    (before anyone watches), then serve until told to stop."""
    from tests.apiserver import ApiServer

    api = ApiServer()
    docs = generate(n, 10)
    slices = [d for d in docs if d["kind"] == "EndpointSlice"]
    services = [d for d in docs if d["kind"] == "Service" and d["metadata"]["name"] != "kubernetes"]
    api.load(slices)
    rv0 = api.resource_version
    for k in range(events):
        i = k % n
        api.put(endpoint_slice(i, services[i], 10, version=k // n + 1))
    # The recorded history is ~2M objects the server never frees: frozen, no garbage collection
    # walks them again. Otherwise a full collection (0.8 s) falls into the measurement or not
    # depending on where the counts stood when the process forked.
    del docs, services
    gc.collect()
    gc.freeze()
    api.start()
    conn.send((api.url, rv0, slices))
    conn.recv()  # done
    api.stop()


def _start_server(n: int, events: int) -> tuple[Any, Any, tuple[str, str, list[Any]]]:
    parent, child = mp.get_context("fork").Pipe()
    proc = mp.get_context("fork").Process(target=_serve, args=(child, n, events), daemon=True)
    proc.start()
    return proc, parent, parent.recv()


def _stop_server(proc: Any, parent: Any) -> None:
    with contextlib.suppress(OSError):  # gone already
        parent.send("done")
    proc.join(10)
    if proc.is_alive():
        proc.kill()


def server_events_per_second(n: int, events: int) -> float:
    """The test API server alone: the same watch over a plain socket, its events counted and
    nothing parsed. The figure through the proxy's client can be no higher."""
    from ipvsproxy.kube.listing import LABEL_SELECTOR

    proc, parent, (url, rv0, _) = _start_server(n, events)
    try:
        u = urlsplit(url)
        query = urlencode({"labelSelector": LABEL_SELECTOR, "resourceVersion": rv0,
                           "allowWatchBookmarks": "true", "timeoutSeconds": 600,
                           "watch": "true"})
        mark = b'{"type": "MODIFIED"'  # what the server's json.dumps writes for each event
        with socket.create_connection((u.hostname, u.port)) as sock:
            t0 = time.perf_counter()
            sock.sendall(f"GET /apis/discovery.k8s.io/v1/endpointslices?{query} HTTP/1.1\r\n"
                         f"Host: {u.netloc}\r\n\r\n".encode())
            got, tail = 0, b""
            while got < events:
                data = sock.recv(1 << 20)
                if not data:
                    break
                data = tail + data
                got += data.count(mark)
                tail = data[-(len(mark) - 1):]  # a mark cut in two by recv is counted once
            return got / (time.perf_counter() - t0)
    finally:
        _stop_server(proc, parent)


def watch_events_per_second(n: int, events: int) -> tuple[float, int]:
    from kubernetes import client

    from ipvsproxy.daemon.store import Store
    from ipvsproxy.kube.listing import LABEL_SELECTOR
    from ipvsproxy.kube.reflector import Reflector

    proc, parent, (url, rv0, slices) = _start_server(n, events)
    try:
        for s in slices:
            s["kind"] = "EndpointSlice"
        store = Store(NODE)
        store.replace("EndpointSlice", slices)  # what the LIST at rv0 would have given
        # The reflector drops a list once handed over: kept, its ~240k dicts and lists would
        # double what each full garbage collection during the watch walks through.
        del slices
        before = store.endpoint_changes_total
        cfg = client.Configuration()
        cfg.host = url
        api = client.DiscoveryV1Api(client.ApiClient(cfg))
        stop = threading.Event()
        r = Reflector("EndpointSlice", api.list_endpoint_slice_for_all_namespaces, store, stop,
                      label_selector=LABEL_SELECTOR, min_watch_timeout=600,
                      max_watch_timeout=601)
        r.resource_version = rv0  # watch from rv0: the server replays every modification
        t0 = time.perf_counter()
        th = threading.Thread(target=r.run, daemon=True)
        th.start()
        deadline = t0 + 600
        while store.endpoint_changes_total - before < events and time.perf_counter() < deadline:
            time.sleep(0.005)
        took = time.perf_counter() - t0
        got = store.endpoint_changes_total - before
        stop.set()
        r.interrupt()
        return got / took, got
    finally:
        _stop_server(proc, parent)


def manifest_seconds(n: int, m: int, repeat: int) -> tuple[float, float, float, int]:
    """(best JSON, best YAML, pure-Python YAML once, bytes of YAML) reading an n x m dump,
    the collector off as `sync --once` has it (with it on, its passes depend on what the
    process held before and moved the JSON time 0.17-0.8 s from run to run)."""
    import tempfile

    import yaml

    from ipvsproxy.core.gcpause import paused
    from ipvsproxy.inputs import manifests

    dump = {"apiVersion": "v1", "kind": "List", "items": generate(n, m),
            "metadata": {"resourceVersion": ""}}
    with tempfile.TemporaryDirectory() as tmp:
        j, y = Path(tmp) / "dump.json", Path(tmp) / "dump.yaml"
        j.write_text(json.dumps(dump, indent=4))
        y.write_text(yaml.dump(dump, Dumper=getattr(yaml, "CSafeDumper", yaml.SafeDumper),
                               default_flow_style=False))
        del dump
        best = {j: float("inf"), y: float("inf")}
        gc.collect()
        with paused():
            for _ in range(repeat):
                for f in (j, y):
                    t0 = time.perf_counter()
                    manifests.load_objects(str(f))
                    best[f] = min(best[f], time.perf_counter() - t0)
            t0 = time.perf_counter()
            list(yaml.load_all(y.read_text(), Loader=yaml.SafeLoader))
            pure = time.perf_counter() - t0
        return best[j], best[y], pure, y.stat().st_size


def startup_ms(runs: int) -> dict[str, float]:
    """Median exec-to-exit milliseconds of each command, the commands taking turns (a slow
    spell of a shared machine falls on all of them)."""
    script = Path(sys.executable).with_name("ipvsproxy")
    commands = {
        "ipvsproxy ls -Ln": [str(script), "ls", "-Ln"] if script.exists()
        else [sys.executable, "-m", "ipvsproxy", "ls", "-Ln"],
        "python -c pass": [sys.executable, "-c", "pass"],
    }
    if shutil.which("ipvsadm"):
        commands["ipvsadm -Ln"] = ["ipvsadm", "-Ln"]
    # Bytecode as an installed package has it (pip compiles it): a checkout's __pycache__ is
    # written by the first turns, even where the caller's environment says not to.
    env = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}
    times: dict[str, list[float]] = {name: [] for name in commands}
    for turn in range(runs + 5):  # five turns to warm the caches, not counted
        for name, argv in commands.items():
            t0 = time.perf_counter()
            subprocess.run(argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                           env=env, check=False)
            if turn >= 5:
                times[name].append(time.perf_counter() - t0)
    return {name: statistics.median(t) * 1e3 for name, t in times.items()}


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--services", type=int, default=10000)
    ap.add_argument("--large", type=int, default=50000)
    ap.add_argument("--endpoints", type=int, default=10)
    ap.add_argument("--events", type=int, default=50000)
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--startup-runs", type=int, default=100)
    ap.add_argument("--out", default=str(ROOT / "bench" / "results"))
    args = ap.parse_args()
    results: list[dict[str, Any]] = []

    def row(figure: str, value: float, unit: str, target: str, met: bool | None,
            note: str = "") -> None:
        results.append({"figure": figure, "value": round(value, 3), "unit": unit,
                        "target": target, "met": met, "note": note})
        print(f"measured: {figure}: {value:.3f} {unit} {note}", flush=True)

    n, big, m = args.services, args.large, args.endpoints
    t_n, gc_n, parse_n, vs_n = desired_seconds(n, m, args.repeat)
    row(f"desired state {n} svc x {m} ep ({vs_n} VS)", t_n, "s", "<= 1.0", t_n <= 1.0)
    row("  the collector's full pass after it (the daemon's settle after a full sync)", gc_n,
        "s", "-", None)
    row(f"parse {n} Services + EndpointSlices (once per object, not per sync)", parse_n, "s",
        "-", None)
    t_big, gc_big, _, vs_big = desired_seconds(big, m, 2)
    growth = (t_big / big) / (t_n / n)
    # issue 22: <= 2.5 s at 50,000 (make bench-large); none below that size
    row(f"desired state {big} svc x {m} ep ({vs_big} VS)", t_big, "s",
        "<= 2.5" if big >= 50000 else "-", t_big <= 2.5 if big >= 50000 else None)
    row("  the collector's full pass after it (the daemon's settle after a full sync)", gc_big,
        "s", "-", None)
    row(f"desired state cost per service, {big} over {n}", growth, "x",
        "linear (<= 1.25)", growth <= 1.25)
    t_json, t_yaml, t_pure, size = manifest_seconds(n, m, args.repeat)
    row(f"manifest {n} svc x {m} ep as JSON", t_json, "s", "-", None)
    row(f"manifest as YAML ({size / 1e6:.1f} MB)", t_yaml, "s", "-", None)
    row("manifest YAML over JSON", t_yaml / t_json, "x", "< 5", t_yaml / t_json < 5)
    row("manifest as YAML with PyYAML's pure-Python loader (before)", t_pure, "s", "-", None)
    rate, got = watch_events_per_second(n, args.events)
    row(f"watch: EndpointSlice events into the store ({got} events)", rate, "/s",
        ">= 20000", rate >= 20000)
    row("watch: the test API server alone (the cap on the figure above)",
        server_events_per_second(n, args.events), "/s", "-", None)
    for name, ms in startup_ms(args.startup_runs).items():
        row(f"start-up: {name}, exec to exit (median of {args.startup_runs})", ms, "ms", "-",
            None)

    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    machine = f"{platform.processor() or platform.machine()}, {os.cpu_count()} CPUs, " \
              f"Python {platform.python_version()}, kernel {platform.release()}"
    doc = {"machine": machine, "results": results}
    (out / f"host-{time.strftime('%Y%m%dT%H%M%S')}.json").write_text(
        json.dumps(doc, indent=2) + "\n")
    print(f"\nhost benchmarks ({machine})\n")
    print(f"{'figure':66} {'value':>12} {'target':>18}  met?")
    for r in results:
        met = "-" if r["met"] is None else "yes" if r["met"] else "NO"
        print(f"{r['figure']:66} {r['value']:>10.3f}{r['unit']:>2} {r['target']:>18}  {met}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
