"""What /proc/PID/status says of a process, for every bench that samples one (the proxies'
memory in bench/peers.py, the daemon's in bench/cluster_bench.py and bench/attacks.py, the HTTP
server's in bench/http_abuse.py): the numeric fields, sizes in kB as the kernel prints them."""

from __future__ import annotations

from pathlib import Path


def status(pid: int | str) -> dict[str, int]:
    """Every field whose value starts with a number: {"VmRSS": 81234, "Threads": 9, ...}
    (kB for sizes). `pid` may be "self"."""
    out: dict[str, int] = {}
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        k, _, v = line.partition(":")
        first = v.split(None, 1)
        if first and first[0].isdigit():
            out[k] = int(first[0])
    return out


def kb(pid: int | str, field: str) -> int:
    got = status(pid)
    if field not in got:
        raise RuntimeError(f"/proc/{pid}/status has no {field}")
    return got[field]
