"""`ipvsproxy run` in the lab against the real API server, with deploy/'s RBAC and a token of its
ServiceAccount: what is created, changed and deleted through the API server is programmed into
the kernel, and real TCP goes through it.

The control plane (etcd and kube-apiserver of integration/upstream/go.mod's release) runs on the
host, started by the lab bridge before the guest boots (integration/vm/pytest_lab.py); the guest
reaches it over qemu's user network, where 10.0.2.2 is the host's loopback: this module brings
the guest's NIC up with a route to that one address and nothing else, and down again at the end.
The API server advertises 10.0.2.2, so its `kubernetes` Service is programmed like any other and
the node reaches the API server through it.

One daemon for the module; the tests are steps of one story, in order: the cluster is programmed
and traffic flows; objects are created, changed and deleted through the API server; the API
server crashes (the dataplane stays, the periodic syncs go on, /healthz stays 200) and comes back
(the change made after is programmed); it stops cleanly, and the one thing that changes is what
it changes itself: it takes its address out of the `kubernetes` Service's endpoints as it shuts
down, and puts it back when it starts; the daemon, held while its history is made obsolete (the
API server restarted, etcd compacted past what it saw), gets 410 Gone and lists again, catching
up with a deletion no event told it of; and the server's audit log shows it was never refused
and asked for nothing but lists and watches of what its ClusterRole grants.
"""

from __future__ import annotations

import json
import os
import signal
import ssl
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest

from integration.upstream.remote import Remote, unready
from tests.kernel import forked
from tests.kernel.conftest import sh
from tests.kernel.test_daemon import (
    HEALTHZ,
    Daemon,
    get,
    ipvs_dests,
    kernel_state,
    metrics,
    start_daemon,
    syncs,
    wait_for,
)
from tests.kernel.test_traffic import PODS_SH, service, slice_, who
from tests.realapi.conftest import SA_NAME, SA_NAMESPACE, SA_USER, proxy_role
from tests.realapi.proxycalls import can, role_rules

pytestmark = [pytest.mark.kernel, pytest.mark.controlplane, pytest.mark.lab_cost(140)]
SYNC_PERIOD = 6.0
HOST = "10.0.2.2"  # the host's 127.0.0.1, from the guest on qemu's user network
GUEST = "10.0.2.15"
HTTP80 = [{"name": "http", "port": 80, "targetPort": 8080, "protocol": "TCP"}]
HTTP = [{"name": "http", "port": 8080, "protocol": "TCP"}]
NODE_OBJ = {"kind": "Node", "metadata": {"name": "node-a"},
            "status": {"addresses": [{"type": "InternalIP", "address": "192.168.1.10"}]}}


@pytest.fixture(scope="module")
def remote() -> Remote:
    path = os.environ.get("IPVSPROXY_CONTROLPLANE")
    if not path:
        pytest.fail("no control plane: these tests run in the lab through the bridge "
                    "(pytest on the host), which starts etcd and kube-apiserver on the host")
    return Remote.from_file(path)


def _nic() -> str:
    """The guest's virtio NIC (the lab boots with one on qemu's user network)."""
    sh("modprobe virtio_net")
    net = Path("/sys/class/net")

    def found() -> str | None:
        for dev in sorted(net.iterdir()):
            driver = dev / "device" / "driver"
            if driver.exists() and driver.resolve().name == "virtio_net":
                return dev.name
        return None

    return str(wait_for("the virtio NIC", found, 30))


@pytest.fixture(scope="module")
def network(remote: Remote) -> Iterator[None]:
    """The NIC up with 10.0.2.15/32 and one route, to the host; no IPv6 (slirp would offer a
    router), no default route: the guest can reach the host's loopback and nothing else."""
    dev = _nic()
    sh(f"sysctl -qw net.ipv6.conf.{dev}.disable_ipv6=1")
    sh(f"ip link set {dev} up && ip addr add {GUEST}/32 dev {dev} && "
       f"ip route add {HOST}/32 dev {dev}")
    try:
        wait_for("the API server through the user network",
                 lambda: _ready(remote), 60)
        yield
    finally:
        sh(f"ip addr flush dev {dev}; ip link set {dev} down", check=False)


def _ready(remote: Remote) -> bool:
    try:
        return bool(remote.request("GET", "/readyz", raw=True, timeout=5) == "ok")
    except Exception:
        return False


@pytest.fixture(scope="module")
def cluster(ipvs_modules: None, network: None, remote: Remote,
            tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Remote, Path, Path]]:
    tmp = tmp_path_factory.mktemp("realapi")
    forked.run(["cleanup"])
    sh("ipvsadm -C")
    sh(f"{PODS_SH} up pod1 pod2 pod3")
    remote.apply_rbac()
    token = remote.token(SA_NAMESPACE, SA_NAME)
    rules = role_rules(proxy_role())
    wait_for("the ClusterRoleBinding to reach the authorizer",
             lambda: all(can(remote, SA_USER, r) for r in rules))
    objs = [NODE_OBJ, service("web", "10.96.0.10", HTTP80), slice_("web-1", "web", ["pod1"], HTTP)]
    remote.apply(objs)
    kubeconfig = remote.kubeconfig(tmp / "kubeconfig", token)
    yield remote, kubeconfig, tmp
    if not remote.running():  # a step failed with it stopped
        remote.start()
    for name in ("web", "web2", "web3", "late"):
        remote.delete({"kind": "Service", "metadata": {"name": name, "namespace": "default"}})
    for name in ("web-1", "web2-1", "web3-1", "late-1"):
        remote.delete({"kind": "EndpointSlice",
                       "metadata": {"name": name, "namespace": "default"}})
    remote.delete(NODE_OBJ)
    forked.run(["cleanup"])
    sh(f"{PODS_SH} down")


@pytest.fixture(scope="module")
def daemon(cluster: tuple[Remote, Path, Path]) -> Iterator[Daemon]:
    _, kubeconfig, tmp = cluster
    d = start_daemon(tmp, kubeconfig, "realapi", sync_period=SYNC_PERIOD)
    yield d
    if d.proc.poll() is None:
        d.proc.send_signal(signal.SIGCONT)
        d.proc.terminate()
        d.proc.wait(60)


def test_it_programs_what_the_api_server_holds(cluster: tuple[Remote, Path, Path],
                                               daemon: Daemon) -> None:
    remote = cluster[0]
    assert ipvs_dests("10.96.0.10:80") == {"10.244.1.11:8080": (1, 0)}
    assert who("http://10.96.0.10", ns="pod2")[0] == "pod1"
    # the API server's own Service: its endpoint is the address it advertises, the host as
    # the guest sees it, and the node reaches the API server through the ClusterIP
    port = int(remote.url.rpartition(":")[2])
    assert set(ipvs_dests("10.96.0.1:443")) == {f"{HOST}:{port}"}
    ctx = ssl.create_default_context(cadata=remote.ca_pem)  # its certificate names 10.96.0.1
    with urllib.request.urlopen("https://10.96.0.1/readyz", context=ctx, timeout=30) as r:
        assert r.read() == b"ok"


def test_created_changed_and_deleted_through_the_api_server(
        cluster: tuple[Remote, Path, Path], daemon: Daemon) -> None:
    remote = cluster[0]
    remote.apply([service("web2", "10.96.0.20", HTTP80),
                  slice_("web2-1", "web2", ["pod2"], HTTP)])
    wait_for("web2's real server", lambda: "10.244.1.12:8080" in ipvs_dests("10.96.0.20:80"),
             log=daemon)
    assert who("http://10.96.0.20", ns="client")[0] == "pod2"
    remote.apply(slice_("web-1", "web", ["pod1", "pod2", "pod3"], HTTP))
    wait_for("web scaled to three", lambda: len(ipvs_dests("10.96.0.10:80")) == 3, log=daemon)
    remote.apply(service("web2", "10.96.0.20", [{**HTTP80[0], "port": 81}]))
    wait_for("web2 moved to port 81", lambda: ipvs_dests("10.96.0.20:81")
             and not ipvs_dests("10.96.0.20:80"), log=daemon)
    remote.delete({"kind": "Service", "metadata": {"name": "web2", "namespace": "default"}})
    remote.delete({"kind": "EndpointSlice", "metadata": {"name": "web2-1",
                                                          "namespace": "default"}})
    wait_for("web2 gone", lambda: "10.96.0.20:81" not in sh("ipvsadm -Ln"), log=daemon)


def test_the_api_server_crashes_and_comes_back(cluster: tuple[Remote, Path, Path],
                                              daemon: Daemon) -> None:
    remote = cluster[0]
    before = kernel_state()
    full = syncs(metrics(), "full")
    remote.stop(kill=True)  # SIGKILL: its connections reset, nothing withdrawn
    try:
        # two periodic full syncs without an API server: against what the daemon last knew
        wait_for("two full syncs without the API server",
                 lambda: syncs(metrics(), "full") >= full + 2, 6 * SYNC_PERIOD, daemon)
        assert kernel_state() == before
        code, body = get(f"http://{HEALTHZ}/healthz")
        assert code == 200 and json.loads(body)["healthy"] is True, body
        assert who("http://10.96.0.10", ns="client")[0] in ("pod1", "pod2", "pod3")
    finally:
        remote.start()
    remote.apply([service("late", "10.96.0.30", HTTP80),
                  slice_("late-1", "late", ["pod3"], HTTP)])
    # the reflectors' backoff is capped at 30 s: within that and a sync the change is in
    wait_for("the change made after it came back",
             lambda: "10.244.1.13:8080" in ipvs_dests("10.96.0.30:80"), 120, daemon)
    assert who("http://10.96.0.30", ns="client")[0] == "pod3"


def test_a_stopping_api_server_withdraws_its_endpoint_and_the_rest_stays(
        cluster: tuple[Remote, Path, Path], daemon: Daemon) -> None:
    remote = cluster[0]
    itself = f"{HOST}:{int(remote.url.rpartition(':')[2])}"

    def rest() -> list[str]:
        return [line for line in kernel_state().splitlines() if itself not in line]

    assert itself in ipvs_dests("10.96.0.1:443")
    before = rest()
    full = syncs(metrics(), "full")
    remote.stop()  # SIGTERM: as it shuts down it takes itself out of `kubernetes`' endpoints
    try:
        wait_for("the API server's endpoint withdrawn", lambda: not ipvs_dests("10.96.0.1:443"),
                 60, daemon)
        wait_for("two full syncs without the API server",
                 lambda: syncs(metrics(), "full") >= full + 2, 6 * SYNC_PERIOD, daemon)
        assert rest() == before
        assert get(f"http://{HEALTHZ}/healthz")[0] == 200
    finally:
        remote.start()
    wait_for("the API server's endpoint back",
             lambda: itself in ipvs_dests("10.96.0.1:443"), 120, daemon)


def test_history_gone_the_daemon_gets_410_and_lists_again(
        cluster: tuple[Remote, Path, Path], daemon: Daemon) -> None:
    remote = cluster[0]
    seen = int(remote.resource_version())
    daemon.proc.send_signal(signal.SIGSTOP)  # held: it sees nothing of what follows
    try:
        remote.apply([service("web3", "10.96.0.40", HTTP80),
                      slice_("web3-1", "web3", ["pod2"], HTTP)])
        remote.delete({"kind": "Service", "metadata": {"name": "late", "namespace": "default"}})
        remote.delete({"kind": "EndpointSlice", "metadata": {"name": "late-1",
                                                              "namespace": "default"}})
        # The watch cache starts its history anew, and etcd forgets everything before now.
        # The stopping server's last write (itself out of the `kubernetes` EndpointSlice)
        # reaches the stopped daemon's socket; a new watch cache starting at that very
        # revision would serve a watch from it (watch_cache.go: too old only below the
        # cache's list revision), so etcd's revision moves on while no API server runs.
        remote.stop()
        remote.etcd_bump()
        remote.start()
        remote.compact()
        assert remote.compacted(seen)
    finally:
        daemon.proc.send_signal(signal.SIGCONT)
    wait_for("the relist", lambda: "10.244.1.12:8080" in ipvs_dests("10.96.0.40:80")
             and "10.96.0.30:80" not in sh("ipvsadm -Ln"), 120, daemon)
    relists = [json.loads(line) for line in daemon.text().splitlines()
               if "resource version expired" in line]
    kinds = {e.get("kind") for e in relists}
    assert {"Service", "EndpointSlice"} <= kinds, relists
    assert all("too old resource version" in e.get("error", "") for e in relists), relists
    assert who("http://10.96.0.40", ns="client")[0] == "pod2"


def test_the_daemon_was_never_refused_and_asked_only_what_its_role_grants(
        cluster: tuple[Remote, Path, Path], daemon: Daemon) -> None:
    remote = cluster[0]
    asked = remote.audit(SA_USER)
    assert asked
    # Right after each (re)start the API server answers before it is ready (/readyz), and
    # may refuse then what its RBAC grants: its authorizer's caches are still filling. The
    # daemon retries those; once the server was ready it was never refused.
    starts = remote.starts
    refused = [e for e in asked if e["code"] in (401, 403) and not unready(e, starts)]
    assert not refused, refused
    early = [e for e in asked if e["code"] in (401, 403) and unready(e, starts)]
    print(f"{len(asked)} requests by the daemon, none refused once the API server was ready "
          f"({len(early)} refused by it while it was starting, {len(starts)} starts)")
    used = {(e["apiGroup"] or "", e["resource"], e["verb"]) for e in asked}
    # everything the daemon asked: lists and watches of the four kinds; the role grants
    # those, and `get nodes` for `sync --once` (not run here)
    assert used == {(g, r, v) for g, r in (("", "services"), ("discovery.k8s.io", "endpointslices"),
                                           ("", "nodes"), ("networking.k8s.io", "servicecidrs"))
                    for v in ("list", "watch")}, used
    assert used <= role_rules(proxy_role())
    assert "Traceback" not in daemon.text()
