"""A real Kubernetes control plane for the tests: etcd and kube-apiserver, as envtest starts them.

This module owns the two processes and everything they need, in one temporary folder: etcd's data
(127.0.0.1, free ports, no fsync), the API server's self-signed serving certificate (made by the
server itself in --cert-dir and kept across restarts, so one CA for the whole run), the
service-account key pair (openssl), the static token file (one admin token, group
system:masters), the logs and the kubeconfigs it writes. `ControlPlane` is a `Client`
(integration/upstream/client.py: apply, delete, tokens, kubeconfigs) and does what only the
owner does: `stop` the API server (SIGTERM, or SIGKILL as a crash) and `start` it again on the
same port with etcd kept, `compact` etcd's history, and read the server's `audit` log (who
asked what, and the answer's code: how tests tell whether a client was ever refused) and its
`starts` (until /readyz says ok after a start, the server may refuse what its RBAC grants).
A lab guest reaches it through integration/upstream/remote.py.

It must not touch anything outside its folder, listen anywhere but 127.0.0.1, or leave a process
behind: `close()` ends both, and both die with the process that started them. It never skips:
without the binaries it raises `Missing`, whose message names `make setup`. Standard library
only (and the openssl command).

    python -m integration.upstream.controlplane --exit --restarts 2   # time a start, 2 restarts
"""

from __future__ import annotations

import argparse
import base64
import contextlib
import ctypes
import json
import os
import queue
import secrets
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

from integration.ports import free_ports
from integration.upstream.client import ApiError, Client, Obj

# Dual-stack, as a cluster of today: the IPv6 range is within the 20 bits the allocator takes.
SERVICE_CIDRS = "10.96.0.0/16,fd00:96::/112"
ISSUER = "https://kubernetes.default.svc.cluster.local"
# The host as a lab guest on qemu's user network sees it (slirp forwards 10.0.2.2 to the host's
# 127.0.0.1). It is the address the API server advertises: what it writes into the `kubernetes`
# Service's endpoints (it refuses a loopback address there) and what its self-signed certificate
# names next to --bind-address, so the guest's clients verify the server by it. Nothing on the
# host connects to it.
GUEST_SIDE_ADDRESS = "10.0.2.2"
# kube-apiserver refuses --etcd-compaction-interval values it cannot parse; "0" turns its
# compactor off (the tests compact when they mean to).
NO_COMPACTION = "0"


class Missing(Exception):
    """The upstream binaries are not built."""


def binaries() -> Path:
    """The folder holding etcd and kube-apiserver (integration/upstream/build.py's cache)."""
    from integration.upstream import build

    where = os.environ.get("IPVSPROXY_UPSTREAM_BIN")
    if where:
        d: Path | None = Path(where)
    else:
        try:
            d = build.built()
        except SystemExit as exc:  # no go on PATH: build.py cannot even name the cache key
            raise Missing(f"the upstream binaries cannot be located ({exc}): run `make setup`, "
                          "which builds etcd and kube-apiserver") from None
    if d is None or not all((d / b).is_file() for b in ("etcd", "kube-apiserver")):
        raise Missing("etcd and kube-apiserver are not built (integration/upstream/build.py, "
                      f"cache {build.CACHE}): run `make setup`")
    return d


def free_port(host: str = "127.0.0.1") -> int:
    """Below the ephemeral range (integration/ports.py): kube-apiserver's own connections to
    etcd take ephemeral source ports, and the next control plane's port must not be one."""
    return free_ports(1, host)[0]


def _pem_certificates(text: str) -> list[str]:
    end = "-----END CERTIFICATE-----"
    return [b[b.index("-----BEGIN"):].strip() + "\n" + end + "\n"
            for b in text.split(end) if "-----BEGIN CERTIFICATE-----" in b]


def _die_with_parent() -> None:
    """In the child before exec: SIGKILL when the thread that forked it ends (prctl
    PR_SET_PDEATHSIG), which `_Spawner`'s thread does only when the control plane is closed
    or the process that started it dies: an interrupted test run leaves no server behind."""
    with contextlib.suppress(Exception):
        ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGKILL, 0, 0, 0)


class _Spawner:
    """Starts the servers from one thread of its own that lives as long as the control plane:
    the parent-death signal follows the forking *thread*, and the control plane may be
    restarted from any thread (the control server answers each request on a new one)."""

    def __init__(self) -> None:
        self._jobs: queue.Queue[tuple[list[str], Path, queue.Queue[Any]] | None] = queue.Queue()
        self._thread = threading.Thread(target=self._run, name="controlplane-spawner",
                                        daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while (job := self._jobs.get()) is not None:
            argv, log_path, answer = job
            try:
                with log_path.open("ab") as log:
                    log.write(f"\n==== started {time.strftime('%H:%M:%S')}\n".encode())
                    log.flush()
                    answer.put(subprocess.Popen(
                        argv, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                        start_new_session=True, preexec_fn=_die_with_parent))
            except Exception as exc:
                answer.put(exc)

    def spawn(self, argv: list[str], log: Path) -> subprocess.Popen[bytes]:
        answer: queue.Queue[Any] = queue.Queue()
        self._jobs.put((argv, log, answer))
        got = answer.get()
        if isinstance(got, Exception):
            raise got
        return got  # type: ignore[no-any-return]

    def close(self) -> None:
        self._jobs.put(None)
        self._thread.join()


# ------------------------------------------------------------------------------ control plane


class ControlPlane(Client):
    """etcd and kube-apiserver on 127.0.0.1. `start()` starts both and waits until the API
    server is ready and has made its system namespaces and the `kubernetes` Service; `stop()`
    stops the API server only (etcd and the data stay), `start()` brings it back on the same
    port; `close()` ends both and removes the folder."""

    def __init__(self, *, bin_dir: Path | None = None, workdir: Path | None = None,
                 compaction_interval: str = NO_COMPACTION, bind_address: str = "127.0.0.1",
                 advertise_address: str = GUEST_SIDE_ADDRESS,
                 extra_args: Iterable[str] = (), authorization_mode: str = "RBAC") -> None:
        self.bin = bin_dir or binaries()
        self._own_dir = workdir is None
        self.dir = Path(workdir or tempfile.mkdtemp(prefix="ipvsproxy-cp-"))
        self.dir.mkdir(parents=True, exist_ok=True)
        self.compaction_interval = compaction_interval
        self.bind_address, self.advertise_address = bind_address, advertise_address
        self.extra_args = list(extra_args)
        self.authorization_mode = authorization_mode  # e2e's node: Node,RBAC
        self.etcd_port = free_port()
        self.port = free_port(bind_address)
        self.url = f"https://{bind_address}:{self.port}"
        self.admin_token = secrets.token_hex(24)
        self.ca_pem = ""
        self.etcd: subprocess.Popen[bytes] | None = None
        self.apiserver: subprocess.Popen[bytes] | None = None
        self.timings: dict[str, float] = {}
        # (spawned, /readyz ok) of each API server start, unix time
        self.starts: list[tuple[float, float]] = []
        self._prepare()
        self._spawner = _Spawner()

    def _prepare(self) -> None:
        (self.dir / "certs").mkdir(exist_ok=True)
        key, pub = self.dir / "sa.key", self.dir / "sa.pub"
        if not key.exists():
            for cmd in (["openssl", "genrsa", "-out", str(key), "2048"],
                        ["openssl", "rsa", "-in", str(key), "-pubout", "-out", str(pub)]):
                p = subprocess.run(cmd, capture_output=True, text=True, check=False)
                if p.returncode != 0:
                    raise RuntimeError(f"{' '.join(cmd)} failed: {p.stderr.strip()}")
        # Every request, who made it and the answer's code (no bodies): the tests read it to
        # say what a client asked and whether it was ever refused.
        (self.dir / "audit-policy.yaml").write_text(
            "apiVersion: audit.k8s.io/v1\nkind: Policy\nomitStages: [RequestReceived]\n"
            "rules:\n  - level: Metadata\n")
        tokens = self.dir / "tokens.csv"  # token,user,uid,"groups"
        tokens.write_text(f'{self.admin_token},admin,admin-uid,"system:masters"\n')
        os.chmod(tokens, 0o600)

    @property
    def etcd_url(self) -> str:
        return f"http://127.0.0.1:{self.etcd_port}"

    def log_tail(self, name: str = "kube-apiserver", lines: int = 30) -> str:
        path = self.dir / f"{name}.log"
        if not path.exists():
            return ""
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])

    def _spawn(self, name: str, argv: list[str]) -> subprocess.Popen[bytes]:
        return self._spawner.spawn(argv, self.dir / f"{name}.log")

    # ----------------------------------------------------------------------------- processes

    @property
    def running(self) -> bool:
        return self.apiserver is not None

    def start(self, timeout: float = 120.0) -> ControlPlane:
        """Start etcd (once) and the API server; return when the API server is ready."""
        t0 = time.monotonic()
        if self.etcd is None:
            self._start_etcd(timeout)
            self.timings["etcd"] = time.monotonic() - t0
        t1 = time.monotonic()
        self._start_apiserver(timeout)
        self.timings["kube-apiserver"] = time.monotonic() - t1
        self.timings["total"] = time.monotonic() - t0
        return self

    def _start_etcd(self, timeout: float) -> None:
        self.etcd = self._spawn("etcd", [
            str(self.bin / "etcd"), "--name", "ipvsproxy-tests",
            "--data-dir", str(self.dir / "etcd"),
            "--listen-client-urls", self.etcd_url, "--advertise-client-urls", self.etcd_url,
            # one member: nothing listens for peers (port 0, as envtest does)
            "--listen-peer-urls", "http://127.0.0.1:0",
            "--unsafe-no-fsync", "--log-level", "warn"])

        def healthy() -> bool:
            try:
                with urllib.request.urlopen(f"{self.etcd_url}/health", timeout=2) as r:
                    return bool(json.loads(r.read()).get("health") == "true")
            except (OSError, ValueError):
                return False

        self._wait("etcd to answer /health", healthy, self.etcd, "etcd", timeout)

    def apiserver_argv(self) -> list[str]:
        d = self.dir
        return [
            str(self.bin / "kube-apiserver"),
            f"--etcd-servers={self.etcd_url}",
            f"--bind-address={self.bind_address}", f"--secure-port={self.port}",
            f"--advertise-address={self.advertise_address}",
            f"--cert-dir={d / 'certs'}",
            f"--service-account-issuer={ISSUER}",
            f"--service-account-key-file={d / 'sa.pub'}",
            f"--service-account-signing-key-file={d / 'sa.key'}",
            f"--authorization-mode={self.authorization_mode}",
            f"--token-auth-file={d / 'tokens.csv'}",
            f"--service-cluster-ip-range={SERVICE_CIDRS}",
            f"--etcd-compaction-interval={self.compaction_interval}",
            # On SIGTERM, end open watches (normally, as a stream's end) within 2 s; by default
            # the server holds them, silent, until its 60 s shutdown timeout.
            "--shutdown-watch-termination-grace-period=2s",
            # ... but only 3 s after SIGTERM. The server takes itself out of `kubernetes`'
            # endpoints in a pre-shutdown hook, and without a delay it ends the watches as soon
            # as that write returns, which can be before its watch cache has sent the write to
            # the watchers (genericapiserver.go RunWithContext: NotAcceptingNewRequest waits
            # for the hooks and the delay only). One server is all there is here: a watcher
            # that missed the write would keep the endpoint until it came back (seen once in
            # make test: tests/kernel/test_real_apiserver.py, the withdrawn endpoint).
            "--shutdown-delay-duration=3s",
            f"--audit-policy-file={d / 'audit-policy.yaml'}",
            f"--audit-log-path={d / 'audit.log'}", "--audit-log-mode=blocking",
            "--audit-log-maxsize=0",
            "--profiling=false",
            *self.extra_args,
        ]

    def _start_apiserver(self, timeout: float) -> None:
        assert self.apiserver is None, "the API server is running"
        spawned = time.time()
        self.apiserver = self._spawn("kube-apiserver", self.apiserver_argv())
        self._wait("the API server's serving certificate", self._load_ca, self.apiserver,
                   "kube-apiserver", timeout)

        def ready() -> bool:
            try:
                return bool(self.request("GET", "/readyz", raw=True, timeout=5) == "ok")
            except (OSError, ApiError):
                return False

        self._wait("the API server to be ready (/readyz)", ready, self.apiserver,
                   "kube-apiserver", timeout)
        # It answers as soon as it listens, before /readyz says ok: until then it may refuse
        # what its RBAC grants (its authorizer's caches are still filling), as any server
        # reached without a load balancer's readiness check.
        self.starts.append((spawned, time.time()))
        # The bootstrap controller makes the system namespaces and the `kubernetes` Service
        # (and its EndpointSlice) after /readyz may already say ok.
        self._wait("the default and kube-system namespaces and the kubernetes Service",
                   self._bootstrapped, self.apiserver, "kube-apiserver", timeout)

    def _bootstrapped(self) -> bool:
        try:
            for path in ("/api/v1/namespaces/default", "/api/v1/namespaces/kube-system",
                         "/api/v1/namespaces/default/services/kubernetes"):
                self.request("GET", path)
            slices = self.collection("EndpointSlice", "default",
                               labelSelector="kubernetes.io/service-name=kubernetes")
        except (OSError, ApiError):
            return False
        return bool(slices.get("items"))

    def _load_ca(self) -> bool:
        crt = self.dir / "certs" / "apiserver.crt"
        if not crt.exists():
            return False
        # The generated file holds the serving certificate, then the CA that signed it.
        blocks = _pem_certificates(crt.read_text())
        if len(blocks) < 2:
            return False
        self.ca_pem = blocks[-1]
        return True

    def _wait(self, what: str, cond: Callable[[], bool], proc: subprocess.Popen[bytes],
              name: str, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        while not cond():
            if proc.poll() is not None:
                raise RuntimeError(f"{name} exited {proc.returncode} while waiting for {what}:\n"
                                   f"{self.log_tail(name)}")
            if time.monotonic() > deadline:
                raise RuntimeError(f"timed out after {timeout:.0f}s waiting for {what}:\n"
                                   f"{self.log_tail(name)}")
            time.sleep(0.05)

    def stop(self, timeout: float = 60.0, kill: bool = False) -> None:
        """Stop the API server (SIGTERM, as a kubelet stops its static pod; `kill`: SIGKILL,
        as a crash); etcd stays."""
        proc, self.apiserver = self.apiserver, None
        if proc is not None:
            if kill:
                proc.kill()
                proc.wait()
            else:
                _terminate(proc, timeout)

    def restart(self, timeout: float = 120.0) -> ControlPlane:
        self.stop()
        return self.start(timeout)

    def close(self) -> None:
        self.stop()
        proc, self.etcd = self.etcd, None
        if proc is not None:
            _terminate(proc, 30.0)
        self._spawner.close()
        if self._own_dir:
            shutil.rmtree(self.dir, ignore_errors=True)

    def __enter__(self) -> ControlPlane:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def audit(self, user: str | None = None) -> list[Obj]:
        """The audit log's requests, once each (a watch when its response started, the others
        when complete), of `user` if given, as {time (received, unix), user, verb, apiGroup,
        resource, name, namespace, uri, code}."""
        out: list[Obj] = []
        path = self.dir / "audit.log"
        if not path.exists():
            return out
        seen: set[str] = set()
        for line in path.read_text(errors="replace").splitlines():
            try:
                ev = json.loads(line)
            except ValueError:
                continue  # a line being written
            if ev.get("stage") not in ("ResponseComplete", "ResponseStarted"):
                continue
            if ev.get("auditID") in seen:  # a watch's end, after its start
                continue
            seen.add(ev.get("auditID"))
            who = (ev.get("user") or {}).get("username")
            if user is not None and who != user:
                continue
            ref = ev.get("objectRef") or {}
            out.append({"time": _unix(ev.get("requestReceivedTimestamp", "")),
                        "user": who, "verb": ev.get("verb"), "apiGroup": ref.get("apiGroup", ""),
                        "resource": ref.get("resource"), "name": ref.get("name"),
                        "namespace": ref.get("namespace"), "uri": ev.get("requestURI"),
                        "code": (ev.get("responseStatus") or {}).get("code"),
                        "stage": ev["stage"], "auditID": ev.get("auditID")})
        return out

    # ---------------------------------------------------------------------------------- etcd

    def _etcd(self, call: str, body: Obj) -> Obj:
        req = urllib.request.Request(f"{self.etcd_url}/v3/{call}", json.dumps(body).encode(),
                                     method="POST", headers={"Content-Type": "application/json"})
        with urllib.request.urlopen(req, timeout=30) as r:
            return json.loads(r.read())  # type: ignore[no-any-return]

    def etcd_revision(self) -> int:
        key = base64.b64encode(b"compact_rev_key").decode()
        return int(self._etcd("kv/range", {"key": key})["header"]["revision"])

    def etcd_bump(self) -> int:
        """Move etcd's revision on by one write outside what the API server stores (its keys
        are under /registry); returns the new revision. Done while the API server is down,
        its next watch cache starts past every revision a watcher of the last one saw."""
        key = base64.b64encode(b"/ipvsproxy-test/revision").decode()
        return int(self._etcd("kv/put", {"key": key, "value": ""})["header"]["revision"])

    def compact(self, revision: int | None = None) -> int:
        """Compact etcd's history up to `revision` (default: the current one), what the API
        server's compactor does every --etcd-compaction-interval; returns the revision."""
        rev = revision or self.etcd_revision()
        self._etcd("kv/compaction", {"revision": str(rev), "physical": True})
        return rev

    def compacted(self, revision: int) -> bool:
        """Whether etcd's history no longer holds `revision` (a read at it is refused)."""
        key = base64.b64encode(b"compact_rev_key").decode()
        try:
            self._etcd("kv/range", {"key": key, "revision": str(revision)})
        except urllib.error.HTTPError as e:
            return b"compacted" in e.read()
        return False


def _unix(stamp: str) -> float:
    """An audit timestamp (RFC 3339, UTC, microseconds) as unix time; 0 if absent."""
    from datetime import datetime

    return datetime.fromisoformat(stamp.replace("Z", "+00:00")).timestamp() if stamp else 0.0


def _terminate(proc: subprocess.Popen[bytes], timeout: float) -> None:
    if proc.poll() is None:
        with contextlib.suppress(ProcessLookupError):
            proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="Start etcd and kube-apiserver on 127.0.0.1; "
                                                 "print the admin kubeconfig and start-up times.")
    parser.add_argument("--restarts", type=int, default=0,
                        help="stop and start the API server this many times, timing each")
    parser.add_argument("--exit", action="store_true", help="stop once started (for timing)")
    args = parser.parse_args(argv)
    try:
        cp = ControlPlane()
    except Missing as exc:
        print(f"controlplane: {exc}", file=sys.stderr)
        return 1
    with cp:
        cp.start()
        print(f"etcd {cp.timings['etcd']:.2f}s, kube-apiserver {cp.timings['kube-apiserver']:.2f}s"
              f" (ready, bootstrapped), total {cp.timings['total']:.2f}s", file=sys.stderr)
        for _ in range(args.restarts):
            t = time.monotonic()
            cp.stop()
            stopped = time.monotonic() - t
            cp.start()
            print(f"restart: stop {stopped:.2f}s, start {cp.timings['kube-apiserver']:.2f}s",
                  file=sys.stderr)
        print(cp.kubeconfig(cp.dir / "admin.kubeconfig"))
        if not args.exit:
            with contextlib.suppress(KeyboardInterrupt):
                signal.pause()
    return 0


if __name__ == "__main__":
    sys.exit(main())
