"""iptables through its own tools: read chains with iptables-save, write with iptables-restore.

`--noflush` keeps every rule that is not in a chain the payload declares, so only ipvsproxy's
chains are rewritten (kube-proxy does the same, reference §1.5). `-w` waits for the xtables lock
that other agents on the node (CNI plugins, kubelet) also take.
"""

from __future__ import annotations

import subprocess
from collections.abc import Callable, Mapping, Sequence

from ipvsproxy.kernel.started import Started


class IptablesError(Exception):
    """iptables-save or iptables-restore failed; the message carries its stderr."""


def _tool(family: int, what: str) -> str:
    return f"ip6tables-{what}" if family == 6 else f"iptables-{what}"


def parse_save(text: str) -> dict[str, dict[str, tuple[str, ...]]]:
    """iptables-save output -> table -> chain -> rule lines ("-A CHAIN ...")."""
    tables: dict[str, dict[str, list[str]]] = {}
    chains: dict[str, list[str]] = {}
    for line in text.splitlines():
        if line.startswith("*"):
            chains = tables.setdefault(line[1:].strip(), {})
        elif line.startswith(":"):
            chains.setdefault(line[1:].split(" ", 1)[0], [])
        elif line.startswith("-A "):
            chain = line.split(" ", 2)[1]
            chains.setdefault(chain, []).append(line)
    return {t: {c: tuple(r) for c, r in cs.items()} for t, cs in tables.items()}


def save(family: int, tables: Sequence[str] = ("nat", "filter")
         ) -> dict[str, dict[str, tuple[str, ...]]]:
    return start_save(family, tables)()


def start_save(family: int, tables: Sequence[str] = ("nat", "filter")
               ) -> Callable[[], dict[str, dict[str, tuple[str, ...]]]]:
    """save(), its iptables-save runs started now: call the result for what save() returns."""
    runs = [(table, Started([_tool(family, "save"), "-t", table])) for table in tables]

    def finish() -> dict[str, dict[str, tuple[str, ...]]]:
        out: dict[str, dict[str, tuple[str, ...]]] = {}
        for table, run in runs:
            p = run.wait()
            if p.returncode != 0:
                raise IptablesError(f"{_tool(family, 'save')} -t {table}: {p.stderr.strip()}")
            out.update(parse_save(p.stdout))
            out.setdefault(table, {})
        return out

    return finish


def restore(family: int, payload: Sequence[str]) -> None:
    """One iptables-restore --noflush run; IptablesError names the failing line."""
    text = "\n".join(payload) + "\n"
    p = subprocess.run([_tool(family, "restore"), "--noflush", "-w", "5"], input=text,
                       capture_output=True, text=True, check=False)
    if p.returncode != 0:
        raise IptablesError(f"{_tool(family, 'restore')}: {p.stderr.strip()}")


def chains_of(saved: Mapping[str, Mapping[str, tuple[str, ...]]], family: int
              ) -> dict[tuple[int, str], Mapping[str, tuple[str, ...]]]:
    return {(family, t): cs for t, cs in saved.items()}
