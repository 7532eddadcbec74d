"""ipvsproxy.lean: pyroute2 and kubernetes load without their whole top-level packages, and
still give the whole package, with the same objects, to code that asks for more. Each case
runs in a fresh interpreter (the test process has both packages imported already)."""

from __future__ import annotations

import subprocess
import sys
import textwrap


def _run(code: str) -> None:
    proc = subprocess.run([sys.executable, "-c", textwrap.dedent(code)], capture_output=True,
                          text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-3000:]


def test_the_daemon_loads_neither_package_whole_nor_the_generated_api_classes() -> None:
    _run("""
        import sys
        import ipvsproxy.commands.run, ipvsproxy.commands.sync, ipvsproxy.daemon.reconciler
        import ipvsproxy.kernel.dataplane, ipvsproxy.kernel.conntrack, ipvsproxy.kernel.host
        import ipvsproxy.kube.reflector
        from ipvsproxy.kube import rest
        from kubernetes import client, config
        from kubernetes.client.exceptions import ApiException
        rest.Get(client.ApiClient(client.Configuration(host="http://127.0.0.1:9")), rest.NODES)
        from pyroute2 import IPRoute, IPSet
        import pyroute2.iproute, pyroute2.ipset
        assert IPRoute is pyroute2.iproute.IPRoute and IPSet is pyroute2.ipset.IPSet
        for name in ("pyroute2.ndb", "pyroute2.ipdb", "pyroute2.iwutil", "kubernetes.dynamic",
                     "kubernetes.watch", "kubernetes.client.api.core_v1_api",
                     "kubernetes.client.api.discovery_v1_api", "jsonschema", "sqlite3"):
            assert name not in sys.modules, name
    """)


def test_any_other_name_runs_the_real_init_and_keeps_the_objects_given_out() -> None:
    _run("""
        import sys
        import ipvsproxy
        from pyroute2 import IPRoute
        assert "pyroute2.ndb.main" not in sys.modules
        from pyroute2 import IPVS, NDB   # not in the lean table: the real __init__ runs
        import pyroute2
        assert "pyroute2.ndb.main" in sys.modules and pyroute2.IPRoute is IPRoute
        assert "__getattr__" not in vars(pyroute2)
        try:
            pyroute2.NoSuchName
        except AttributeError:
            pass
        else:
            raise AssertionError("a missing name must stay missing")
        import kubernetes
        assert "kubernetes.dynamic" not in sys.modules
        assert kubernetes.__version__  # a dunder the real __init__ sets
        assert "kubernetes.dynamic" in sys.modules
    """)


def test_a_package_imported_before_ipvsproxy_stays_whole() -> None:
    _run("""
        import sys
        import pyroute2
        import ipvsproxy
        assert "pyroute2.ndb.main" in sys.modules and "__getattr__" not in vars(pyroute2)
    """)
