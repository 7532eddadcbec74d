"""Remove everything ipvsproxy owns, and nothing else (`plan_cleanup`): its virtual servers
(those in its IPVSPROXY-OWNED-VS sets), the jumps to its chains and the chains, the addresses it
bound to kube-ipvs0 and the link itself when nothing foreign is left on it, then its ipsets. In
that order: a set cannot be destroyed while a rule uses it, and an address should not outlive its
rules. (kube-proxy --cleanup flushes every virtual server on the host; we do not.) Or, once
kube-proxy has taken the node back, only ipvsproxy's own records (`plan_records_cleanup`).
"""

from __future__ import annotations

import shutil
from collections.abc import Callable
from dataclasses import dataclass
from functools import partial
from ipaddress import ip_address

from ipvsproxy.core import tables as T
from ipvsproxy.core.desired import KUBE_IPVS0
from ipvsproxy.core.ipvs import IpvsOp, OpKind
from ipvsproxy.core.ipvs_cmdline import op_line
from ipvsproxy.core.plan import owned_entry
from ipvsproxy.core.rules import TABLES, jump_line
from ipvsproxy.kernel import iptables
from ipvsproxy.kernel.dummy import DummyLink
from ipvsproxy.kernel.ipset import IPSets
from ipvsproxy.kernel.ipvs import IpvsClient

FAMILIES = (4, 6)


@dataclass(frozen=True, slots=True)
class Action:
    lines: tuple[str, ...]
    run: Callable[[], object]


def plan_cleanup() -> tuple[list[Action], list[str]]:
    """The actions, and notes on what is deliberately left in place."""
    actions: list[Action] = []
    notes: list[str] = []
    with IPSets() as ipsets:
        saved = ipsets.read_all()
    names = {T.family_name(d.name, f): f for d in T.ALL_IPSETS for f in FAMILIES}
    owned = set().union(*(saved[n].members for n in
                          (T.family_name(T.OWNED, f) for f in FAMILIES) if n in saved))
    try:
        with IpvsClient() as client:
            services = client.dump(stats=False)
    except OSError:
        services = []  # no IPVS in this kernel: nothing of ours there either
    ops = [IpvsOp(OpKind.DEL_SERVICE, s.service) for s in services
           if owned_entry(s.service.key) in owned]
    if ops:
        def del_services() -> object:
            with IpvsClient() as client:
                errs = client.apply(ops)
            if errs:
                raise RuntimeError("; ".join(str(e) for e in errs))
            return None
        actions.append(Action(tuple(op_line(o) for o in ops), del_services))
    for fam in FAMILIES:
        tool = "ip6tables" if fam == 6 else "iptables"
        if not shutil.which(f"{tool}-restore"):
            continue
        try:
            have = iptables.save(fam)
        except iptables.IptablesError as exc:
            notes.append(f"{tool}: cannot read rules ({exc}); left alone")
            continue
        payload: list[str] = []
        cmds: list[str] = []
        for table, chains in TABLES.items():
            present = [c for c in chains if c in have.get(table, {})]
            jumps = [j for j in T.JUMPS if j.table == table
                     and jump_line(j) in have.get(table, {}).get(j.chain, ())]
            if not present and not jumps:
                continue
            body = [f":{c} - [0:0]" for c in present]
            body += ["-D" + jump_line(j)[2:] for j in jumps]
            body += [f"-X {c}" for c in present]
            payload += [f"*{table}", *body, "COMMIT"]
            cmds += [f"{tool} -t {table} {ln}" for ln in body if ln.startswith("-D")]
            cmds += [f"{tool} -t {table} -F {c}" for c in present]
            cmds += [f"{tool} -t {table} -X {c}" for c in present]
        if payload:
            actions.append(Action(tuple(cmds), partial(iptables.restore, fam, tuple(payload))))
    with DummyLink() as link:
        if link.index() is not None:
            listed = {ip_address(e) for f in FAMILIES
                      if (n := T.family_name(T.IPVS_IPS, f)) in saved for e in saved[n].members}
            bound = link.addresses()
            mine = sorted(bound & listed, key=lambda a: (a.version, int(a)))
            if mine:
                def unbind(addrs: list = mine) -> object:  # type: ignore[type-arg]
                    with DummyLink() as lk:
                        lk.remove(addrs)
                    return None
                actions.append(Action(tuple(f"ip addr del {a}/{a.max_prefixlen} dev {KUBE_IPVS0}"
                                            for a in mine), unbind))
            foreign = bound - listed
            if foreign:
                notes.append(f"{KUBE_IPVS0} kept: it holds addresses ipvsproxy did not add "
                             f"({', '.join(sorted(map(str, foreign)))})")
            else:
                def del_link() -> object:
                    with DummyLink() as lk:
                        return lk.delete()
                actions.append(Action((f"ip link del {KUBE_IPVS0}",), del_link))
    actions += _destroy_and_forget([n for n in saved if n in names])
    return actions, notes


def plan_records_cleanup() -> tuple[list[Action], list[str]]:
    """Only ipvsproxy's own records, once kube-proxy has taken the node back in IPVS mode: the
    IPVSPROXY-* sets (and any rule of ipvsproxy's still matching one) and the published names.
    Nothing that serves traffic: the virtual servers ipvsproxy recorded as its own are
    kube-proxy's now, and `plan_cleanup` would delete them."""
    with IPSets() as ipsets:
        saved = ipsets.read_all()
    own = [n for n in (T.family_name(d.name, f) for d in T.OWN_IPSETS for f in FAMILIES)
           if n in saved]
    actions: list[Action] = []
    for fam in FAMILIES:
        tool = "ip6tables" if fam == 6 else "iptables"
        if not own or not shutil.which(f"{tool}-restore"):
            continue
        payload: list[str] = []
        for table, chains in iptables.save(fam).items():
            dels = ["-D" + r[2:] for rules in chains.values() for r in rules
                    if any(f" --match-set {n} " in r for n in own)]
            if dels:
                payload += [f"*{table}", *dels, "COMMIT"]
        if payload:
            actions.append(Action(tuple(f"{tool} {ln}" for ln in payload if ln[0] == "-"),
                                  partial(iptables.restore, fam, tuple(payload))))
    return actions + _destroy_and_forget(own), []


def _destroy_and_forget(sets: list[str]) -> list[Action]:
    """Destroy these sets (after the rules that used them), and remove the names file."""
    actions = []
    if sets:
        def destroy() -> object:
            with IPSets() as s:
                for n in sets:
                    s.destroy(n)
            return None
        actions.append(Action(tuple(f"ipset destroy {n}" for n in sets), destroy))
    from ipvsproxy import names as published  # the service names the syncs wrote

    if published.path().exists():
        actions.append(Action((f"rm {published.path()}",), published.remove))
    return actions

