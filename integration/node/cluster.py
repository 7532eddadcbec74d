"""A one-node Kubernetes cluster for `make e2e`: the control plane on the host, the node in the lab.

The host runs etcd, kube-apiserver, kube-controller-manager and kube-scheduler (v1.35.4, built
by integration/upstream/) in a network namespace of its own, `ipvsproxy-e2e-<pid>`, on a tap
device with 10.0.3.1/24; the lab guest (Debian's kernel, with IPVS) is the node, its virtio NIC
on the other end of that tap with 10.0.3.2, so each side reaches the other as on a real node
network: the kubelet reaches the API server, and the API server reaches the kubelet
(`kubectl exec`, `kubectl logs`). Nothing in the namespace is routed anywhere else: the
machine's own network is never touched, and everything goes away with the namespace.

The node boots with a disk of its own (an ext4 image file, virtio-blk, mounted at
/var/lib/node): containerd's images and state and the kubelet's folder live there, so a second
boot of the same disk is the same node rebooted: its files kept, its kernel state (IPVS, ipsets,
iptables, addresses) gone. `integration/node/guest.sh` sets the node up at every boot,
`agent.py` is how the host runs commands there.

Identities as in a kubeadm cluster: the kubelet is `system:node:node-a` (group `system:nodes`,
the Node authorizer and NodeRestriction), the controller manager and the scheduler are their
`system:kube-*` users, the API server reaches the kubelet with a client certificate of a CA the
kubelet trusts, and the kubelet authorises it by webhook. Static tokens stand in for the
certificates kubeadm would issue.
"""

from __future__ import annotations

import contextlib
import json
import os
import secrets
import shutil
import subprocess
import sys
import tempfile
import threading
import time
import urllib.error
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from integration.upstream.controlplane import ControlPlane, free_port
from integration.vm import lab

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]
HOST_IP = "10.0.3.1"
NODE_IP = "10.0.3.2"
PREFIX = 24
TAP = "ipvsp-e2e0"
NODE_MAC = "52:54:00:e2:e0:02"
NODE_NAME = "node-a"
POD_CIDR = "10.244.1.0/24"  # this node's pods (inside deploy/config.conf's clusterCIDR)
AGENT_PORT = 7007


class ClusterError(Exception):
    """The cluster could not be set up or did not answer; the message says what and why."""


def netns_name() -> str:
    return f"ipvsproxy-e2e-{os.getpid()}"


def _ip(*args: str) -> None:
    p = subprocess.run(["ip", *args], capture_output=True, text=True, check=False)
    if p.returncode != 0:
        raise ClusterError(f"ip {' '.join(args)}: {p.stderr.strip()}")


@contextlib.contextmanager
def network_namespace() -> Any:
    """A network namespace with loopback and the tap device the node's NIC will use; removed
    at the end (which removes the tap too)."""
    ns = netns_name()
    _ip("netns", "add", ns)
    try:
        _ip("-n", ns, "link", "set", "lo", "up")
        _ip("netns", "exec", ns, "ip", "tuntap", "add", "dev", TAP, "mode", "tap")
        _ip("-n", ns, "addr", "add", f"{HOST_IP}/{PREFIX}", "dev", TAP)
        _ip("-n", ns, "link", "set", TAP, "up")
        yield ns
    finally:
        subprocess.run(["ip", "netns", "del", ns], capture_output=True, check=False)


def _openssl(*args: str) -> None:
    p = subprocess.run(["openssl", *args], capture_output=True, text=True, check=False)
    if p.returncode != 0:
        raise ClusterError(f"openssl {args[0]} failed: {p.stderr.strip()[-500:]}")


def kubelet_client_pki(d: Path) -> None:
    """A CA the kubelet trusts for clients, and the API server's client certificate from it
    (kubeadm's apiserver-kubelet-client: group system:masters)."""
    d.mkdir(parents=True, exist_ok=True)
    _openssl("req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "2",
             "-subj", "/CN=kubelet-client-ca", "-keyout", str(d / "ca.key"),
             "-out", str(d / "ca.crt"))
    _openssl("req", "-newkey", "rsa:2048", "-nodes", "-subj",
             "/O=system:masters/CN=kube-apiserver-kubelet-client",
             "-keyout", str(d / "client.key"), "-out", str(d / "client.csr"))
    _openssl("x509", "-req", "-in", str(d / "client.csr"), "-CA", str(d / "ca.crt"),
             "-CAkey", str(d / "ca.key"), "-CAcreateserial", "-days", "2",
             "-out", str(d / "client.crt"))


@dataclass
class Cluster:
    """The control plane of the node's cluster, on the host, inside the namespace (the
    process that makes it must already run there)."""

    work: Path
    cp: ControlPlane = field(init=False)
    tokens: dict[str, str] = field(default_factory=dict)
    procs: dict[str, subprocess.Popen[bytes]] = field(default_factory=dict)

    def __post_init__(self) -> None:
        kubelet_client_pki(self.work / "pki")
        self.cp = ControlPlane(
            workdir=self.work / "controlplane", bind_address=HOST_IP,
            advertise_address=HOST_IP, authorization_mode="Node,RBAC",
            extra_args=[
                "--enable-admission-plugins=NodeRestriction",
                f"--kubelet-client-certificate={self.work / 'pki' / 'client.crt'}",
                f"--kubelet-client-key={self.work / 'pki' / 'client.key'}",
                "--kubelet-preferred-address-types=InternalIP",
                "--allow-privileged=true",
            ])
        # Static tokens for the kubelet and the two controllers (what kubeadm's certificates
        # say: user and groups). tokens.csv: token,user,uid,"groups"
        users = {"kubelet": (f"system:node:{NODE_NAME}", "system:nodes"),
                 "kube-controller-manager": ("system:kube-controller-manager", ""),
                 "kube-scheduler": ("system:kube-scheduler", "")}
        with (self.cp.dir / "tokens.csv").open("a") as f:
            for who, (user, groups) in users.items():
                self.tokens[who] = secrets.token_hex(24)
                f.write(f'{self.tokens[who]},{user},{user},"{groups}"\n')

    @property
    def admin_kubeconfig(self) -> Path:
        return self.work / "admin.kubeconfig"

    def kubeconfig(self, who: str) -> Path:
        return self.cp.kubeconfig(self.work / f"{who}.kubeconfig", self.tokens[who])

    def start(self) -> None:
        self.cp.start()
        self.cp.kubeconfig(self.admin_kubeconfig)
        (self.work / "apiserver-ca.crt").write_text(self.cp.ca_pem)
        bins = self.cp.bin
        cp_dir = self.cp.dir
        self.procs["kube-controller-manager"] = self.cp._spawn("kube-controller-manager", [
            str(bins / "kube-controller-manager"),
            f"--kubeconfig={self.kubeconfig('kube-controller-manager')}",
            "--bind-address=127.0.0.1", f"--secure-port={free_port()}",
            f"--service-account-private-key-file={cp_dir / 'sa.key'}",
            # published in every namespace as kube-root-ca.crt: the CA a pod's in-cluster
            # config trusts (the projected service-account volume)
            f"--root-ca-file={self.work / 'apiserver-ca.crt'}",
            "--use-service-account-credentials=true", "--leader-elect=false",
            "--cluster-name=ipvsproxy-e2e", "--controllers=*"])
        self.procs["kube-scheduler"] = self.cp._spawn("kube-scheduler", [
            str(bins / "kube-scheduler"),
            f"--kubeconfig={self.kubeconfig('kube-scheduler')}",
            "--bind-address=127.0.0.1", f"--secure-port={free_port()}",
            "--leader-elect=false"])
        time.sleep(1)
        for name, proc in self.procs.items():
            if proc.poll() is not None:
                raise ClusterError(f"{name} exited {proc.returncode}:\n"
                                   f"{self.cp.log_tail(name)}")

    def close(self) -> None:
        for proc in self.procs.values():
            if proc.poll() is None:
                proc.terminate()
                try:
                    proc.wait(20)
                except subprocess.TimeoutExpired:
                    proc.kill()
                    proc.wait()
        self.cp.close()

    def node_files(self, out: Path) -> None:
        """What guest.sh needs at boot: the kubelet's kubeconfig and configuration, the CA
        the API server's client certificate comes from."""
        out.mkdir(parents=True, exist_ok=True)
        shutil.copy2(self.kubeconfig("kubelet"), out / "kubelet.kubeconfig")
        shutil.copy2(self.work / "pki" / "ca.crt", out / "kubelet-client-ca.crt")
        (out / "node.env").write_text(
            f"NODE_NAME={NODE_NAME}\nNODE_IP={NODE_IP}\nHOST_IP={HOST_IP}\nPREFIX={PREFIX}\n"
            f"NODE_MAC={NODE_MAC}\nPOD_CIDR={POD_CIDR}\nAGENT_PORT={AGENT_PORT}\n"
            f"KUBELET={self.cp.bin / 'kubelet'}\n")

    # ------------------------------------------------------------------------------ kubectl

    def kubectl(self, *args: str, check: bool = True, timeout: float = 300,
                stdin: str | None = None) -> subprocess.CompletedProcess[str]:
        """The kubectl of the same release, as the cluster's admin."""
        argv = [str(self.cp.bin / "kubectl"), f"--kubeconfig={self.admin_kubeconfig}", *args]
        p = subprocess.run(argv, capture_output=True, text=True, timeout=timeout,
                           input=stdin, check=False)
        if check and p.returncode != 0:
            raise ClusterError(f"kubectl {' '.join(args)} (exit {p.returncode}):\n"
                               f"{p.stdout[-2000:]}{p.stderr[-2000:]}")
        return p


# ----------------------------------------------------------------------------------- the node


class Node:
    """The lab guest as a node: `boot()` starts it (guest.sh, in a thread), `agent()` runs a
    command on it, `shutdown()` stops the kubelet and containerd and ends the guest."""

    def __init__(self, work: Path, disk_size: str = "6G", memory: str = "3G") -> None:
        self.work = work
        self.files = work / "node"
        self.disk = work / "node-disk.img"
        self.memory = memory
        self.boots = 0
        self.thread: threading.Thread | None = None
        self.result: lab.LabResult | None = None
        self.proc: subprocess.Popen[str] | None = None
        self.error: BaseException | None = None
        self.disk_size = disk_size

    def prepare_disk(self, archives: list[Path]) -> float:
        """The node's disk, made on the host with the images already in containerd's store:
        a containerd of the same build (Debian's, the one the guest runs) imports them into a
        root folder, and `mkfs.ext4 -d` makes the disk from it. Importing in the guest read
        the archives over 9p at ~2 MB/s and hashed them at ~1.5 MB/s under emulation: 25 min
        for ipvsproxy's two images, against seconds here. Returns the seconds it took."""
        t = time.monotonic()
        root = self.work / "disk-root"
        store = root / "containerd"
        store.mkdir(parents=True)
        state = Path(tempfile.mkdtemp(prefix="ipvsproxy-e2e-containerd-", dir="/run"))
        sock = state / "containerd.sock"
        config = state / "config.toml"
        # Its own root, state and socket; no CRI (nothing on the host's network), and the
        # `opt` plugin's folder inside the state, not /opt/containerd.
        config.write_text(
            f'version = 2\nroot = "{store}"\nstate = "{state / "state"}"\n'
            f'disabled_plugins = ["io.containerd.grpc.v1.cri"]\n'
            f'[grpc]\n  address = "{sock}"\n[ttrpc]\n  address = "{state / "ttrpc.sock"}"\n'
            f'[plugins."io.containerd.internal.v1.opt"]\n  path = "{state / "opt"}"\n')
        log = (self.work / "host-containerd.log").open("wb")
        proc = subprocess.Popen(["containerd", "--config", str(config)], stdout=log,
                                stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
        try:
            for _ in range(200):
                if sock.exists():
                    break
                time.sleep(0.1)
            for archive in archives:
                p = subprocess.run(["ctr", "--address", str(sock), "-n", "k8s.io", "images",
                                    "import", str(archive)], capture_output=True, text=True,
                                   check=False)
                if p.returncode != 0:
                    raise ClusterError(f"ctr images import {archive}: {p.stderr[-1000:]}")
        finally:
            proc.terminate()
            proc.wait(30)
            log.close()
            shutil.rmtree(state, ignore_errors=True)
        subprocess.run(["truncate", "-s", self.disk_size, str(self.disk)], check=True)
        p = subprocess.run(["mkfs.ext4", "-q", "-F", "-L", "node", "-d", str(root),
                            str(self.disk)], capture_output=True, text=True, check=False)
        if p.returncode != 0:
            raise ClusterError(f"mkfs.ext4 -d {root}: {p.stderr[-1000:]}")
        shutil.rmtree(root, ignore_errors=True)
        return time.monotonic() - t

    def boot(self, names: list[str], timeout: float = 3600) -> None:
        """Boot the guest (in a thread); guest.sh checks that the disk holds the images
        `names` (prepare_disk put them there)."""
        self.boots += 1
        boot_dir = self.files / f"boot{self.boots}"
        boot_dir.mkdir(parents=True, exist_ok=True)
        (self.files / "images").write_text("".join(f"{n}\n" for n in names))
        cmd = (f"bash {HERE / 'guest.sh'} {self.files} {boot_dir} "
               f"{sys.executable} {ROOT}")
        vng_args = ["--disk", str(self.disk),
                    f"--qemu-opts=-netdev tap,id=e2e,ifname={TAP},script=no,downscript=no "
                    f"-device virtio-net-pci,netdev=e2e,mac={NODE_MAC}"]

        def run() -> None:
            try:
                self.result = lab.run(cmd, timeout=timeout, memory=self.memory, cpus=2,
                                      extra_rwdirs=[self.files], vng_args=vng_args,
                                      on_start=self._started)
            except BaseException as exc:  # reported by wait_agent / shutdown
                self.error = exc

        self.result, self.error = None, None
        self.thread = threading.Thread(target=run, name=f"node-boot{self.boots}", daemon=True)
        self.thread.start()

    def _started(self, proc: subprocess.Popen[str]) -> None:
        self.proc = proc

    def kill(self) -> None:
        """End the guest at once (its qemu's process group), if it still runs."""
        if self.proc is not None and self.proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.proc.pid, 9)
        if self.thread is not None:
            self.thread.join(30)
            self.thread = None

    @property
    def boot_dir(self) -> Path:
        return self.files / f"boot{self.boots}"

    def guest_log(self, lines: int = 60) -> str:
        out = []
        for name in ("guest.log", "kubelet.log", "containerd.log"):
            p = self.boot_dir / name
            if p.exists():
                tail = p.read_text(errors="replace").splitlines()[-lines:]
                out.append(f"---- {name}\n" + "\n".join(tail))
        if self.result is not None:
            out.append(f"---- guest output (exit {self.result.rc})\n{self.result.output[-3000:]}")
        if self.error is not None:
            out.append(f"---- lab error\n{self.error}")
        return "\n".join(out)

    def agent(self, argv: list[str], timeout: float = 120, check: bool = True,
              background: str = "") -> dict[str, Any]:
        """Run `argv` on the node; {rc, out} (`background`: start it under that name, and
        `collect(name)` later)."""
        body = {"argv": argv, "timeout": timeout, "background": background}
        got = self._agent_call("/run", body, timeout + 30)
        if check and not background and got["rc"] != 0:
            raise ClusterError(f"on the node: {' '.join(argv)} (exit {got['rc']}):\n"
                               f"{got['out'][-3000:]}")
        return got

    def collect(self, name: str, timeout: float = 600) -> dict[str, Any]:
        return self._agent_call("/collect", {"name": name, "timeout": timeout}, timeout + 30)

    def sh(self, script: str, timeout: float = 120, check: bool = True) -> str:
        return str(self.agent(["bash", "-c", script], timeout=timeout, check=check)["out"])

    def _agent_call(self, path: str, body: dict[str, Any], timeout: float) -> dict[str, Any]:
        req = urllib.request.Request(f"http://{NODE_IP}:{AGENT_PORT}{path}",
                                     json.dumps(body).encode(), method="POST",
                                     headers={"Content-Type": "application/json"})
        with urllib.request.urlopen(req, timeout=timeout) as r:
            return json.loads(r.read())  # type: ignore[no-any-return]

    def wait_agent(self, timeout: float = 900) -> float:
        """Until guest.sh has set the node up and its agent answers; the seconds it took."""
        t0 = time.monotonic()
        while time.monotonic() - t0 < timeout:
            if self.thread is not None and not self.thread.is_alive():
                raise ClusterError(f"the node's guest ended before its agent answered:\n"
                                   f"{self.guest_log()}")
            with contextlib.suppress(OSError, ValueError):
                if self._agent_call("/ping", {}, 5).get("ok"):
                    return time.monotonic() - t0
            time.sleep(2)
        raise ClusterError(f"the node's agent did not answer in {timeout:.0f} s:\n"
                           f"{self.guest_log()}")

    def shutdown(self, timeout: float = 300) -> None:
        """Stop the node as a reboot does (guest.sh: kubelet, containers and containerd
        stopped, the disk unmounted), and wait for the guest to end."""
        if self.thread is None:
            return
        try:
            self._agent_call("/shutdown", {}, 30)
        except (OSError, ValueError):  # no agent to ask: a power cut
            self.kill()
            return
        self.thread.join(timeout)
        if self.thread.is_alive():
            raise ClusterError(f"the node did not stop in {timeout:.0f} s")
        self.thread = None


def temporary_work() -> Path:
    return Path(tempfile.mkdtemp(prefix="ipvsproxy-e2e-"))
