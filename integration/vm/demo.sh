#!/usr/bin/env bash
# `make demo`, inside the lab guest (integration/vm/demo.py starts it): `ipvsproxy run`, the
# DaemonSet's job, against the real kube-apiserver on the host. Pods are network namespaces;
# Services and EndpointSlices are applied through the API with kubectl; an endpoint change goes
# through the API too, and the time until the kernel holds it is measured by polling the kernel.
#   demo.sh DIR UPSTREAM_BIN   (DIR: admin.kubeconfig, proxy.kubeconfig; the daemon's log)
set -euo pipefail
cd "$(dirname "$0")/../.."
dir=$1 bin=$2
PY=${PYTHON:-.venv/bin/python}
# kubectl of the same release, copied once into the guest's memory: the host's files reach the
# guest over 9p without a page cache, so each run from there would read its 59 MB again.
kubectl() { /run/ipvsproxy-demo/kubectl --kubeconfig "$dir/admin.kubeconfig" "$@"; }
req() {  # req NS URL: one request; prints "pod (seen from ADDRESS)"
  local out
  if [ "$1" = node ]; then out=$(curl -s -m 3 "$2/cgi-bin/who"); else
    out=$(ip netns exec "$1" curl -s -m 3 "$2/cgi-bin/who"); fi
  local seen=${out##* }
  seen=${seen#"[::ffff:"}  # busybox httpd listens dual-stack
  echo "${out%% *} (it saw ${seen%]})"
}
now() { date +%s.%N; }
since() { awk -v a="$1" -v b="$(now)" 'BEGIN { printf "%.1f", b - a }'; }
# weighted real servers of VIP:PORT in the kernel (a removed one drains at weight 0)
serving() { ipvsadm -Ln -t "$1" 2>/dev/null | awk '$1 == "->" && $4 ~ /^[0-9]+$/ && $4 > 0 {print $2}' | sort | tr '\n' ' '; }
wait_serving() {  # VIP:PORT EXPECTED...: until the kernel serves exactly these
  local want="$2" t0
  t0=$(now)
  for _ in $(seq 600); do
    [ "$(serving "$1")" = "$want" ] && { since "$t0"; return 0; }
    sleep 0.1
  done
  echo "the kernel never held $want for $1 (it holds: $(serving "$1"))" >&2
  return 1
}

# The NIC on qemu's user network, one route: to the host (10.0.2.2, its loopback).
modprobe virtio_net
nic=""
for _ in $(seq 50); do
  for d in /sys/class/net/*; do
    [ "$(basename "$(readlink -f "$d/device/driver" 2>/dev/null)")" = virtio_net ] && nic=$(basename "$d")
  done
  [ -n "$nic" ] && break
  sleep 0.1
done
sysctl -qw "net.ipv6.conf.$nic.disable_ipv6=1"
ip link set "$nic" up
ip addr add 10.0.2.15/32 dev "$nic"
ip route add 10.0.2.2/32 dev "$nic"

mkdir -p /run/ipvsproxy-demo
cp "$bin/kubectl" /run/ipvsproxy-demo/kubectl
echo "== kernel $(uname -r) (host ${HOST_KERNEL_RELEASE:-?}); the API server: $(kubectl version -o json | "$PY" -c 'import json,sys; print(json.load(sys.stdin)["serverVersion"]["gitVersion"])') at $(kubectl config view -o jsonpath='{.clusters[0].cluster.server}')"
echo "== pods: pod1 10.244.1.11, pod2 10.244.1.12 (node-a), pod3 10.244.1.13 (node-b); an outside client 192.168.1.100"
bash integration/vm/pods.sh up pod1 pod2 pod3

echo "== ipvsproxy run (the DaemonSet's command), with the token of deploy/rbac.yaml's ServiceAccount"
"$PY" -m ipvsproxy --log-format console run --kubeconfig "$dir/proxy.kubeconfig" \
  --hostname-override node-a --cluster-cidr 10.244.0.0/16 --ip-families 4 \
  --ipvs-sync-period 30s >"$dir/daemon.log" 2>&1 &
daemon=$!
trap 'kill "$daemon" 2>/dev/null || true' EXIT

echo "== kubectl apply -f examples/demo.yaml (a Node, Services and their EndpointSlices)"
t0=$(now)
kubectl apply -f examples/demo.yaml
took=$(wait_serving 10.96.0.10:80 "10.244.1.11:8080 10.244.1.12:8080 10.244.1.13:8080 ")
echo "   the kernel held web's three real servers $(since "$t0") s after kubectl apply (the daemon's start included)"
echo "== ipvsproxy ls -n --services"
"$PY" -m ipvsproxy ls -n --services
echo "== 6 requests to the ClusterIP 10.96.0.10:80 from pod2 (rr)"
for _ in 1 2 3 4 5 6; do req pod2 http://10.96.0.10; done
echo "== 6 requests to the NodePort 192.168.1.10:30080 from the outside client (rr, masqueraded)"
for _ in 1 2 3 4 5 6; do req client http://192.168.1.10:30080; done
echo "== 4 requests to 10.96.0.20 (sh): the same client always lands on the same pod"
for _ in 1 2 3 4; do req pod1 http://10.96.0.20; done
echo "== 7 requests to 10.96.0.30 (wrr canary: stable pods weight 3, canary pod3 weight 1)"
for _ in 1 2 3 4 5 6 7; do req pod2 http://10.96.0.30; done | sort | uniq -c

echo "== an endpoint change through the API: pod3 leaves web (kubectl patch of its EndpointSlice)"
t0=$(now)
kubectl patch endpointslice web-abc12 --type=json -p '[{"op": "remove", "path": "/endpoints/2"}]'
took=$(wait_serving 10.96.0.10:80 "10.244.1.11:8080 10.244.1.12:8080 ")
echo "   the kernel held it $took s after kubectl returned ($(since "$t0") s after kubectl started; polled every 0.1 s)"
"$PY" -m ipvsproxy ls -n -t 10.96.0.10:80
echo "== 6 requests to 10.96.0.10:80 from pod2: pod1 and pod2 only"
for _ in 1 2 3 4 5 6; do req pod2 http://10.96.0.10; done
echo "== and back: pod3 rejoins web"
t0=$(now)
kubectl patch endpointslice web-abc12 --type=json -p '[{"op": "add", "path": "/endpoints/-", "value": {"addresses": ["10.244.1.13"], "nodeName": "node-b", "conditions": {"ready": true}}}]'
took=$(wait_serving 10.96.0.10:80 "10.244.1.11:8080 10.244.1.12:8080 10.244.1.13:8080 ")
echo "   the kernel held it $took s after kubectl returned"
for _ in 1 2 3 4 5 6; do req pod2 http://10.96.0.10; done
echo "== the daemon's log (console format; JSON when not on a terminal, as in a pod)"
grep -v '^\s*$' "$dir/daemon.log" | tail -n 8
echo "== SIGTERM: the daemon stops and leaves the kernel as it is (traffic keeps flowing)"
kill -TERM "$daemon"
wait "$daemon" || true
trap - EXIT
req pod2 http://10.96.0.10
echo "== ipvsproxy cleanup"
"$PY" -m ipvsproxy cleanup
ipvsadm -Ln | tail -n +4
bash integration/vm/pods.sh down
kubectl delete -f examples/demo.yaml >/dev/null
echo "== done"
