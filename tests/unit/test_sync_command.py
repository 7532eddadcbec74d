"""`ipvsproxy sync --once` around syncer.sync (the kernel stubbed: the command's own work)."""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

import pytest
from structlog.testing import capture_logs

from ipvsproxy import names, syncer
from ipvsproxy.commands import sync as command
from ipvsproxy.core.desired import HostFacts
from ipvsproxy.core.plan import Observed, Plan, diff, step_counts


def test_the_log_line_counts_operations_without_rendering_them(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # rendering every operation as an ipvsadm line only to count them took 6% of a cold sync
    from bench.cluster_gen import NODE, generate

    manifest = tmp_path / "cluster.json"
    manifest.write_text(json.dumps({"kind": "List", "items": generate(50, 3)}))
    plans: list[Plan] = []

    def sync(docs: list[Any], cfg: Any, dry_run: bool = False) -> syncer.Outcome:
        des = syncer.desired_from(docs, cfg, HostFacts())
        plan = diff(des, Observed())
        plans.append(plan)
        return syncer.Outcome(des, plan)

    def refuse(self: Plan) -> list[str]:
        raise AssertionError("the plan was rendered")

    monkeypatch.setattr(syncer, "sync", sync)
    monkeypatch.setattr(names, "write", lambda owners: None)
    monkeypatch.setattr(Plan, "lines", refuse)
    ap = argparse.ArgumentParser()
    command.add_arguments(ap)
    args = ap.parse_args(["--once", "--from-file", str(manifest), "--hostname-override", NODE])
    with capture_logs() as logs:
        assert command.run(args) == 0
    line = next(x for x in logs if x["event"] == "sync")
    assert line["operations"] == sum(step_counts(plans[0].steps).values()) > 50
