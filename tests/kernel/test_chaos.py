"""The chaos run of issue 9 at a size `make test` can afford (`make chaos` runs 500 services
and 2,000 changes): random changes with every kind of fault in between, then the kernel holds
exactly the desired state within two sync periods, foreign objects are intact, and no daemon
log holds a traceback."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.kernel import chaos

pytestmark = [pytest.mark.kernel, pytest.mark.lab_cost(130)]  # seconds, balances lab guests


def test_chaos_converges_and_spares_foreign_objects(ipvs_modules: None, tmp_path: Path) -> None:
    # 50 faults: each of the 11 kinds 4 or 5 times
    r = chaos.run(tmp_path, services=40, changes=200, fault_every=4, sync_period=10.0, seed=7)
    print(json.dumps(r.summary(), indent=1))
    assert set(r.faults) == set(chaos.FAULTS), r.faults
    assert r.converge_seconds is not None, ("still to do:\n" + "\n".join(r.left[:20]) + "\n"
                                           + chaos.log_tails(r))
    assert r.foreign_changed == [] and r.faults["foreign_add"] > 0
    assert r.tracebacks == 0, r.daemon_logs
    # a last round of tampering, the cluster quiet: repaired within two sync periods, counted
    assert r.repair_seconds is not None, ("still to do:\n" + "\n".join(r.left[:20]) + "\n"
                                         + chaos.log_tails(r))
    assert r.repairs > 0
