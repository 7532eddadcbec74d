"""`make demo`: the daemon, `ipvsproxy run`, against the real kube-apiserver, in the lab.

On the host: etcd and kube-apiserver v1.35.4 (integration/upstream/controlplane.py, as the
kernel tests start them), deploy/rbac.yaml applied and a token of the proxy's ServiceAccount;
then one lab guest runs integration/vm/demo.sh, which reaches the API server through qemu's
user network (10.0.2.2 is the host's loopback there): pods as network namespaces, the daemon,
Services and EndpointSlices applied with kubectl, traffic, and an endpoint change through the
API timed until the kernel holds it.

    python -m integration.vm.demo
"""

from __future__ import annotations

import shlex
import sys
import tempfile
import time
from pathlib import Path

from integration.upstream.controlplane import GUEST_SIDE_ADDRESS, ControlPlane, Missing
from integration.upstream.remote import Remote
from integration.vm import lab

ROOT = Path(__file__).resolve().parents[2]


def main() -> int:
    t0 = time.monotonic()
    try:
        cp = ControlPlane()
    except Missing as exc:
        print(f"demo: {exc}", file=sys.stderr)
        return 1
    with cp, tempfile.TemporaryDirectory(prefix="ipvsproxy-demo-") as tmp:
        cp.start()
        print(f"== the control plane on the host: etcd and kube-apiserver v1.35.4 ready in "
              f"{cp.timings['total']:.1f} s", flush=True)
        guest = Remote({"url": f"https://{GUEST_SIDE_ADDRESS}:{cp.port}", "control": "",
                        "ca_pem": cp.ca_pem, "admin_token": cp.admin_token})
        cp.apply_rbac()
        guest.kubeconfig(Path(tmp) / "admin.kubeconfig")
        guest.kubeconfig(Path(tmp) / "proxy.kubeconfig", cp.token("kube-system", "ipvsproxy"))
        cmd = f"bash integration/vm/demo.sh {shlex.quote(tmp)} {shlex.quote(str(cp.bin))}"
        try:
            res = lab.run(cmd, timeout=900, stream=True, network=True,
                          extra_rwdirs=[Path(tmp)])
        except lab.LabError as exc:
            print(f"demo: {exc}", file=sys.stderr)
            return 3
    print(f"== demo done in {time.monotonic() - t0:.0f} s (guest boot {res.boot_seconds:.0f} s, "
          f"kernel {res.kernel_release}), exit {res.rc}", flush=True)
    return res.rc


if __name__ == "__main__":
    sys.exit(main())
