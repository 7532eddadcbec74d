"""The host's side of the side-by-side bench (issue 33): etcd and the real kube-apiserver on the
host's loopback (integration/upstream/controlplane.py), a control server through which the lab
guest asks for each size's cluster to be loaded (POST /load?services=N&dests=M: the services
not loaded yet, from the host, a few keep-alive connections at once), then one lab boot with a
NIC on qemu's user network running bench/peers.py, which reaches the API server as 10.0.2.2.

    python -m bench.peers_host [--memory 4G] [--timeout 14400] -- --sizes 1000,10000 ...

Everything after `--` is bench/peers.py's (its --help).
"""

from __future__ import annotations

import argparse
import json
import shlex
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from bench.peers_cluster import NODE_PORT_RANGE, Loader

ROOT = Path(__file__).resolve().parents[1]


def main(argv: list[str] | None = None) -> int:
    raw = sys.argv[1:] if argv is None else argv
    ours, theirs = (raw[:raw.index("--")], raw[raw.index("--") + 1:]) if "--" in raw \
        else (raw, [])
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--memory", default="4G", help="the lab guest's memory")
    ap.add_argument("--timeout", type=float, default=4 * 3600.0, help="the lab guest's limit")
    ap.add_argument("--out", default=str(ROOT / "bench" / "results"))
    ap.add_argument("--ps-every", type=float, default=0.0,
                    help="write the guest's threads, busiest first, to OUT/ps.txt this often "
                         "(seconds; 0: never): what a run that stops moving is doing")
    args = ap.parse_args(ours)
    # SIGTERM (timeout(1), CI cancellation) unwinds like Ctrl-C, so lab.run kills the guest
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))

    from integration.upstream.controlplane import ControlPlane
    from integration.upstream.remote import guest_info, serve_control
    from integration.vm import lab

    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, text=True,
                            capture_output=True, check=False).stdout.strip()
    dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], cwd=ROOT,
                           text=True, capture_output=True, check=False).stdout.strip()
    commit += "+changes" if dirty else ""
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    t0 = time.monotonic()
    cp = ControlPlane(extra_args=[f"--service-node-port-range={NODE_PORT_RANGE}"])
    server = None
    try:
        cp.start()
        print(f"peers: control plane on the host: etcd {cp.timings['etcd']:.1f}s, "
              f"kube-apiserver {cp.timings['kube-apiserver']:.1f}s", flush=True)
        loader = Loader(cp.url, cp.ca_pem, cp.admin_token)
        loader.base()

        def load(q: dict[str, str]) -> dict[str, object]:
            got = loader.load(int(q["services"]), int(q["dests"]))
            print(f"peers: loaded {got}", flush=True)
            return got

        server = serve_control(cp, extra={("POST", "/load"): load})
        with tempfile.TemporaryDirectory(prefix="ipvsproxy-peers-") as tmp:
            info = Path(tmp) / "controlplane.json"
            info.write_text(json.dumps(guest_info(cp, server)))
            ps = (f"(while sleep {args.ps_every:g}; do ps -eLo pid,tid,stat,pcpu,etime,"
                  f"wchan:24,args --sort=-pcpu | head -40 > {shlex.quote(str(out.resolve()))}"
                  "/ps.txt; done) & " if args.ps_every > 0 else "")
            cmd = (ps + f"IPVSPROXY_CONTROLPLANE={shlex.quote(str(info))} "
                   f"python -m bench.peers --commit {shlex.quote(commit)} "
                   f"--out {shlex.quote(str(out.resolve()))} "
                   + " ".join(shlex.quote(a) for a in theirs))
            res = lab.run(cmd, timeout=args.timeout, memory=args.memory, stream=True,
                          extra_rwdirs=[Path(tmp), out.resolve()], network=True)
        print(f"peers: lab kernel {res.kernel_release}, boot {res.boot_seconds:.1f}s, guest "
              f"{res.total_seconds:.0f}s, exit {res.rc}; {time.monotonic() - t0:.0f}s in all",
              file=sys.stderr)
        return res.rc
    except lab.LabError as exc:
        print(f"peers: {exc}", file=sys.stderr)
        return 3
    finally:
        if server is not None:
            server.shutdown()
        cp.close()


if __name__ == "__main__":
    sys.exit(main())
