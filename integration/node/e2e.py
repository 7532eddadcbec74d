"""`make e2e`: ipvsproxy deployed on a real node as deploy/README.md tells an operator to.

Steps (each timed, each printing what it proves; the first failure ends the run):

  images      the project's Dockerfile built by buildah on a base made here, the workload,
              pause and kube-proxy images (integration/node/images.py)
  cluster     etcd, kube-apiserver, kube-controller-manager, kube-scheduler on the host, the
              node in the lab guest: containerd, runc, CNI, kubelet, registered and Ready
  kube-proxy  kube-proxy v1.35.4's DaemonSet (IPVS mode, as kubeadm deploys it) programs the
              node
  workload    a Deployment of the echo image and its Services (ClusterIP, NodePort, UDP)
  swap        deploy/README.md's "Replace kube-proxy", as one script, while clients on the
              node and in a pod open connections: kube-proxy's DaemonSet parked, ipvsproxy's
              applied, taking kube-proxy's state over in place; none may fail
  traffic     from a pod and from the node through the ClusterIP and the NodePort, TCP and
              UDP, answered by the pods; `kubectl exec daemonset/ipvsproxy -- ipvsproxy ls
              -Ln` lists them; /healthz answers through the probe (the pod is Ready) and on
              the node; the pod's logs are JSON lines
  scale       3 -> 5 -> 2 replicas: the real servers follow
  rolling     a new image rolled out (kustomization's newTag, `kubectl apply -k`) while
              clients on the node and in a pod open connections: none may fail
  reboot      the node rebooted (the same disk, a new kernel: IPVS, ipsets, rules gone): the
              kubelet restarts the proxy, which reaches the API server through the
              ConfigMap's address and programs the node again; traffic flows
  deploy      (--no-kube-proxy, in place of kube-proxy and swap: a cluster that never had
              kube-proxy) the operator's path command by command: the ConfigMap with the API
              server's address, `kubectl apply -k` of deploy/, rollout status, the first sync

    python -m integration.node.e2e [--keep] [--steps a,b,...] [--no-kube-proxy]
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import json
import os
import shutil
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from integration.node import cluster as c

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]
# kube-proxy first, then deploy/README.md's "Replace kube-proxy" under traffic, as an operator
# moves a cluster; its kube-proxy and swap steps (~4 min) take the place of deploy (~4 min)
STEPS = ("images", "cluster", "kube-proxy", "workload", "swap", "traffic", "scale", "rolling",
         "reboot")
# --no-kube-proxy: a cluster that never had kube-proxy, deploy/README.md's commands one by one
FRESH_STEPS = ("images", "cluster", "deploy", "workload", "traffic", "scale", "rolling",
               "reboot")
REGISTRY = "localhost/ipvsproxy-e2e"
NEXT_TAG = "0.1.0-next"


class Failed(Exception):
    pass


def check(cond: object, what: str) -> None:
    if not cond:
        raise Failed(what)


def wait_for(what: str, cond: Callable[[], object], timeout: float, every: float = 2) -> float:
    """Until `cond()` is truthy; the seconds it took. Failing: the last value or exception."""
    t0 = time.monotonic()
    last: object = None
    while time.monotonic() - t0 < timeout:
        try:
            last = cond()
            if last:
                return time.monotonic() - t0
        except (c.ClusterError, Failed, OSError, ValueError, KeyError) as exc:
            last = exc
        time.sleep(every)
    raise Failed(f"timed out after {timeout:.0f} s waiting for {what}; last: {last}")


class E2E:
    def __init__(self, work: Path, images: dict[str, tuple[str, Path]]) -> None:
        self.work = work
        self.images = images
        self.cluster = c.Cluster(work)
        self.node = c.Node(work)
        self.deploy_dir = work / "deploy"
        self.proofs: list[tuple[str, float, str]] = []

    # ------------------------------------------------------------------------------ helpers

    def kubectl(self, *args: str, **kw: object) -> str:
        return self.cluster.kubectl(*args, **kw).stdout  # type: ignore[arg-type]

    def get(self, *args: str) -> Any:
        return json.loads(self.kubectl("get", "-o", "json", *args))

    def proxy_ls(self, *args: str) -> str:
        return self.kubectl("-n", "kube-system", "exec", "daemonset/ipvsproxy", "--",
                            "ipvsproxy", "ls", "-Ln", *args)

    def cluster_ip(self, svc: str) -> str:
        return str(self.get("service", svc)["spec"]["clusterIP"])

    def node_port(self, svc: str, port: int = 0) -> int:
        return int(self.get("service", svc)["spec"]["ports"][port]["nodePort"])

    # -------------------------------------------------------------------------------- steps

    def step_cluster(self) -> str:
        took = self.node.prepare_disk([p for _, p in self.images.values()])
        print(f"   the node's disk with {len(self.images)} images in containerd's store: "
              f"{took:.0f} s", flush=True)
        self.cluster.start()
        self.cluster.node_files(self.node.files)
        self.boot()
        return ("control plane (etcd, kube-apiserver, kube-controller-manager, kube-scheduler "
                f"v1.35.4) on {c.HOST_IP}; node {c.NODE_NAME} ({c.NODE_IP}): containerd, runc, "
                "CNI bridge, kubelet registered and Ready, images imported")

    def operator(self, command: str, timeout: float = 600) -> str:
        """A command of deploy/README.md, run as the operator would: bash in a folder holding a
        copy of deploy/, with the release's kubectl first on PATH and the admin's kubeconfig."""
        bindir = self.work / "bin"
        bindir.mkdir(exist_ok=True)
        kubectl = bindir / "kubectl"
        if not kubectl.exists():
            kubectl.symlink_to(self.cluster.cp.bin / "kubectl")
        env = dict(os.environ, PATH=f"{bindir}:{os.environ['PATH']}",
                   KUBECONFIG=str(self.cluster.admin_kubeconfig), REGISTRY=REGISTRY)
        print(f"   $ {command}", flush=True)
        p = subprocess.run(["bash", "-euo", "pipefail", "-c", command], cwd=self.work, env=env,
                           capture_output=True, text=True, timeout=timeout, check=False)
        if p.returncode != 0:
            raise Failed(f"{command!r} exited {p.returncode}:\n{p.stdout[-2000:]}"
                         f"{p.stderr[-2000:]}")
        return p.stdout

    def step_deploy(self) -> str:
        shutil.copytree(ROOT / "deploy", self.deploy_dir)
        # 1. the image, named in kustomization.yaml (it is in the node's containerd already)
        self.operator(readme_command("sed -i \"s|newName: ipvsproxy$|"))
        # 3. the API server's address; the README's example values replaced by this cluster's
        configmap = readme_command("kubectl -n kube-system create configmap ipvsproxy-apiserver")
        configmap = configmap.replace("=10.0.0.10", f"={c.HOST_IP}").replace(
            "=6443", f"={self.cluster.cp.port}")
        check(str(self.cluster.cp.port) in configmap and c.HOST_IP in configmap,
              f"the README's ConfigMap command changed: {configmap}")
        self.operator(configmap)
        # Replace kube-proxy, step 4 (this cluster never had one)
        self.operator(readme_command("kubectl apply -k deploy/"))
        self.operator(readme_command("kubectl -n kube-system rollout status daemonset ipvsproxy")
                      + " --timeout=900s", timeout=960)
        # Ready is not programmed: like kube-proxy's, /healthz is healthy while the proxy
        # starts (no update queued yet), so the first sync may still be running.
        ls = readme_command("kubectl -n kube-system exec daemonset/ipvsproxy -- ipvsproxy ls -Ln")
        first = self.operator(ls)
        took = wait_for("the first sync to program the kubernetes Service",
                        lambda: "10.96.0.1:443" in self.operator(ls), 300, 3)
        listing = self.operator(ls)
        print(f"   programmed {took:.0f} s after rollout status returned"
              + (" (the first ls listed nothing yet)" if "10.96.0.1:443" not in first else ""),
              flush=True)
        print("   " + listing.replace("\n", "\n   "), flush=True)
        image = self.check_deployed()
        return (f"deploy/README.md's commands as written: {image} rolled out, the pod Ready "
                "(startup, readiness /healthz and liveness /livez probes through the kubelet), "
                "`kubectl exec daemonset/ipvsproxy -- ipvsproxy ls -Ln` lists the kubernetes "
                "Service")

    def check_deployed(self) -> str:
        """The DaemonSet's pod as deploy/ makes it: the image named as the README says, the
        init container wrote the sysctls, the proxy runs without privilege and never failed to
        write one (issue 32, item 12). The image."""
        pod = self.proxy_pod()
        image = pod["spec"]["containers"][0]["image"]
        check(image == f"{REGISTRY}/ipvsproxy:0.1.0", f"the pod runs {image}")
        context = pod["spec"]["containers"][0]["securityContext"]
        check(context.get("privileged") is False, f"the proxy's securityContext: {context}")
        init = [json.loads(line) for line in self.kubectl(
            "-n", "kube-system", "logs", pod["metadata"]["name"], "-c", "sysctls").splitlines()]
        done = [r for r in init if r.get("event") == "sysctls set"]
        check(done and done[-1]["failed"] == 0, f"the init container: {init}")
        log = self.kubectl("-n", "kube-system", "logs", pod["metadata"]["name"], "-c",
                           "ipvsproxy")
        check("sysctl" not in log, "the unprivileged proxy touched a sysctl:\n" + log[-2000:])
        print(f"   init container: {done[-1]['written']} of {done[-1]['needed']} sysctls "
              f"written; the proxy runs with {context}", flush=True)
        return str(image)

    def step_workload(self) -> str:
        self.kubectl("apply", "-f", str(HERE / "manifests" / "workload.yaml"))
        self.kubectl("rollout", "status", "deployment/echo", "--timeout=900s", timeout=960)
        self.kubectl("wait", "--for=condition=Ready", "pod/client", "--timeout=600s",
                     timeout=660)
        return ("a Deployment of the echo image (3 replicas), Services echo (ClusterIP, TCP "
                "80 and UDP 53) and echo-nodeport (NodePort), a client pod: scheduled, "
                "networked by the CNI bridge, Ready")

    def echo_pods(self) -> dict[str, str]:
        """The echo pods that are Ready: name -> pod IP."""
        pods = self.get("pods", "-l", "app=echo")["items"]
        return {p["metadata"]["name"]: p["status"]["podIP"] for p in pods
                if p["metadata"].get("deletionTimestamp") is None
                and any(c["type"] == "Ready" and c["status"] == "True"
                        for c in p["status"].get("conditions", []))}

    def from_pod(self, *args: str) -> str:
        return self.kubectl("exec", "client", "--", "python3", "/echo.py", *args,
                            timeout=60).strip()

    def from_node(self, *args: str) -> str:
        return self.node.sh(f"python3 {ROOT}/integration/node/workload/echo.py "
                            + " ".join(args), timeout=60).strip()

    def answers(self, ask: Callable[..., str], *args: str, n: int = 6) -> list[str]:
        """`n` requests (new connections, or new sockets for UDP) from one client process;
        who answered, each a pod of the Deployment."""
        got = ask(*args, str(n)).split()
        check(len(got) == n, f"{args}: {len(got)} answers of {n}: {got}")
        pods = self.echo_pods()
        check(all(a in pods for a in got), f"{args}: answered by {got}, not the pods {pods}")
        return got

    def step_traffic(self) -> str:
        cip, np = self.cluster_ip("echo"), self.node_port("echo-nodeport")
        wait_for("the ClusterIP to answer from the client pod",
                 lambda: self.from_pod("get", f"http://{cip}/"), 120)
        seen: dict[str, list[str]] = {}
        for who, ask in (("pod", self.from_pod), ("node", self.from_node)):
            seen[f"{who} -> ClusterIP"] = self.answers(ask, "get", f"http://{cip}/")
            seen[f"{who} -> NodePort"] = self.answers(ask, "get", f"http://{c.NODE_IP}:{np}/")
            seen[f"{who} -> ClusterIP UDP"] = self.answers(ask, "udp", cip, "53", n=3)
        for what, got in seen.items():
            print(f"   {what}: {', '.join(got)}", flush=True)
        check(len(set(seen["pod -> ClusterIP"])) >= 2, "no round robin from the pod")
        pods = self.echo_pods()
        listing = self.proxy_ls("-t", f"{cip}:80")
        print("   " + listing.replace("\n", "\n   "), flush=True)
        check(real_servers(listing) == sorted(f"{ip}:8080" for ip in pods.values()),
              f"ls -Ln -t {cip}:80 lists {real_servers(listing)}, the pods are {pods}")
        # /healthz: the kubelet's probe (the pod is Ready only through it) and on the node
        pod = self.proxy_pod()
        ready = [c_ for c_ in pod["status"]["conditions"] if c_["type"] == "Ready"]
        check(ready and ready[0]["status"] == "True", f"the proxy pod is not Ready: {ready}")
        health = json.loads(self.node.sh(f"curl -sS -m 5 http://{c.NODE_IP}:10256/healthz"))
        check("lastUpdated" in health and "currentTime" in health, f"/healthz: {health}")
        logs = self.kubectl("-n", "kube-system", "logs", "daemonset/ipvsproxy")
        records = [json.loads(line) for line in logs.splitlines() if line.strip()]
        check(records and all({"event", "level", "timestamp"} <= r.keys() for r in records),
              "a log line without event, level or timestamp")
        return (f"from the client pod and from the node: ClusterIP {cip}:80 and NodePort "
                f"{c.NODE_IP}:{np} (TCP) and {cip}:53 (UDP) answered by the echo pods, round "
                f"robin; `ipvsproxy ls -Ln` in the pod lists the {len(pods)} pod IPs; the pod "
                f"Ready through its /healthz probe, /healthz on the node {health}; "
                f"{len(records)} log lines, every one JSON with event, level, timestamp")

    def expect_real_servers(self, vip: str, n: int) -> None:
        def ok() -> bool:
            pods = self.echo_pods()
            got = real_servers(self.proxy_ls("-t", vip))
            return len(pods) == n and got == sorted(f"{ip}:8080" for ip in pods.values())
        took = wait_for(f"{n} real servers behind {vip}", ok, 300, 3)
        print(f"   {n} real servers behind {vip} after {took:.0f} s more", flush=True)

    def step_scale(self) -> str:
        cip = self.cluster_ip("echo")
        for n in (5, 2, 3):
            self.kubectl("scale", "deployment/echo", f"--replicas={n}")
            self.kubectl("rollout", "status", "deployment/echo", "--timeout=600s",
                         timeout=660)
            self.expect_real_servers(f"{cip}:80", n)
            self.answers(self.from_pod, "get", f"http://{cip}/", n=4)
        return ("scaled 3 -> 5 -> 2 -> 3: `ipvsproxy ls -Ln -t` in the proxy pod lists exactly "
                "the Ready pods' IPs each time, and requests land on them")

    def start_clients(self) -> list[str]:
        """Steady traffic: the node and the client pod each open a new connection to the
        ClusterIP and the NodePort every 0.1 s until `stop_clients`."""
        cip, np = self.cluster_ip("echo"), self.node_port("echo-nodeport")
        urls = [f"http://{cip}/", f"http://{c.NODE_IP}:{np}/"]
        self.node.sh("rm -f /tmp/e2e-stop")
        self.kubectl("exec", "client", "--", "rm", "-f", "/tmp/e2e-stop")
        self.node.agent(["python3", f"{ROOT}/integration/node/workload/echo.py", "loop",
                         "/tmp/e2e-stop", *urls], background="clients")
        self.pod_clients = subprocess.Popen(
            [str(self.cluster.cp.bin / "kubectl"), f"--kubeconfig={self.cluster.admin_kubeconfig}",
             "exec", "client", "--", "python3", "/echo.py", "loop", "/tmp/e2e-stop", *urls],
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        return urls

    def stop_clients(self) -> dict[str, Any]:
        self.node.sh("touch /tmp/e2e-stop")
        self.kubectl("exec", "client", "--", "touch", "/tmp/e2e-stop")
        node = self.node.collect("clients", 60)
        out, err = self.pod_clients.communicate(timeout=60)
        return {"node": json.loads(node["out"]), "pod": json.loads(out or "{}") or err}

    def step_rolling(self) -> str:
        before = self.proxy_pod()
        urls = self.start_clients()
        time.sleep(5)
        t = time.monotonic()
        self.operator(f'sed -i "s|newTag: \\"0.1.0\\"|newTag: \\"{NEXT_TAG}\\"|" '
                      "deploy/kustomization.yaml")
        self.operator("kubectl apply -k deploy/")
        self.operator("kubectl -n kube-system rollout status daemonset ipvsproxy "
                      "--timeout=900s", timeout=960)
        rolled = time.monotonic() - t
        self.expect_real_servers(f"{self.cluster_ip('echo')}:80", len(self.echo_pods()))
        time.sleep(5)
        counts = self.stop_clients()
        after = self.proxy_pod()
        image = after["spec"]["containers"][0]["image"]
        check(image == f"{REGISTRY}/ipvsproxy:{NEXT_TAG}", f"the pod runs {image}")
        check(after["metadata"]["uid"] != before["metadata"]["uid"], "the pod was not replaced")
        total = check_clients(counts, urls)
        return (f"kustomization's newTag -> {NEXT_TAG}, `kubectl apply -k`, rollout in "
                f"{rolled:.0f} s: the pod replaced by one of the new image while the node and "
                f"a pod opened {total} connections to the ClusterIP and the NodePort, 0 failed")

    def step_reboot(self) -> str:
        before = self.proxy_pod()
        started_before = before["status"]["containerStatuses"][0]["state"]["running"]["startedAt"]
        t = time.monotonic()
        self.node.shutdown()
        self.boot()
        at_boot = (self.node.boot_dir / "kernel-at-boot.txt").read_text()
        print("   the kernel at boot: " + at_boot.replace("\n", "; "), flush=True)
        check(all(line.endswith(": 0") for line in at_boot.splitlines()),
              f"the rebooted node's kernel held proxy state: {at_boot}")

        def restarted() -> bool:
            pod = self.proxy_pod()
            st = pod["status"]["containerStatuses"][0]
            running = st["state"].get("running")
            return bool(st["ready"] and running and running["startedAt"] != started_before)

        wait_for("the proxy pod to run again and be Ready", restarted, 900, 5)
        cip, np = self.cluster_ip("echo"), self.node_port("echo-nodeport")
        wait_for("the echo pods to be Ready", lambda: len(self.echo_pods()) == 3, 900, 5)
        self.expect_real_servers(f"{cip}:80", 3)
        self.answers(self.from_node, "get", f"http://{cip}/")
        self.answers(self.from_node, "get", f"http://{c.NODE_IP}:{np}/")
        wait_for("the client pod", lambda: self.kubectl(
            "get", "pod", "client", "-o",
            "jsonpath={.status.conditions[?(@.type=='Ready')].status}") == "True", 600, 5)
        self.answers(self.from_pod, "get", f"http://{cip}/")
        env = self.kubectl("-n", "kube-system", "exec", "daemonset/ipvsproxy", "--", "env")
        check(f"KUBERNETES_SERVICE_HOST={c.HOST_IP}" in env.split(),
              "the proxy does not reach the API server through the ConfigMap's address")
        took = time.monotonic() - t
        return (f"the node rebooted (same disk; at boot: no ip_vs module, no kube-ipvs0, no "
                f"KUBE- chains): in {took:.0f} s the kubelet re-ran the proxy, which reached "
                f"the API server at {c.HOST_IP} (the ConfigMap's address, not the kubernetes "
                "Service it had yet to program) and programmed the node: the ClusterIP and the "
                "NodePort answer from the node and from a pod")

    # ------------------------------------------------------- kube-proxy swapped for ipvsproxy

    def step_kube_proxy(self) -> str:
        """kube-proxy v1.35.4 in IPVS mode, deployed as kubeadm deploys it: the node's
        service proxy before the swap."""
        text = (HERE / "manifests" / "kube-proxy.yaml").read_text().replace(
            "__APISERVER__", self.cluster.cp.url)
        self.kubectl("apply", "-f", "-", stdin=text)
        self.kubectl("-n", "kube-system", "rollout", "status", "daemonset/kube-proxy",
                     "--timeout=900s", timeout=960)
        wait_for("kube-proxy to program the kubernetes Service", lambda: "10.96.0.1:443" in
                 self.node.sh("ipvsadm -Ln"), 300, 3)
        return "kube-proxy's DaemonSet (IPVS mode) running and programming the node"

    def step_swap(self) -> str:
        """deploy/README.md's "Replace kube-proxy", every command of it, under traffic: the
        DaemonSet swap, ipvsproxy taking kube-proxy's state over in place (issue 36)."""
        shutil.copytree(ROOT / "deploy", self.deploy_dir, dirs_exist_ok=True)
        self.operator(readme_command("sed -i \"s|newName: ipvsproxy$|"))
        configmap = readme_command("kubectl -n kube-system create configmap ipvsproxy-apiserver")
        self.operator(configmap.replace("=10.0.0.10", f"={c.HOST_IP}").replace(
            "=6443", f"={self.cluster.cp.port}"))
        cip, np = self.cluster_ip("echo"), self.node_port("echo-nodeport")
        self.node.sh("rm -f /tmp/e2e-stop")
        self.node.agent(["bash", "-c", SAMPLER, "sampler", f"{cip}:80", f"{c.NODE_IP}:{np}"],
                        background="sampler")
        # kube-proxy serves both before the swap, so what fails below failed in the swap: under
        # emulation its syncs are slow, and it may not have programmed the workload's endpoints
        # when the workload step ends (the first run of this step counted those failures)
        waited = sum(wait_for(f"kube-proxy to serve {url}", functools.partial(
            self.answers, ask, "get", url, n=2), 180, 3) for ask in (self.from_pod,
            self.from_node) for url in (f"http://{cip}/", f"http://{c.NODE_IP}:{np}/"))
        print(f"   kube-proxy serves the ClusterIP and the NodePort from the node and a pod "
              f"(checked in {waited:.0f} s)", flush=True)
        urls = self.start_clients()
        time.sleep(5)
        t = time.monotonic()
        self.operator(readme_block("## Replace kube-proxy"), timeout=1800)
        self.expect_real_servers(f"{cip}:80", len(self.echo_pods()))
        took = time.monotonic() - t
        counts = self.stop_clients()
        print("   the node's kernel during the swap (a line when it changed):", flush=True)
        for line in changes(self.node.collect("sampler", 60)["out"]):
            print(f"   | {line}", flush=True)
        total = check_clients(counts, urls)
        wait_for("kube-proxy's pod to be gone", lambda: not self.get(
            "-n", "kube-system", "pods", "-l", "k8s-app=kube-proxy")["items"], 300, 3)
        self.check_deployed()
        return (f"kube-proxy swapped for ipvsproxy as deploy/README.md says, in {took:.0f} s, "
                f"while the node and a pod opened {total} connections to the ClusterIP and "
                "the NodePort: 0 failed")

    def proxy_pod(self) -> dict[str, Any]:
        pods = self.get("-n", "kube-system", "pods", "-l", "app.kubernetes.io/name=ipvsproxy")
        items = pods["items"]
        check(len(items) == 1, f"{len(items)} ipvsproxy pods")
        return items[0]  # type: ignore[no-any-return]

    def boot(self) -> None:
        self.node.boot([n for n, _ in self.images.values()])
        took = self.node.wait_agent()
        print(f"   node agent up after {took:.0f} s", flush=True)
        wait_for("the node to be Ready", lambda: self.kubectl(
            "get", "node", c.NODE_NAME, "-o",
            "jsonpath={.status.conditions[?(@.type=='Ready')].status}") == "True", 600, 5)

    def cluster_state(self) -> str:
        """What an operator looks at first: pods, events, the proxy's log."""
        out = []
        for args in (("get", "nodes,pods", "-A", "-o", "wide"),
                     ("get", "events", "-A", "--sort-by=.lastTimestamp"),
                     ("-n", "kube-system", "logs", "daemonset/ipvsproxy", "--tail=60"),
                     ("-n", "kube-system", "logs", "daemonset/ipvsproxy", "--previous",
                      "--tail=30")):
            with contextlib.suppress(Exception):
                p = self.cluster.kubectl(*args, check=False, timeout=60)
                out.append(f"---- kubectl {' '.join(args)}\n{p.stdout[-6000:]}{p.stderr[-500:]}")
        return "\n".join(out)

    def close(self) -> None:
        with contextlib.suppress(Exception):
            self.node.shutdown(120)
        self.node.kill()
        self.cluster.close()


# On the node while the proxies are swapped, every 0.5 s until /tmp/e2e-stop: which proxy runs
# (ipvsproxy-init: the pod's init container writing the sysctls),
# how many virtual servers and kube-ipvs0 addresses, and the real servers (weight) behind the
# ClusterIP ($1) and the NodePort ($2); what a failed connection is read against.
SAMPLER = r"""
while [ ! -e /tmp/e2e-stop ]; do
  procs=$( (pgrep -x kube-proxy >/dev/null && echo -n kube-proxy,)
           (pgrep -f '[i]pvsproxy run --sysctls-only' >/dev/null && echo -n ipvsproxy-init,)
           (pgrep -f '[i]pvsproxy run --config' >/dev/null && echo -n ipvsproxy) )
  vs=$(ipvsadm -Ln 2>/dev/null | grep -cE '^(TCP|UDP|SCTP) ')
  addrs=$(ip -o addr show dev kube-ipvs0 2>/dev/null | wc -l)
  rs() { ipvsadm -Ln -t "$1" 2>&1 | awk '$1=="->" && $2!="RemoteAddress:Port" {
           printf "%s/%s ", $2, $4 } /No such/ { printf "none" }'; }
  echo "$(date +%T.%N | cut -c1-12) proxy=[$procs] vs=$vs kube-ipvs0=$addrs" \
       "clusterip=[$(rs "$1")] nodeport=[$(rs "$2")]"
  sleep 0.5
done
"""


def changes(samples: str) -> list[str]:
    """The sampler's lines where what it saw changed (the time aside), and its last line."""
    out, last, line = [], None, ""
    for line in samples.splitlines():
        seen = line.split(" ", 1)[-1]
        if seen != last:
            out.append(line)
            last = seen
    if line and (not out or out[-1] != line):
        out.append(line)
    return out


def check_clients(counts: dict[str, Any], urls: list[str]) -> int:
    """Print what the clients on the node and in the pod saw (answered, the slowest, failed,
    the first failures and the last); fail if one failed. The connections answered."""
    for side in ("node", "pod"):
        check(isinstance(counts[side], dict), f"the {side}'s clients: {counts[side]}")
    for side in ("node", "pod"):
        for url in urls:
            got = counts[side][url]
            print(f"   {side} -> {url}: {got['ok']} answered (slowest {got['slowest']} s), "
                  f"{got['failed']} failed {got['errors']}"
                  + (f", the last {got['last_error']}" if got.get("last_error") else ""),
                  flush=True)
    for side in ("node", "pod"):
        for url in urls:
            got = counts[side][url]
            check(got["failed"] == 0 and got["ok"] > 0,
                  f"{side} -> {url}: {got['failed']} connections failed: {got['errors']}")
    return sum(int(counts[s][u]["ok"]) for s in ("node", "pod") for u in urls)


def real_servers(listing: str) -> list[str]:
    """ADDRESS:PORT of the real servers taking connections (weight > 0) in an ipvsadm -Ln
    listing."""
    out = []
    for line in listing.splitlines():
        f = line.split()
        if len(f) >= 4 and f[0] == "->" and f[1] != "RemoteAddress:Port" and int(f[3]) > 0:
            out.append(f[1])
    return sorted(out)


def readme_command(start: str) -> str:
    """The command of deploy/README.md that starts with `start` (after its indentation),
    with its continuation lines."""
    lines = (ROOT / "deploy" / "README.md").read_text().splitlines()
    for i, line in enumerate(lines):
        if line.strip().startswith(start):
            out = [line.strip()]
            while out[-1].endswith("\\"):
                i += 1
                out.append(lines[i].strip())
            return "\n".join(out)
    raise Failed(f"deploy/README.md has no command starting {start!r}")


def readme_block(heading: str) -> str:
    """The code of deploy/README.md's section `heading` (its indented lines), as one script."""
    text = (ROOT / "deploy" / "README.md").read_text()
    section = text[text.index(heading) + len(heading):]
    section = section[:section.index("\n## ")] if "\n## " in section else section
    return "\n".join(line[4:] for line in section.splitlines() if line.startswith("    "))


def build_images(kube_proxy: bool) -> dict[str, tuple[str, Path]]:
    from integration.node import images

    out = {}
    for key, img in (("pause", images.pause()), ("ipvsproxy", images.ipvsproxy()),
                     ("ipvsproxy-next", images.ipvsproxy(NEXT_TAG, revision="next")),
                     ("echo", images.workload())):
        out[key] = (img.name, img.archive)
    if kube_proxy:
        img = images.kube_proxy()
        out["kube-proxy"] = (img.name, img.archive)
    return out


def inside(args: argparse.Namespace) -> int:
    """In the e2e namespace: the cluster, the node and the steps."""
    images = {k: (n, Path(p)) for k, (n, p) in json.loads(args.images).items()}
    work = Path(args.work)
    e2e = E2E(work, images)
    default = FRESH_STEPS if args.no_kube_proxy else STEPS
    steps = [s for s in (args.steps.split(",") if args.steps else default) if s != "images"]
    t_all = time.monotonic()
    failed = None
    try:
        for name in steps:
            t = time.monotonic()
            print(f"== {name}", flush=True)
            proof = getattr(e2e, f"step_{name.replace('-', '_')}")()
            took = time.monotonic() - t
            e2e.proofs.append((name, took, proof))
            print(f"   ok in {took:.0f} s: {proof}", flush=True)
    except (Failed, c.ClusterError, RuntimeError, subprocess.TimeoutExpired) as exc:
        failed = f"{name}: {exc}"
        print(f"FAILED {failed}\n{e2e.node.guest_log()}\n{e2e.cluster_state()}", flush=True)
    finally:
        if args.keep:
            print(f"kept: KUBECONFIG={e2e.cluster.admin_kubeconfig}; Ctrl-C ends it", flush=True)
            with contextlib.suppress(KeyboardInterrupt):
                while True:
                    time.sleep(3600)
        e2e.close()
    print(f"e2e: {len(e2e.proofs)} step(s) passed in {time.monotonic() - t_all:.0f} s"
          + (f"; FAILED {failed}" if failed else ""), flush=True)
    return 1 if failed else 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", default="", help=f"comma list of {', '.join(STEPS)} "
                        "(or deploy, on a cluster without kube-proxy)")
    parser.add_argument("--keep", action="store_true", help="keep the cluster at the end")
    parser.add_argument("--no-kube-proxy", action="store_true",
                        help="a cluster that never had kube-proxy: deploy, not its swap")
    parser.add_argument("--inside", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--images", help=argparse.SUPPRESS)
    parser.add_argument("--work", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.inside:
        return inside(args)
    if os.geteuid() != 0:
        print("e2e: needs root (network namespace, tap device, lab guest)", file=sys.stderr)
        return 1
    t = time.monotonic()
    print("== images", flush=True)
    fresh = args.no_kube_proxy or (args.steps and "kube-proxy" not in args.steps.split(","))
    images = build_images(kube_proxy=not fresh)
    print(f"   ok in {time.monotonic() - t:.0f} s: " + ", ".join(n for n, _ in images.values()),
          flush=True)
    work = c.temporary_work()
    try:
        with c.network_namespace() as ns:
            argv2 = [sys.executable, "-m", "integration.node.e2e", "--inside", "--work",
                     str(work), "--images", json.dumps({k: [n, str(p)] for k, (n, p)
                                                        in images.items()})]
            argv2 += [a for a in (argv if argv is not None else sys.argv[1:])]
            return subprocess.run(["ip", "netns", "exec", ns, *argv2], cwd=ROOT,
                                  check=False).returncode
    finally:
        if not args.keep:
            shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
