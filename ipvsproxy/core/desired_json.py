"""The desired state as plain JSON-able data (`ipvsproxy sync -o json`). Pure."""

from __future__ import annotations

from typing import Any

from ipvsproxy.core.desired import Desired
from ipvsproxy.core.ipvsadm_format import sched_flags


def to_data(des: Desired) -> dict[str, Any]:
    services = []
    for key in sorted(des.services):
        vs = des.services[key]
        services.append({
            "virtual_server": str(key),
            "owner": des.owners.get(key, ""),
            "scheduler": vs.scheduler,
            "flags": sched_flags(vs.scheduler, vs.flags).split(",") if sched_flags(
                vs.scheduler, vs.flags) else [],
            "persistent": vs.timeout if vs.flags & 1 else 0,
            "real_servers": [{"address": str(rs.key), "weight": rs.weight}
                             for rs in des.dests.get(key, ())],
        })
    return {
        "families": list(des.families),
        "virtual_servers": services,
        "addresses": sorted(str(a) for a in des.addresses),
        "ipsets": {name: sorted(m) for name, m in sorted(des.sets.items())},
        "iptables": {f"ipv{fam}": {t: {c: list(r) for c, r in chains.items()}
                                   for t, chains in rules.items()}
                     for fam, rules in des.rules.items()},
        "sysctls": dict(des.sysctls),
        "problems": [str(p) for p in des.problems],
    }
