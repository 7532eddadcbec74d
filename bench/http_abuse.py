"""The /healthz server under abuse (issue 23, item 4; issue 32, items 8 and 9), on loopback.

The server runs as the daemon runs it (daemon/http.py start_healthz, with a stub health object)
in a process of its own, next to a sync-loop stand-in: a thread doing CPU work in a loop, whose
iteration rate shows what the HTTP server takes from the reconciler (both need the GIL). Each
abuse comes from another process; meanwhile this process sends good /healthz requests one after
another, as a kubelet would, and samples the server process: sockets held, descriptors,
threads, RSS, and the bytes it logged.

The last phases run a second server process as a node with a tenant's LoadBalancer Services
(externalTrafficPolicy Local) runs: /healthz, the metrics server and the health-check node
ports (daemon/hcnp.py), under a descriptor limit of 1024, soft and hard (the worst case: the
daemon raises the soft limit to the hard one, and here there is nothing to raise). There, good
requests alternate between /healthz and a load balancer's check of an attacked port, and after
each phase the server process tries to open a socket, run a subprocess and make a temporary
file, as the reconciler must.

    python -m bench.http_abuse [--http-module PATH] [--quick]

--http-module measures another version of daemon/http.py (the one before issue 23, say) with
the same abuse; to measure a whole other tree (hcnp.py too), run its copy of this file. Every
phase is bounded in time and count and everything stops by itself.
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import importlib.util
import json
import math
import multiprocessing as mp
import os
import resource
import selectors
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

from bench import procstat
from integration.ports import free_ports

ROOT = Path(__file__).resolve().parents[1]
GOOD = b"GET /healthz HTTP/1.1\r\nHost: node\r\nConnection: close\r\n\r\n"
LB_CHECK = b"GET / HTTP/1.1\r\nHost: node\r\nConnection: close\r\n\r\n"
TENANT_NOFILE = 1024  # the tenant server's descriptor limit, soft and hard
PROBE_TIMEOUT = 5.0  # a good request slower than this counts as failed
KUBELET_TIMEOUT = 1.0  # a probe's default timeoutSeconds: slower is a failed probe
MIB = 1 << 20
# With two CPUs or more, the server process (server and stand-in) is kept on the first CPU and
# the clients on the others, so the clients' CPU is not taken from the stand-in (other work on
# the machine still can be: "sync CPU %" shows how much CPU the stand-in got).
SERVER_CPUS = {0}
CLIENT_CPUS = set(range(1, os.cpu_count() or 1)) or {0}


# --- the server process -------------------------------------------------------------------

class StubHealth:
    """Health's answers, without its state: always healthy."""

    def healthz(self) -> tuple[int, dict[str, Any]]:
        now = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
        return 200, {"lastUpdated": now, "currentTime": now, "nodeEligible": True,
                     "healthy": True, "status": {"IPv4": {"lastUpdated": now, "healthy": True}}}

    def livez(self) -> tuple[int, dict[str, Any]]:
        code, doc = self.healthz()
        del doc["nodeEligible"]
        return code, doc

    def is_healthy(self) -> bool:
        return True


class StubMetrics:
    def render(self) -> bytes:
        return b"# nothing\n"


def own_work() -> str:
    """What the reconciler needs besides the servers, tried once: a socket, a subprocess (as
    iptables-restore and ipset run) and a temporary file. "ok", else what failed."""
    failed = []
    for what, attempt in (("socket", lambda: socket.socket().close()),
                          ("subprocess", lambda: subprocess.run(["true"], check=True)),
                          ("tempfile", lambda: tempfile.TemporaryFile().close())):
        try:
            attempt()
        except OSError as exc:
            failed.append(f"{what}: {exc.strerror or exc}")
    return "; ".join(failed) or "ok"


def serve_main(module_path: str | None, tenant_ports: int, nofile: int | None) -> None:
    """The daemon's side: start_healthz (and, with tenant_ports, the metrics server and that
    many health-check node ports) and the sync-loop stand-in. Answers on stdin: "check" with
    own_work(), "ports N" by syncing to N health-check ports, anything else with the stand-in's
    iteration count; exits when stdin closes."""
    with contextlib.suppress(OSError):
        os.sched_setaffinity(0, SERVER_CPUS)  # before any thread: they inherit it
    if nofile:
        resource.setrlimit(resource.RLIMIT_NOFILE, (nofile, nofile))
    from ipvsproxy.logsetup import setup_logging

    setup_logging()  # as the daemon: on stderr, no debug lines (stdout is for "iters")
    if module_path:
        spec = importlib.util.spec_from_file_location("ipvsproxy.daemon.http", module_path)
        assert spec is not None and spec.loader is not None
        http = importlib.util.module_from_spec(spec)
        sys.modules["ipvsproxy.daemon.http"] = http
        spec.loader.exec_module(http)
    else:
        from ipvsproxy.daemon import http
    with contextlib.suppress(ImportError):  # as `ipvsproxy run` starts (before issue 32: no)
        from ipvsproxy.daemon import fds  # type: ignore[attr-defined, unused-ignore]

        fds.raise_soft_limit()
    srv = http.start_healthz("127.0.0.1:0", StubHealth(), None)
    hello: dict[str, Any] = {"port": srv.port}
    hc: Any = None
    if tenant_ports:
        from ipvsproxy.daemon.hcnp import HealthCheckPorts

        hello["metrics"] = http.start_metrics("127.0.0.1:0", StubMetrics()).port
        hc = HealthCheckPorts(StubHealth(), ["127.0.0.1"])
        wanted = free_ports(tenant_ports)
        hc.sync({("tenant", f"lb-{i:05}"): (p, 1) for i, p in enumerate(wanted)})
        hello["open"] = sorted(hc.open_ports().values())
        hello["ports"] = wanted  # in the order of the Services' names
    iters = [0]

    def sync_loop() -> None:  # stands for compute_desired + diff: pure Python CPU work
        while True:
            sum(i * i for i in range(500))
            iters[0] += 1

    spinner = threading.Thread(target=sync_loop, daemon=True)
    spinner.start()
    assert spinner.ident is not None
    clock = time.pthread_getcpuclockid(spinner.ident)
    print(json.dumps(hello), flush=True)
    for line in sys.stdin:
        if line.strip() == "check":
            print(json.dumps({"own": own_work()}), flush=True)
        elif line.startswith("ports ") and hc is not None:  # ports [p, ...]: sync to these
            t0 = time.monotonic()
            wanted = json.loads(line.split(None, 1)[1])
            hc.sync({("tenant", f"lb-{i:05}"): (p, 1) for i, p in enumerate(wanted)})
            print(json.dumps({"seconds": time.monotonic() - t0,
                              "open": len(hc.open_ports())}), flush=True)
        else:
            cpu = os.times()
            print(json.dumps({"iters": iters[0], "t": time.monotonic(),
                              "cpu": cpu.user + cpu.system,
                              "sync_cpu": time.clock_gettime(clock)}), flush=True)
    os._exit(0)  # the old server may hold thousands of threads: do not wait for them


class Server:
    def __init__(self, module_path: str | None, tenant_ports: int = 0,
                 nofile: int | None = None) -> None:
        cmd = [sys.executable, "-m", "bench.http_abuse", "--serve"]
        if module_path:
            cmd += ["--http-module", module_path]
        if tenant_ports:
            cmd += ["--tenant-ports", str(tenant_ports)]
        if nofile:
            cmd += ["--nofile", str(nofile)]
        self.proc = subprocess.Popen(cmd, cwd=ROOT, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                     stderr=subprocess.PIPE, text=True)
        self.logged = 0  # bytes the server wrote to stderr (its log)
        self.log_tail = b""
        threading.Thread(target=self._read_log, daemon=True).start()
        assert self.proc.stdout is not None
        hello = json.loads(self.proc.stdout.readline())
        self.port: int = hello["port"]
        # the listeners a tenant attack spreads over: healthz, metrics, three health-check ports
        self.open: list[int] = hello.get("open", [])
        self.ports: list[int] = hello.get("ports", [])
        self.targets: list[int] = [self.port, hello["metrics"], *self.open[:3]] \
            if "metrics" in hello else [self.port]
        self.base_sockets = 0
        self.base_sockets = self.sample()["held"]

    def _read_log(self) -> None:
        assert self.proc.stderr is not None
        fd = self.proc.stderr.fileno()
        while chunk := os.read(fd, 65536):
            self.logged += len(chunk)
            self.log_tail = (self.log_tail + chunk)[-4096:]

    def ask(self, line: str) -> dict[str, Any]:
        assert self.proc.stdin is not None and self.proc.stdout is not None
        self.proc.stdin.write(line + "\n")
        self.proc.stdin.flush()
        doc: dict[str, Any] = json.loads(self.proc.stdout.readline())
        return doc

    def iters(self) -> dict[str, float]:
        """The stand-in's iterations, the time, the process's CPU seconds and the stand-in's."""
        return self.ask("iters")

    def sample(self) -> dict[str, int]:
        """Sockets held (beyond the listeners' own), descriptors, threads and RSS of the server
        process."""
        fds = f"/proc/{self.proc.pid}/fd"
        held = 0
        listing = os.listdir(fds)
        for fd in listing:
            with contextlib.suppress(OSError):
                held += os.readlink(f"{fds}/{fd}").startswith("socket:")
        field = procstat.status(self.proc.pid)
        return {"held": held - self.base_sockets, "fds": len(listing),
                "threads": field["Threads"], "rss": field["VmRSS"] * 1024}

    def stop(self) -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.close()
        try:
            self.proc.wait(10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()


# --- the abusers (each phase's in a process of its own) -----------------------------------

def read_until_closed(s: socket.socket, deadline: float) -> bytes:
    out = b""
    with contextlib.suppress(ConnectionResetError):
        while time.monotonic() < deadline:
            s.settimeout(max(0.01, deadline - time.monotonic()))
            chunk = s.recv(65536)
            if not chunk:
                break
            out += chunk
    return out


def good_request(port: int, request: bytes = GOOD) -> float:
    """Seconds for one /healthz (or request) answered 200, inf when it was not (in
    PROBE_TIMEOUT)."""
    t0 = time.perf_counter()
    deadline = time.monotonic() + PROBE_TIMEOUT
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=PROBE_TIMEOUT) as s:
            s.sendall(request)
            data = read_until_closed(s, deadline)
    except OSError:
        return math.inf
    return time.perf_counter() - t0 if data[9:12] == b"200" else math.inf


def nonblocking_connect(port: int) -> socket.socket:
    s = socket.socket()
    s.setblocking(False)
    s.connect_ex(("127.0.0.1", port))
    return s


def idle(port: int, n: int, until: float, _: Any) -> None:
    """n connections that send nothing, opened at a steady pace over at most 3 s (all at once,
    most would be dropped from a short accept queue and not count), held until the end, none
    reopened."""
    socks = []
    start = time.monotonic()
    pace = min(3.0, (until - start) / 2) / n
    for i in range(n):
        socks.append(nonblocking_connect(port))
        if i % 20 == 19:
            time.sleep(max(0.0, start + (i + 1) * pace - time.monotonic()))
    time.sleep(max(0.0, until - time.monotonic()))
    for s in socks:
        s.close()


def idle_spread(port: int, n: int, until: float, _: Any, ports: list[int]) -> None:
    """n idle connections spread evenly over ports (the tenant server's /healthz, metrics and
    three health-check ports), opened one listener after the other, as idle() does."""
    socks = []
    start = time.monotonic()
    pace = min(3.0, (until - start) / 2) / n
    for i in range(n):
        socks.append(nonblocking_connect(ports[i * len(ports) // n]))
        if i % 20 == 19:
            time.sleep(max(0.0, start + (i + 1) * pace - time.monotonic()))
    time.sleep(max(0.0, until - time.monotonic()))
    for s in socks:
        s.close()


def length_flood(port: int, n: int, until: float, results: Any) -> None:
    """n requests whose Content-Length str.isdigit() accepts and int() refuses (issue 32, item
    9), in waves of 100 sent at once; each wave waits a second at most for its answers. The
    count of 400 answers is reported."""
    bad = [b"\xb2", "\u00b2".encode(), b"9" * 5000, b"\xb9", "\u0663".encode()]
    refused = sent = 0
    while sent < n and time.monotonic() < until:
        sel = selectors.DefaultSelector()
        answers: dict[socket.socket, bytes] = {}
        for i in range(min(100, n - sent)):
            s = socket.create_connection(("127.0.0.1", port), timeout=1)
            s.sendall(b"GET /healthz HTTP/1.1\r\nHost: node\r\nContent-Length: "
                      + bad[(sent + i) % len(bad)] + b"\r\n\r\n")
            s.setblocking(False)
            sel.register(s, selectors.EVENT_READ)
            answers[s] = b""
        sent += len(answers)
        wave_end = time.monotonic() + 1
        while sel.get_map() and time.monotonic() < wave_end:
            for key, _mask in sel.select(0.05):
                s = key.fileobj  # type: ignore[assignment]
                try:
                    chunk = s.recv(65536)
                except BlockingIOError:
                    continue
                except OSError:
                    chunk = b""
                answers[s] += chunk
                if not chunk:
                    sel.unregister(s)
        refused += sum(a.startswith(b"HTTP/1.1 400 ") for a in answers.values())
        for s in answers:
            s.close()
        sel.close()
    results.put({"sent": sent, "refused": refused})


def slowloris(port: int, n: int, until: float, _: Any) -> None:
    """n clients sending one header line a second, forever; each cut is reopened a second
    later (reopening at once would be a connect flood, measured by the burst)."""
    sel = selectors.DefaultSelector()
    reopen: list[float] = [time.monotonic() + i / n for i in range(n)]  # ramp over a second
    live: dict[socket.socket, float] = {}  # socket -> when to send the next line
    while time.monotonic() < until:
        now = time.monotonic()
        for t in [t for t in reopen if t <= now]:
            reopen.remove(t)
            try:  # a full accept queue drops SYNs: then try again later
                s = socket.create_connection(("127.0.0.1", port), timeout=0.5)
            except OSError:
                reopen.append(time.monotonic() + 1)
                continue
            s.setblocking(False)
            try:
                s.send(b"GET /healthz HTTP/1.1\r\nHost: node\r\n")
            except OSError:
                s.close()
                reopen.append(now + 1)
                continue
            live[s] = now + 1
            sel.register(s, selectors.EVENT_READ)
        for key, _mask in sel.select(0.05):  # readable: cut (or, wrongly, answered)
            s = key.fileobj  # type: ignore[assignment]
            sel.unregister(s)
            del live[s]
            s.close()
            reopen.append(time.monotonic() + 1)
        for s, t in list(live.items()):
            if t <= now:
                try:
                    s.send(b"X-Slow: 1\r\n")
                    live[s] = now + 1
                except OSError:
                    sel.unregister(s)
                    del live[s]
                    s.close()
                    reopen.append(now + 1)
    for s in live:
        s.close()


def huge(port: int, n: int, until: float, _: Any) -> None:
    """n clients, one after another sending 1 MiB requests: half a header block, half a
    body; at most 1000 in all."""
    block = b"X-Big: " + b"a" * 4000 + b"\r\n"
    header = b"GET /healthz HTTP/1.1\r\nHost: node\r\n" + block * (MIB // len(block)) + b"\r\n"
    body = b"POST /healthz HTTP/1.1\r\nHost: node\r\nContent-Length: %d\r\n\r\n" % MIB \
        + b"b" * MIB
    left = [1000]

    def client(request: bytes) -> None:
        while time.monotonic() < until and left[0] > 0:
            left[0] -= 1
            with contextlib.suppress(OSError), \
                    socket.create_connection(("127.0.0.1", port), timeout=5) as s:
                s.sendall(request)
                read_until_closed(s, min(until, time.monotonic() + 5))

    threads = [threading.Thread(target=client, args=(header if i % 2 else body,), daemon=True)
               for i in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(max(0.0, until - time.monotonic()) + 6)


def burst(port: int, n: int, until: float, results: Any) -> None:
    """Waves of n requests sent at once, one wave every two seconds while three are left: half
    good /healthz requests (their times are reported), the rest bad: a TLS hello, a request
    never finished, a 64 KiB header. Each client sends as soon as it is connected, as a real
    one does; a wave ends when its good requests are answered (or PROBE_TIMEOUT)."""
    bad = [b"\x16\x03\x01\x02\x00\x01\x00\x01\xfc\x03\x03" + os.urandom(64),
           b"GET /healthz HTTP/1.1\r\nHost: node\r\n",
           b"GET /healthz HTTP/1.1\r\nX-Big: " + b"a" * 65536 + b"\r\n\r\n"]
    times: list[float] = []
    while time.monotonic() + 3 < until:
        wave_end = time.monotonic() + 2
        sel = selectors.DefaultSelector()
        for i in range(n):
            # [socket, request, bytes sent, answer, start]: start is None for a bad request
            request = GOOD if i % 2 == 0 else bad[i // 2 % 3]
            st: list[Any] = [nonblocking_connect(port), request, 0, b"",
                  time.perf_counter() if request is GOOD else None]
            sel.register(st[0], selectors.EVENT_WRITE, st)
            _burst_step(sel, st, times)  # loopback is usually connected already: send now
        while time.monotonic() < wave_end + PROBE_TIMEOUT:
            for key, _mask in sel.select(0.05):
                _burst_step(sel, key.data, times)
            if not any(k.data[4] is not None for k in sel.get_map().values()):
                break
        for key in list(sel.get_map().values()):  # unanswered: good ones failed
            if key.data[4] is not None:
                times.append(math.inf)
            key.data[0].close()
        sel.close()
        time.sleep(max(0.0, wave_end - time.monotonic()))
    results.put(times)


def _burst_step(sel: selectors.BaseSelector, st: list[Any], times: list[float]) -> None:
    """Send what is left of st's request, else read its answer; at the end, its time."""
    sock, request = st[0], st[1]
    try:
        if st[2] < len(request):
            st[2] += sock.send(request[st[2]:])
            if st[2] == len(request):
                sel.modify(sock, selectors.EVENT_READ, st)
            return
        chunk = sock.recv(65536)
    except (BlockingIOError, InterruptedError):
        return
    except OSError:
        chunk = b""
    st[3] += chunk
    if not chunk:
        if st[4] is not None:
            times.append(time.perf_counter() - st[4] if st[3][9:12] == b"200" else math.inf)
        sel.unregister(sock)
        sock.close()


# --- the measurement -------------------------------------------------------------------------

def percentile(xs: list[float], p: float) -> float:
    xs = sorted(xs)
    return xs[max(0, math.ceil(p / 100 * len(xs)) - 1)] if xs else math.nan  # nearest rank


def ms(x: float) -> str:
    return "fail" if math.isinf(x) else "-" if math.isnan(x) else f"{x * 1000:.1f}"


def phase(server: Server, rss0: int, name: str, abuser: Any, n: int, seconds: float,
          ramp: float, setup: str | None = None) -> dict[str, Any]:
    ctx = mp.get_context("fork")
    results = ctx.Queue()
    logged0 = server.logged
    setup_result = server.ask(setup) if setup else {}
    until = time.monotonic() + seconds
    proc = None
    if abuser is not None:
        proc = ctx.Process(target=abuser, args=(server.port, n, until, results), daemon=True)
        proc.start()
    time.sleep(ramp)
    peak = {"held": 0, "fds": 0, "threads": 0, "rss": 0}
    stop = threading.Event()

    def sampler() -> None:
        while not stop.is_set():
            for k, v in server.sample().items():
                peak[k] = max(peak[k], v)
            stop.wait(0.25)

    sampling = threading.Thread(target=sampler)
    sampling.start()
    i0 = server.iters()
    lat: list[float] = []
    lb: list[float] = []  # a load balancer's checks of an attacked health-check port
    own: list[str] = []  # own_work() in the server process, every half second
    next_check = time.monotonic()
    while time.monotonic() < until - 0.3:
        if time.monotonic() >= next_check:
            own.append(server.ask("check")["own"])
            next_check += 0.5
        lat.append(good_request(server.port))
        time.sleep(0.02)
        if len(server.targets) > 2 and time.monotonic() < until - 0.3:
            lb.append(good_request(server.targets[2], LB_CHECK))
            time.sleep(0.02)
    i1 = server.iters()
    stop.set()
    sampling.join()
    burst_times: list[float] = []
    flood: dict[str, int] = {}
    if proc is not None:
        with contextlib.suppress(Exception):
            if abuser is burst:
                burst_times = results.get(timeout=PROBE_TIMEOUT + 5)
            elif abuser is length_flood:
                flood = results.get(timeout=PROBE_TIMEOUT + 5)
        proc.join(15)
        if proc.is_alive():
            proc.kill()
    # let the server let go of what the abuser held before the next phase
    settle = time.monotonic() + 15
    while server.sample()["held"] > 0 and time.monotonic() < settle:
        time.sleep(0.1)
    time.sleep(0.2)  # what the server still logs
    return {"name": name, "held": peak["held"], "fds": peak["fds"], "threads": peak["threads"],
            "rss": (peak["rss"] - rss0) / MIB, "lat": lat, "lb": lb, "burst": burst_times,
            "flood": flood, "setup": setup_result, "own": own,
            "log": server.logged - logged0,
            "rate": (i1["iters"] - i0["iters"]) / (i1["t"] - i0["t"]),
            "sync_cpu": (i1["sync_cpu"] - i0["sync_cpu"]) / (i1["t"] - i0["t"]),
            # what every thread but the stand-in used: the HTTP server's CPU
            "http_cpu": (i1["cpu"] - i0["cpu"] - i1["sync_cpu"] + i0["sync_cpu"])
            / (i1["t"] - i0["t"])}


def answered(lat: list[float]) -> str:
    return f"{sum(not math.isinf(x) for x in lat)}/{len(lat)}" if lat else "-"


def table(rows: list[dict[str, Any]]) -> str:
    head = ("phase", "held", "fds", "threads", "RSS +MiB", "good ok/sent", ">1s", "p50 ms",
            "p99 ms", "lb ok/sent", "sync it/s", "sync %", "sync CPU %", "http CPU %", "log KiB",
            "own ok/tried")
    lines = [head]
    base = rows[0]["rate"]
    for r in rows:
        lat = r["lat"]
        slow = sum(x > KUBELET_TIMEOUT for x in lat + r["lb"])
        base = r["rate"] if r.get("base") else base  # each server's first row is its own base
        lines.append((r["name"], str(r["held"]), str(r["fds"]), str(r["threads"]),
                      f"{r['rss']:.1f}", answered(lat), str(slow), ms(percentile(lat, 50)),
                      ms(percentile(lat, 99)), answered(r["lb"]), f"{r['rate']:.0f}",
                      f"{100 * r['rate'] / base:.0f}", f"{100 * r['sync_cpu']:.0f}",
                      f"{100 * r['http_cpu']:.0f}", f"{r['log'] / 1024:.1f}",
                      f"{sum(o == 'ok' for o in r['own'])}/{len(r['own'])}"))
    widths = [max(len(line[i]) for line in lines) for i in range(len(head))]
    out = ["  ".join(c.ljust(w) if i == 0 else c.rjust(w) for i, (c, w) in
                     enumerate(zip(line, widths, strict=True))) for line in lines]
    for r in rows:
        if r["burst"]:
            b = r["burst"]
            out.append(f"{r['name']}: the burst's own good requests: "
                       f"{sum(not math.isinf(x) for x in b)}/{len(b)} answered, "
                       f"p50 {ms(percentile(b, 50))} ms, p99 {ms(percentile(b, 99))} ms")
        if r["flood"]:
            f = r["flood"]
            out.append(f"{r['name']}: {f['refused']} of its {f['sent']} requests answered 400; "
                       f"{r['log'] / max(1, f['sent']):.0f} bytes of log per request")
        if r["setup"]:
            out.append(f"{r['name']}: health-check ports listening: {r['setup']['open']}, "
                       f"synced in {r['setup']['seconds']:.2f} s")
        failed = sorted({o for o in r["own"] if o != "ok"})
        if failed:
            out.append(f"{r['name']}: the server process's own work failed: "
                       f"{', '.join(failed)}")
    return "\n".join(out)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench.http_abuse", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--http-module", help="daemon/http.py to measure (default: this tree's)")
    ap.add_argument("--quick", action="store_true", help="smaller and shorter phases")
    ap.add_argument("--serve", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--tenant-ports", type=int, default=0, help=argparse.SUPPRESS)
    ap.add_argument("--nofile", type=int, help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.serve:
        serve_main(args.http_module, args.tenant_ports, args.nofile)
        return 0
    module = str(Path(args.http_module).resolve()) if args.http_module else None
    with contextlib.suppress(OSError):
        os.sched_setaffinity(0, CLIENT_CPUS)
    _, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))  # children inherit it
    signal.alarm(480)  # whatever happens, this stops
    quick = 0.5 if args.quick else 1.0  # clients and seconds, not the slowloris phase's
    many = min(5000, hard - 500)  # the abuser's fds: the server's own are capped or not
    # (name, abuser, clients, seconds, ramp before measuring); the slowloris phase outlasts
    # the request deadline (5 s), so cut clients are seen coming back
    phases: list[tuple[str, Any, int, float, float]] = [
        ("no abuse", None, 0, 4, 0.5),
        ("idle {}", idle, 1000, 7, 3.5),
        ("idle {}", idle, many, 8, 3.5),
        ("slowloris {}", slowloris, 300, 9, 1.5),
        ("huge 1 MiB x{}", huge, 20, 6, 1),
        ("burst {}", burst, 2000, 7, 0.2),
        ("Content-Length flood {}", length_flood, 1000, 12, 0.2),
        ("no abuse, again", None, 0, 4, 0.5),  # what the machine's noise alone does
    ]
    rows = run_phases(Server(module), module, phases, quick, hard)
    # a node with a tenant's 50 LoadBalancer Services (externalTrafficPolicy Local), under a
    # limit of 1024 descriptors: idle connections spread over five listeners, then the tenant
    # makes that 2,000 Services (no two engineers' runs agree on free ports: picked here)
    tenant = Server(module, tenant_ports=50, nofile=TENANT_NOFILE)
    taken = set(tenant.ports)
    ports = tenant.ports + [p for p in free_ports(2100) if p not in taken][:2000 - len(taken)]
    spread = functools.partial(idle_spread, ports=tenant.targets)
    rows += run_phases(tenant, module, [
        ("tenant: no abuse", None, 0, 4, 0.5),
        ("tenant: idle {} over 5 listeners", spread, 1500, 8, 3.5),
        ("tenant: 2,000 health-check ports", None, 0, 6, 0.5, f"ports {json.dumps(ports)}"),
    ], quick, TENANT_NOFILE)
    print(table(rows))
    print("held: sockets the server process holds beyond its own, peak; fds: its descriptors, "
          "peak; RSS: peak growth over the start; good: /healthz from a client like the "
          "kubelet during the abuse (failed: no 200 in 5 s; >1s: slower than a probe's default "
          "timeout, /healthz or lb); lb: a load balancer's check of an attacked health-check "
          "port; sync: the stand-in's iterations per second, and % of its server's first row; "
          "sync CPU, http CPU: the stand-in's CPU and the rest of the server process's, % of "
          "one CPU; log: what the server process logged during the phase; own: how often (every "
          "0.5 s) it could open a socket, run a subprocess and make a temporary file")
    return 0


def run_phases(server: Server, module: str | None, phases: list[tuple[Any, ...]],
               quick: float, limit: int) -> list[dict[str, Any]]:
    try:
        for _ in range(20):  # warm up: imports, first answers
            good_request(server.port)
        rss0 = server.sample()["rss"]
        print(f"server: {module or 'ipvsproxy/daemon/http.py'} (pid {server.proc.pid}, "
              f"port {server.port}, {len(server.open)} health-check ports); RSS at start "
              f"{rss0 / MIB:.1f} MiB; fd limit {limit}", flush=True)
        rows = []
        for name, abuser, n, seconds, ramp, *setup in phases:
            n = int(n * quick)
            if abuser is not slowloris:
                seconds, ramp = seconds * quick, ramp * quick
            rows.append(phase(server, rss0, name.format(f"{n:,}"), abuser, n, seconds, ramp,
                              *setup))
            print(f"  {name.format(n)}: done", file=sys.stderr, flush=True)
        rows[0]["base"] = True
    finally:
        server.stop()
    return rows


if __name__ == "__main__":
    sys.exit(main())
