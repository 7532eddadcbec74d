"""The lab itself: a real kernel with IPVS, readable with ipvsadm and pyroute2."""

from __future__ import annotations

import os
import socket

import pytest
from pyroute2 import IPVS, IPRoute
from pyroute2.ipvs import IPVSService

from tests.kernel.conftest import sh

pytestmark = [pytest.mark.kernel, pytest.mark.lab_cost(5)]  # seconds, balances lab guests


def test_runs_in_a_kernel_other_than_the_hosts() -> None:
    assert os.environ["IPVSPROXY_IN_LAB"] == "1"
    assert os.uname().release != os.environ["HOST_KERNEL_RELEASE"]
    assert os.path.isdir("/proc/net/ip_vs") or sh("modprobe ip_vs") == ""


def test_ipvsadm_service_is_read_back_by_pyroute2(clean_ipvs: None) -> None:
    sh("ipvsadm -A -t 10.96.0.10:80 -s wrr -p 300")
    sh("ipvsadm -a -t 10.96.0.10:80 -r 10.244.1.5:8080 -m -w 7")
    with IPVS() as ipvs:
        services = list(ipvs.service("dump"))
        assert len(services) == 1
        svc = services[0].get_attr("IPVS_CMD_ATTR_SERVICE")
        assert svc.get_attr("IPVS_SVC_ATTR_AF") == socket.AF_INET
        assert svc.get_attr("IPVS_SVC_ATTR_PROTOCOL") == socket.IPPROTO_TCP
        assert svc.get_attr("IPVS_SVC_ATTR_ADDR") == "10.96.0.10"
        assert svc.get_attr("IPVS_SVC_ATTR_PORT") == 80
        assert svc.get_attr("IPVS_SVC_ATTR_SCHED_NAME") == "wrr"
        assert svc.get_attr("IPVS_SVC_ATTR_TIMEOUT") == 300
        assert svc.get_attr("IPVS_SVC_ATTR_FLAGS")["flags"] & 0x1  # IP_VS_SVC_F_PERSISTENT
        key = IPVSService(af=socket.AF_INET, protocol=socket.IPPROTO_TCP,
                          addr="10.96.0.10", port=80)
        dests = [m.get_attr("IPVS_CMD_ATTR_DEST") for m in ipvs.dest("dump", service=key)]
        assert len(dests) == 1
        d = dests[0]
        assert d.get_attr("IPVS_DEST_ATTR_ADDR") == "10.244.1.5"
        assert d.get_attr("IPVS_DEST_ATTR_PORT") == 8080
        assert d.get_attr("IPVS_DEST_ATTR_WEIGHT") == 7
        assert d.get_attr("IPVS_DEST_ATTR_FWD_METHOD") == 0  # masquerade
    assert "10.96.0.10:80" in sh("ipvsadm -Ln")


def test_dummy_link_with_address_via_pyroute2() -> None:
    with IPRoute() as ipr:
        ipr.link("add", ifname="kube-ipvs0", kind="dummy")
        try:
            (idx,) = ipr.link_lookup(ifname="kube-ipvs0")
            ipr.addr("add", index=idx, address="10.96.0.1", prefixlen=32)
            assert "10.96.0.1/32" in sh("ip -4 addr show dev kube-ipvs0")
            addrs = [a.get("IFA_ADDRESS") for a in ipr.get_addr(index=idx, family=socket.AF_INET)]
            assert addrs == ["10.96.0.1"]
        finally:
            ipr.link("del", ifname="kube-ipvs0")
    assert sh("ip link show kube-ipvs0", check=False) == ""


def test_schedulers_and_tools_available(ipvs_modules: None) -> None:
    for tool in ("ipvsadm --version", "ipset --version", "iptables --version"):
        sh(tool)
    sh("ip netns add labcheck && ip netns del labcheck")


def test_files_glibc_rereads_are_node_like_copies() -> None:
    """The guest set-up binds tmpfs copies over the files glibc reads per lookup (lab.py
    NODE_LIKE_ETC), so tools like `ipset restore` do not pay a 9p round trip per entry."""
    for name in ("protocols", "services", "nsswitch.conf"):
        path = f"/etc/{name}"
        assert sh(f"findmnt -n -o FSTYPE --target {path}").strip() == "tmpfs", path
        with open(path, "rb") as f:
            assert f.read(), path  # the copy has the host's content
