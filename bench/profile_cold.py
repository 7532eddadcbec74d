"""Where a cold node's time goes (issue 33: the cold-node target missed at 1,000 services is
profiled, not guessed). In the lab guest, for each size: the generated cluster (bench/cluster_gen)
as one JSON List, a clean kernel, then `ipvsproxy sync --once --from-file` as a user runs it (a
new process, installed in the guest's tmpfs as on a node: bench/node_install.py), once plain,
timed from outside with the child's peak memory, once more plain from the checkout over the
lab's 9p (what the lab's file system costs a Python start), and once under cProfile, whose
cumulative times are summed into the phases below. cProfile slows Python code more than the
kernel's and the tools' work, so the phases are shown as shares of the profiled run and the
plain run gives the time. A profiled run on the kernel a sync left (nothing to do, everything
read back) shows the daemon's periodic full sync.

The daemon's cold node is this plus what only it does (the list through the API server, the
threads, the HTTP servers); bench/peers.py measures that from outside.

    python -m bench.profile_cold --sizes 1000,10000   # in the lab (make profile-cold)
"""

from __future__ import annotations

import argparse
import cProfile  # noqa: F401  (run as `python -m cProfile` below; imported to fail early)
import json
import os
import pstats
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from bench.cluster_gen import CLUSTER_CIDR, NODE, NODE_IP, generate
from bench.node_install import Installed, install
from bench.peers import fresh_ipvs

NODE_IF = "bench0"
# (phase, file suffix, function): cumulative time of that function in the profiled run
PHASES = (
    ("imports (every module, when first imported)", "<frozen importlib._bootstrap>",
     "_find_and_load"),
    ("read and parse the manifest", "ipvsproxy/inputs/manifests.py", "load_objects"),
    ("desired state", "ipvsproxy/core/desired.py", "compute_desired"),
    ("read the kernel (observe)", "ipvsproxy/kernel/dataplane.py", "observe"),
    ("diff", "ipvsproxy/core/plan.py", "diff"),
    ("apply: IPVS (netlink)", "ipvsproxy/kernel/ipvs.py", "apply"),
    ("apply: ipset members (ipset restore)", "ipvsproxy/kernel/dataplane.py", "_apply_members"),
    ("apply: ipsets created", "ipvsproxy/kernel/dataplane.py", "_create_sets"),
    ("apply: kube-ipvs0 addresses", "ipvsproxy/kernel/dataplane.py", "_apply_addresses"),
    ("apply: everything else (iptables-restore, link, sysctls)", "ipvsproxy/kernel/dataplane.py",
     "_apply_one"),
    ("publish names (ls --services)", "ipvsproxy/names.py", "write"),
)


def sh(cmd: str) -> None:
    subprocess.run(cmd, shell=True, check=False, capture_output=True)


def clean() -> None:
    script = Path(sys.executable).with_name("ipvsproxy")
    subprocess.run([str(script), "cleanup"], capture_output=True, check=False)
    sh("ipvsadm -C; ipset destroy; ip link del kube-ipvs0; iptables -t nat -F; iptables -F")
    fresh_ipvs()  # the last run's real servers out of the IPVS trash (bench/peers.py)


def argv(manifest: Path) -> list[str]:
    return ["-m", "ipvsproxy", "--log-format", "json", "sync", "--once", "--from-file",
            str(manifest), "--hostname-override", NODE, "--cluster-cidr", CLUSTER_CIDR,
            "--nodeport-addresses", f"{NODE_IP}/32"]


# the modules `ipvsproxy run` imports before its first list
IMPORTS = ("import ipvsproxy.commands.run, ipvsproxy.daemon.reconciler, ipvsproxy.daemon.metrics, "
           "ipvsproxy.kube.reflector, ipvsproxy.kernel.dataplane")


def best_of(cmd: list[str], env: dict[str, str] | None, n: int = 3) -> float:
    best = float("inf")
    for _ in range(n):
        t0 = time.perf_counter()
        subprocess.run(cmd, env=env, check=True, capture_output=True)
        best = min(best, time.perf_counter() - t0)
    return best


def starts(inst: Installed) -> dict[str, float]:
    """An interpreter's start, and the daemon's imports, from the checkout over 9p and from the
    node-like copy (best of 3 each, byte code already written)."""
    return {"python_pass_9p_s": best_of([sys.executable, "-P", "-c", "pass"], None),
            "python_pass_node_s": best_of([str(inst.python), "-P", "-c", "pass"], inst.env),
            "imports_9p_s": best_of([sys.executable, "-P", "-c", IMPORTS], None),
            "imports_node_s": best_of([str(inst.python), "-P", "-c", IMPORTS], inst.env)}


def plain(manifest: Path, python: str = sys.executable, env: dict[str, str] | None = None
          ) -> dict[str, float]:
    clean()
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    t0 = time.perf_counter()
    p = subprocess.run([python, *argv(manifest)], capture_output=True, text=True,
                       check=False, env=env)
    wall = time.perf_counter() - t0
    if p.returncode != 0:
        raise RuntimeError(f"sync --once exited {p.returncode}: {p.stderr[-1500:]}")
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = (after.ru_utime + after.ru_stime) - (before.ru_utime + before.ru_stime)
    return {"wall_s": wall, "cpu_s": cpu, "peak_rss_mb": after.ru_maxrss / 1024}


def profiled(manifest: Path, out: Path, inst: Installed, cold: bool = True
             ) -> dict[str, object]:
    """cold: from a clean kernel; else on the kernel as the last sync left it (a resync that
    reads everything back and finds nothing to do, as the daemon's periodic full sync)."""
    if cold:
        clean()
    t0 = time.perf_counter()
    p = subprocess.run([str(inst.python), "-m", "cProfile", "-o", str(out), *argv(manifest)],
                       capture_output=True, text=True, check=False, env=inst.env)
    wall = time.perf_counter() - t0
    if p.returncode != 0:
        raise RuntimeError(f"profiled sync --once exited {p.returncode}: {p.stderr[-1500:]}")
    st = pstats.Stats(str(out))
    stats: dict[tuple[str, int, str], tuple[int, int, float, float, object]] = \
        st.stats  # type: ignore[attr-defined]
    total = max(ct for _cc, _nc, _tt, ct, _callers in stats.values())
    phases = {}
    for name, suffix, fn in PHASES:
        phases[name] = sum(ct for (f, _line, func), (_cc, _nc, _tt, ct, _callers) in stats.items()
                           if f.endswith(suffix) and func == fn)
    top = sorted(((tt, f"{Path(f).name}:{line} {func}") for (f, line, func),
                  (_cc, _nc, tt, _ct, _callers) in stats.items()), reverse=True)[:15]
    return {"wall_s": wall, "profiled_s": total, "phases_s": phases,
            "top_self_s": [(round(t, 3), where) for t, where in top]}


# In one process, as the daemon keeps one: the resident set after the imports, after parsing the
# manifest, after a first sync on a clean kernel, and after a resync that reads the full kernel
# back (the daemon's periodic full sync), each after a collection and malloc_trim; VmHWM is the
# peak so far.
MEMORY = r"""
import argparse, ctypes, gc, json, sys
def status():
    got = {}
    for line in open("/proc/self/status"):
        k, _, v = line.partition(":")
        if k in ("VmRSS", "RssAnon", "RssFile", "RssShmem", "VmHWM"):
            got[k] = round(int(v.split()[0]) / 1024, 1)
    return got
def settle():
    gc.collect()
    ctypes.CDLL("libc.so.6").malloc_trim(0)
from ipvsproxy.commands.sync import add_arguments
from ipvsproxy.settings.config import from_args
from ipvsproxy.inputs.manifests import load_objects
from ipvsproxy.syncer import sync
import ipvsproxy.kernel.dataplane
out = {}
settle(); out["imports"] = status()
ap = argparse.ArgumentParser(); add_arguments(ap); args = ap.parse_args(sys.argv[1:])
cfg = from_args(args)
gc.disable()
docs = list(load_objects(args.from_file)); settle(); out["parsed"] = status()
o = sync(docs, cfg); assert not o.failures, o.failures[:3]; del o; settle()
out["first sync"] = status()
o = sync(docs, cfg); assert not o.failures, o.failures[:3]; del o; settle()
out["resync"] = status()
print(json.dumps(out))
"""


def memory(manifest: Path, inst: Installed) -> dict[str, dict[str, float]]:
    clean()
    p = subprocess.run([str(inst.python), "-P", "-c", MEMORY, *argv(manifest)[5:]],
                       capture_output=True, text=True, check=False, env=inst.env)
    if p.returncode != 0:
        raise RuntimeError(f"the memory run exited {p.returncode}: {p.stderr[-1500:]}")
    return dict(json.loads(p.stdout.strip().splitlines()[-1]))


def main(argv_: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--sizes", default="1000,10000")
    ap.add_argument("--dests", type=int, default=10)
    ap.add_argument("--out", default="bench/results")
    args = ap.parse_args(argv_)
    sh("modprobe -a ip_vs ip_vs_rr dummy xt_set xt_ipvs xt_MASQUERADE xt_comment xt_mark "
       "xt_addrtype xt_conntrack")
    sh(f"ip link add {NODE_IF} type dummy && ip addr add {NODE_IP}/24 dev {NODE_IF} "
       f"&& ip link set {NODE_IF} up")
    work = Path(tempfile.mkdtemp(prefix="profile-cold-"))
    t = time.perf_counter()
    inst = install(Path("/tmp/ipvsproxy-node"))
    print(f"installed ipvsproxy in the guest's tmpfs as on a node ({time.perf_counter() - t:.0f}s)")
    st = starts(inst)
    doc: dict[str, object] = {"date": time.strftime("%Y-%m-%d %H:%M"),
                              "kernel": os.uname().release, "starts": st, "sizes": {}}
    print(f"python -c pass: {st['python_pass_9p_s']:.2f} s from 9p, "
          f"{st['python_pass_node_s']:.2f} s installed as on a node\n"
          f"the daemon's imports: {st['imports_9p_s']:.2f} s from 9p, "
          f"{st['imports_node_s']:.2f} s installed as on a node")
    try:
        for size in (int(s) for s in args.sizes.split(",")):
            manifest = work / f"cluster-{size}.json"
            manifest.write_text(json.dumps({"kind": "List", "items": generate(size, args.dests)}))
            res = {"plain_9p": plain(manifest),
                   "plain": plain(manifest, str(inst.python), inst.env),
                   "resync_profile": profiled(manifest, work / f"{size}-resync.prof", inst,
                                              cold=False),
                   "profile": profiled(manifest, work / f"{size}.prof", inst),
                   "memory": memory(manifest, inst)}
            doc["sizes"][str(size)] = res  # type: ignore[index]
            p9, pl, pr = res["plain_9p"], res["plain"], res["profile"]
            print(f"\n{size} services x {args.dests}: sync --once from a file {pl['wall_s']:.1f} s "
                  f"wall ({p9['wall_s']:.1f} s from 9p), {pl['cpu_s']:.1f} s CPU, peak RSS "
                  f"{pl['peak_rss_mb']:.0f} MB; profiled {pr['wall_s']:.1f} s (inside the "
                  f"profile {pr['profiled_s']:.1f} s)")
            total = float(pr["profiled_s"])  # type: ignore[arg-type]
            start = float(pr["wall_s"]) - total  # type: ignore[arg-type]
            print(f"  {'interpreter start (outside the profile)':58} "
                  f"{start:7.2f} s")
            for name, secs in pr["phases_s"].items():  # type: ignore[union-attr]
                print(f"  {name:58} {secs:7.2f} s {100 * secs / total:5.1f}%")
            rs = res["resync_profile"]
            rtotal = float(rs["profiled_s"])  # type: ignore[arg-type]
            print(f"  the same on the kernel it left (a resync, nothing to do): profiled "
                  f"{rs['wall_s']:.1f} s")
            for name, secs in rs["phases_s"].items():  # type: ignore[union-attr]
                if secs:
                    print(f"    {name:56} {secs:7.2f} s {100 * secs / rtotal:5.1f}%")
            print("  resident memory in one process (MB):")
            for when, m in res["memory"].items():  # type: ignore[union-attr]
                print(f"    {when:12} RSS {m['VmRSS']:6.1f} (anon {m['RssAnon']:6.1f}) "
                      f"peak so far {m['VmHWM']:6.1f}")
            print("  most self time:")
            for t, where in pr["top_self_s"]:  # type: ignore[union-attr]
                print(f"    {t:7.3f} s {where}")
    finally:
        clean()
        sh(f"ip link del {NODE_IF}")
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    path = out / f"profile-cold-{time.strftime('%Y%m%dT%H%M%S')}.json"
    path.write_text(json.dumps(doc, indent=1) + "\n")
    print(f"\n{path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
