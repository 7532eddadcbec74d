#!/usr/bin/env bash
# `make demo`, run inside the lab guest: pods as network namespaces, services from
# examples/demo.yaml programmed by `ipvsproxy sync --once`, then real requests through them.
set -euo pipefail
cd "$(dirname "$0")/../.."
PY=${PYTHON:-.venv/bin/python}
FLAGS=(--hostname-override node-a --cluster-cidr 10.244.0.0/16 --ip-families 4)
req() {  # req NS URL: one request; prints "pod (seen from ADDRESS)"
  local out
  if [ "$1" = node ]; then out=$(curl -s -m 3 "$2/cgi-bin/who"); else
    out=$(ip netns exec "$1" curl -s -m 3 "$2/cgi-bin/who"); fi
  local seen=${out##* }
  seen=${seen#"[::ffff:"}  # busybox httpd listens dual-stack
  echo "${out%% *} (it saw ${seen%]})"
}
modprobe -a ip_vs ip_vs_rr ip_vs_wrr ip_vs_sh
echo "== kernel $(uname -r) (host ${HOST_KERNEL_RELEASE:-?}): $(head -1 /proc/net/ip_vs)"
echo "== pods: pod1 10.244.1.11, pod2 10.244.1.12 (node-a), pod3 10.244.1.13 (node-b); an outside client 192.168.1.100"
bash integration/vm/pods.sh up pod1 pod2 pod3
echo "== ipvsproxy sync --once --dry-run --from-file examples/demo.yaml (first lines of the plan)"
$PY -m ipvsproxy sync --once --dry-run --from-file examples/demo.yaml "${FLAGS[@]}" | grep -E '^ipvsadm|^ip addr' | head -12
echo "== ipvsproxy sync --once --from-file examples/demo.yaml"
$PY -m ipvsproxy --log-format console sync --once --from-file examples/demo.yaml "${FLAGS[@]}"
echo "== ipvsproxy ls -n"
$PY -m ipvsproxy ls -n
echo "== 6 requests to the ClusterIP 10.96.0.10:80 from pod2 (rr)"
for _ in 1 2 3 4 5 6; do req pod2 http://10.96.0.10; done
echo "== 6 requests to the NodePort 192.168.1.10:30080 from the outside client (rr, masqueraded)"
for _ in 1 2 3 4 5 6; do req client http://192.168.1.10:30080; done
echo "== 4 requests to 10.96.0.20 (sh): the same client always lands on the same pod"
for _ in 1 2 3 4; do req pod1 http://10.96.0.20; done
echo "== 7 requests to 10.96.0.30 (wrr canary: stable pods weight 3, canary pod3 weight 1)"
for _ in 1 2 3 4 5 6 7; do req pod2 http://10.96.0.30; done | sort | uniq -c
echo "== a second sync has nothing to do (--dry-run prints nothing):"
$PY -m ipvsproxy sync --once --dry-run --from-file examples/demo.yaml "${FLAGS[@]}"
echo "(nothing)"
echo "== ipvsproxy cleanup"
$PY -m ipvsproxy cleanup
ipvsadm -Ln | tail -n +4
bash integration/vm/pods.sh down
echo "== done"
