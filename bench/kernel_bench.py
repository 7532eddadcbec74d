"""Kernel-layer benchmarks, run inside the lab: ipvsproxy next to the C tools, same guest run.

Software emulation makes absolute times meaningless, so every figure is a ratio to the C tool
doing the same kernel work in the same boot. Each timing is the best of `--repeat` runs, ours
and the C tool's taking turns.

    python -m bench.kernel_bench [--services 2000] [--dests 10] [--entries 50000]
                                 [--cluster-services 10000] [--changes 200]

The cluster-size figures (cold start, resync, one endpoint change, daemon memory) are
bench/cluster_bench.py's.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import os
import subprocess
import sys
import time
from collections.abc import Callable
from ipaddress import IPv4Address
from pathlib import Path
from typing import Any

from bench import cluster_bench
from ipvsproxy.cli import main as ipvsproxy_main
from ipvsproxy.core.ipvs import (
    DestKey,
    IpvsOp,
    OpKind,
    Protocol,
    RealServer,
    ServiceKey,
    VirtualServer,
)
from ipvsproxy.kernel.ipvs import IpvsClient

ROOT = Path(__file__).resolve().parents[1]


def rules(n_services: int, n_dests: int) -> list[tuple[VirtualServer, list[RealServer]]]:
    out = []
    for i in range(n_services):
        proto = Protocol.UDP if i % 10 == 9 else Protocol.TCP
        vs = VirtualServer(ServiceKey.inet(proto, IPv4Address(0x0A600000 + i), 80 + i % 3),
                           "rr", 0x1 if i % 7 == 0 else 0, 10800 if i % 7 == 0 else 0)
        ds = [RealServer(DestKey(IPv4Address(0x0AF40000 + i * n_dests + j), 8080))
              for j in range(n_dests)]
        out.append((vs, ds))
    return out


def ops(rs: list[tuple[VirtualServer, list[RealServer]]]) -> list[IpvsOp]:
    out = []
    for vs, ds in rs:
        out.append(IpvsOp(OpKind.ADD_SERVICE, service=vs))
        out.extend(IpvsOp(OpKind.ADD_DEST, service=vs, dest=d) for d in ds)
    return out


def restore_text(rs: list[tuple[VirtualServer, list[RealServer]]]) -> str:
    lines = []
    for vs, ds in rs:
        flag = "-u" if vs.key.protocol == Protocol.UDP else "-t"
        sel = f"{flag} {vs.key.addr}:{vs.key.port}"
        lines.append(f"-A {sel} -s rr" + (" -p 10800" if vs.flags & 1 else ""))
        lines.extend(f"-a {sel} -r {d.key.addr}:{d.key.port} -m -w 1" for d in ds)
    return "\n".join(lines) + "\n"


def sh(cmd: str, stdin: str | None = None) -> None:
    subprocess.run(cmd, shell=True, input=stdin, text=True, check=True,
                   stdout=subprocess.DEVNULL)


def stdout_of(cmd: str) -> str:
    return subprocess.run(cmd, shell=True, text=True, check=True, capture_output=True).stdout


def best(fns: list[Callable[[], object]], repeat: int,
         before: Callable[[], object] | None = None) -> list[float]:
    """The best time of each of fns over `repeat` rounds. The runs take turns (ours, theirs,
    ours, theirs ...), so a slow spell of the emulator (another guest, the host) falls on
    both sides of a ratio instead of on one."""
    times: list[list[float]] = [[] for _ in fns]
    for _ in range(repeat):
        for fn, got in zip(fns, times, strict=True):
            if before:
                before()
            t0 = time.perf_counter()
            fn()
            got.append(time.perf_counter() - t0)
    return [min(t) for t in times]


def ipset_lines(name: str, n: int) -> list[str]:
    return [f"add {name} {IPv4Address(0x0A600000 + i // 4)},tcp:{80 + i % 4}" for i in range(n)]


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--services", type=int, default=2000)
    ap.add_argument("--dests", type=int, default=10)
    ap.add_argument("--entries", type=int, default=50000)
    ap.add_argument("--addresses", type=int, default=1000)
    ap.add_argument("--repeat", type=int, default=2)
    ap.add_argument("--cluster-services", type=int, default=10000,
                    help="the generated cluster of bench/cluster_bench.py (0: skip it)")
    ap.add_argument("--cluster-dests", type=int, default=10)
    ap.add_argument("--changes", type=int, default=200)
    ap.add_argument("--cluster-repeat", type=int, default=1)
    ap.add_argument("--cluster-parts", default=",".join(sorted(cluster_bench.PARTS)),
                    help="which cluster benchmarks: cold (the cold starts), resync, daemon "
                         "(endpoint changes, memory)")
    ap.add_argument("--cluster-formats", default=",".join(sorted(cluster_bench.FORMATS)),
                    help="the dump formats the cold start reads: JSON, YAML or both")
    ap.add_argument("--out", default=str(ROOT / "bench" / "results"))
    args = ap.parse_args()
    parts = frozenset(args.cluster_parts.split(","))
    formats = frozenset(args.cluster_formats.upper().split(","))
    unknown = (parts - cluster_bench.PARTS) | (formats - cluster_bench.FORMATS)
    if unknown:
        ap.error(f"unknown --cluster-parts or --cluster-formats: {', '.join(sorted(unknown))}")
    sh("modprobe -a ip_vs ip_vs_rr")
    rs = rules(args.services, args.dests)
    the_ops = ops(rs)
    text = restore_text(rs)
    n_ops = len(the_ops)
    results: list[dict[str, Any]] = []
    facts: list[dict[str, Any]] = []

    def row(figure: str, ours: float, ref: float, ref_name: str, target: float | None,
            unit: str = "s") -> None:
        """A measured ratio against its target; without one (None) it is shown for context."""
        ratio = ours / ref
        results.append({"figure": figure, "ipvsproxy": round(ours, 3), "reference": ref_name,
                        "reference_value": round(ref, 3), "unit": unit, "ratio": round(ratio, 3),
                        "target": target, "met": None if target is None else ratio <= target})
        print(f"measured: {figure}: {ours:.3f}{unit} vs {ref_name} {ref:.3f}{unit}", flush=True)

    def info(figure: str, value: Any) -> None:
        facts.append({"figure": figure, "value": value})
        print(f"measured: {figure}: {value}", flush=True)

    def clear() -> None:
        sh("ipvsadm -C")

    def program_ours() -> None:
        with IpvsClient() as c:
            failures = c.apply(the_ops)
        assert not failures, failures[:3]

    ours, ref = best([program_ours, lambda: sh("ipvsadm -R", text)], args.repeat, clear)
    row(f"program {args.services} VS x {args.dests} RS ({n_ops} ops)", ours, ref, "ipvsadm -R", 1.0)

    # table is now loaded (by ipvsadm -R); observe it
    def dump() -> None:
        with IpvsClient() as c:
            assert len(c.dump()) == args.services

    ours, save, listing = best([dump, lambda: sh("ipvsadm -Sn"), lambda: sh("ipvsadm -Ln")],
                               args.repeat)
    row("observe: full dump with stats", ours, save, "ipvsadm -Sn", 1.0)
    row("observe: full dump with stats", ours, listing, "ipvsadm -Ln", 1.0)
    # The command as a user runs it: the `ipvsproxy` entry point of the install.
    script = Path(sys.executable).with_name("ipvsproxy")
    ls = f"{script} ls -n" if script.exists() else f"{sys.executable} -m ipvsproxy ls -n"
    # Byte for byte the same text, from the command and from cli.main in this process; also
    # the first (cold) run of each.
    ipvsadm_text = stdout_of("ipvsadm -Ln")
    assert stdout_of(ls) == ipvsadm_text, "ipvsproxy ls -n differs from ipvsadm -Ln"
    with io.StringIO() as printed, contextlib.redirect_stdout(printed):
        assert ipvsproxy_main(["ls", "-n"]) == 0
        assert printed.getvalue() == ipvsadm_text, "ls -n in process differs from ipvsadm -Ln"

    def ls_in_process() -> None:
        """The listing itself (cli.main: arguments, the dump, the text, written out), in this
        process: the emulated interpreter's start-up, ~0.3 s of the whole process here, is
        not what a node pays (bench/host_bench.py measures the start-up on a real CPU)."""
        with open(os.devnull, "w") as null, contextlib.redirect_stdout(null):
            assert ipvsproxy_main(["ls", "-n"]) == 0

    # a second or so a run: five turns each at least, against the emulator's slow spells
    ours, whole, ref = best([ls_in_process, lambda: sh(ls), lambda: sh("ipvsadm -Ln")],
                            max(args.repeat, 5))
    row("ls -n (in process)", ours, ref, "ipvsadm -Ln", 1.5)
    info("ls -n, whole process under emulation (s)", round(whole, 3))
    clear()

    from ipvsproxy.core.ipset_text import Family, SetSpec, SetType
    from ipvsproxy.kernel.ipset import IPSets

    # Sized for its contents (as the sync sizes its sets): growing a hash set from
    # hashsize 1024 rehashes it over and over, which dominates under emulation.
    size = 1 << max(10, (args.entries - 1).bit_length())
    spec = SetSpec("BENCH-CLUSTER-IP", SetType.HASH_IP_PORT, Family.INET, hashsize=size,
                   maxelem=max(65536, size * 2))
    entries = [line.split(" ", 2)[2] for line in ipset_lines(spec.name, args.entries)]

    def ipset_reset() -> None:
        sh(f"ipset destroy {spec.name} 2>/dev/null || true")
        sh(f"ipset create {spec.name} hash:ip,port family inet hashsize {spec.hashsize} "
           f"maxelem {spec.maxelem}")

    def ipset_ours() -> None:
        with IPSets() as s:
            s.add(spec.name, entries)

    restore_in = "\n".join(ipset_lines(spec.name, args.entries)) + "\n"
    ours, ref = best([ipset_ours, lambda: sh("ipset restore", restore_in)], args.repeat,
                     ipset_reset)
    row(f"ipset bulk load {args.entries} entries", ours, ref, "ipset restore", 1.2)
    sh(f"ipset destroy {spec.name}")

    from ipvsproxy.kernel.dummy import KUBE_IPVS0, DummyLink

    addrs = [IPv4Address(0x0A600000 + i + 1) for i in range(args.addresses)]
    batch_in = "".join(f"address add {a}/32 dev {KUBE_IPVS0}\n" for a in addrs)
    link = DummyLink()

    def addrs_ours() -> None:
        link.add(addrs)

    def addrs_reset() -> None:
        link.ensure()
        sh(f"ip addr flush dev {KUBE_IPVS0}")

    ours, ref = best([addrs_ours, lambda: sh("ip -batch -", batch_in)], args.repeat, addrs_reset)
    row(f"kube-ipvs0: add {args.addresses} addresses", ours, ref, "ip -batch", 1.0)
    sh(f"ip link del {KUBE_IPVS0}")

    if args.cluster_services:
        import tempfile

        with tempfile.TemporaryDirectory(prefix="cluster-bench-") as tmp:
            cluster_bench.run_all(row, info, args.cluster_services, args.cluster_dests,
                                  args.changes, args.cluster_repeat, Path(tmp),
                                  parts=parts, formats=formats)

    kernel = os.uname().release
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    stamp = time.strftime("%Y%m%dT%H%M%S")
    doc = {"kernel": kernel, "host_kernel": os.environ.get("HOST_KERNEL_RELEASE", ""),
           "emulated": True, "results": results, "facts": facts}
    (out / f"kernel-{stamp}.json").write_text(json.dumps(doc, indent=2) + "\n")
    print(f"\nkernel layer benchmarks, kernel {kernel} (software emulation; ratios only)\n")
    print(f"{'figure':60} {'ipvsproxy':>10}  {'reference':44} {'ref':>9} {'ratio':>6} "
          f"{'target':>6}  met?")
    for r in results:
        u = r["unit"]
        print(f"{r['figure']:60} {r['ipvsproxy']:>9.3f}{u:<2} {r['reference']:44} "
              f"{r['reference_value']:>8.3f}{u:<2} {r['ratio']:>6.3f} "
              f"{'-' if r['target'] is None else r['target']:>6}  "
              f"{'-' if r['met'] is None else 'yes' if r['met'] else 'NO'}")
    for f in facts:
        print(f"{f['figure']:60} {f['value']}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
