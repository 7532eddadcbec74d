"""A live node moved from kube-proxy's IPVS mode to ipvsproxy with nothing dropped (issue 36), in
the lab, with the real kube-apiserver and kube-proxy v1.35.4: tests/takeover/moves.py at a size
make test affords (20 Services of every kind, TCP and UDP, network-namespace pods and clients).

kube-proxy programs the node and serves every client; the clients' traffic starts (new TCP
connections at a fixed rate, long-lived connections that send and read back every 100 ms, UDP
request and reply); kube-proxy is stopped (SIGTERM: it leaves its state), a Service gains an
endpoint and another loses one, one is deleted and one created through the API server while no
proxy runs, then ipvsproxy starts with --adopt-kube-proxy (as deploy/daemonset.yaml runs it). No
connection may fail and the changes must be followed. `make takeover` runs every move (back to
kube-proxy, from iptables and nftables mode, and the old cleanup procedure as the baseline) at
200 Services, and compares each node afterwards with a clean node the new proxy programmed (left
out here: two more minutes of make test's budget).
"""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.takeover import moves

pytestmark = [pytest.mark.kernel, pytest.mark.lab_cost(740)]  # seconds, balances lab guests


@pytest.fixture(scope="module")
def moved(tmp_path_factory: pytest.TempPathFactory) -> moves.Result:
    work: Path = tmp_path_factory.mktemp("takeover")
    [result] = moves.run_moves(["ipvs"], size=20, rate=10.0, before=5.0, after=5.0, work=work,
                               compare=False)
    print(moves.table([result]))
    return result


def test_no_connection_is_dropped_moving_from_kube_proxy(moved: moves.Result) -> None:
    assert not moved.error, moved.error
    f = moved.figures()
    assert f["new ok"] > 0 and f["long ok"] > 0 and f["udp ok"] > 0, f  # traffic flowed
    # each failure's time, target and error, per client (the whole counts are cut short)
    failures = {name: {k: v for k, v in c["failed"].items() if v}
                for name, c in moved.counts.items() if any(c["failed"].values())}
    assert (f["new failed"], f["long broken"], f["udp lost"]) == (0, 0, 0), failures


def test_ipvsproxy_took_kube_proxys_state_over_and_followed_the_changes(
        moved: moves.Result) -> None:
    assert not moved.error, moved.error
    assert moved.followed > 0
    assert any("taking over from kube-proxy" in line for line in moved.log), moved.log
