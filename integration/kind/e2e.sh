#!/usr/bin/env bash
# make kind-e2e: ipvsproxy as the only service proxy of a kind cluster, checked end to end.
#
# Creates the kind cluster ipvsproxy-e2e (no kube-proxy), builds the image and loads it into the
# cluster, deploys deploy/ through integration/kind/kustomization.yaml, waits until the proxy, the
# cluster DNS and the workload (workload.yaml) are ready, and checks with kubectl: ClusterIP,
# NodePort and externalIP reachable from a pod and from a node, session affinity, scaling the
# Deployment changes the real servers, and the ipvsproxy.io/scheduler annotation. The cluster is
# deleted at the end, passed or failed (KEEP_CLUSTER=1 keeps it, and its kubeconfig).
# Needs docker, kind and kubectl.
set -euo pipefail

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
repo=$(cd "$here/../.." && pwd)
# shellcheck source=integration/kind/lib.sh
source "$here/lib.sh"

# Both names are also in kustomization.yaml.
cluster=ipvsproxy-e2e
image=ipvsproxy:e2e
# Requests come from the control-plane node and from the client pod; the echo pods, the client
# and the proxy whose kernel tables are read are on the worker.
from=$cluster-control-plane
worker=$cluster-worker

for tool in docker kind kubectl; do
    command -v "$tool" >/dev/null || { echo "kind-e2e: $tool is needed" >&2; exit 1; }
done

work=$(mktemp -d)
export KUBECONFIG=$work/kubeconfig

finish() {
    local status=$?
    if [ "$status" -ne 0 ]; then
        echo "kind-e2e: FAILED; the cluster as it was:" >&2
        kubectl get nodes,pods,services -A -o wide >&2 || true
        kubectl -n kube-system logs -l app.kubernetes.io/name=ipvsproxy --tail=50 >&2 || true
    fi
    if [ -n "${KEEP_CLUSTER:-}" ]; then
        echo "kind-e2e: kept the cluster: KUBECONFIG=$KUBECONFIG kubectl get pods -A" >&2
    else
        kind delete cluster --name "$cluster" || true
        rm -rf "$work"
    fi
    exit "$status"
}
trap finish EXIT

step() { printf '\n== %s\n' "$*"; }

svc_ip() { kubectl get service "$1" -o jsonpath='{.spec.clusterIP}'; }
# GET /hostname of ADDR:PORT: the name of the echo pod that answered, or a failure.
from_pod() { kubectl exec client -- wget -qO- -T 5 "http://$1/hostname"; }
from_node() { docker exec "$from" curl -fsS --max-time 5 "http://$1/hostname"; }
# COMMAND... answers with an echo pod's name.
answers_echo() {
    local got
    got=$("$@") || return 1
    [[ $got == echo-* ]] || { echo "answered: $got"; return 1; }
    echo "$got"
}
# The virtual server ADDR:PORT as the worker's proxy sees it in the kernel.
ls_service() {
    kubectl -n kube-system exec "$proxy" -- ipvsproxy ls -Ln -t "$1"
}
expect_real_servers() {  # ADDR:PORT COUNT
    local listing got
    listing=$(ls_service "$1") || return 1
    got=$(ipvs_count_real_servers <<<"$listing")
    [ "$got" -eq "$2" ] || { echo "$got real servers, not $2:"; echo "$listing"; return 1; }
}
expect_scheduler() {  # ADDR:PORT SCHEDULER
    local listing got
    listing=$(ls_service "$1") || return 1
    got=$(ipvs_scheduler <<<"$listing")
    [ "$got" = "$2" ] || { echo "scheduler $got, not $2:"; echo "$listing"; return 1; }
}
scale_echo() {
    kubectl scale deployment echo --replicas="$1"
    kubectl rollout status deployment echo --timeout=180s
}

step "create the cluster $cluster (kubeProxyMode: none)"
kind create cluster --name "$cluster" --config "$here/kind-config.yaml" --kubeconfig "$KUBECONFIG"

step "build $image and load it into the cluster"
docker build -t "$image" "$repo"
kind load docker-image "$image" --name "$cluster"

step "deploy ipvsproxy and wait for it, the nodes and the cluster DNS"
kubectl apply -k "$here"
kubectl -n kube-system rollout status daemonset ipvsproxy --timeout=300s
kubectl wait --for=condition=Ready nodes --all --timeout=300s
# CoreDNS reaches the API server through the `kubernetes` Service: ready only through ipvsproxy.
kubectl -n kube-system rollout status deployment coredns --timeout=300s
proxy=$(kubectl -n kube-system get pods -l app.kubernetes.io/name=ipvsproxy \
    --field-selector "spec.nodeName=$worker" -o name)
[ -n "$proxy" ] || { echo "kind-e2e: no ipvsproxy pod on $worker" >&2; exit 1; }

step "deploy the workload"
kubectl apply -f "$here/workload.yaml"
kubectl rollout status deployment echo --timeout=300s
kubectl wait --for=condition=Ready pod/client --timeout=300s

step "ClusterIP, NodePort and externalIP, from a pod and from a node"
cluster_ip=$(svc_ip echo)
node_ip=$(kubectl get node "$worker" -o jsonpath='{.status.addresses[?(@.type=="InternalIP")].address}')
node_port=$(kubectl get service echo-nodeport -o jsonpath='{.spec.ports[0].nodePort}')
external_ip=$(kubectl get service echo-external -o jsonpath='{.spec.externalIPs[0]}')
for target in "$cluster_ip:80" "$node_ip:$node_port" "$external_ip:80"; do
    retry 60 answers_echo from_pod "$target"
    retry 60 answers_echo from_node "$target"
done
# The cluster DNS, a UDP ClusterIP.
retry 60 kubectl exec client -- nslookup echo.default.svc.cluster.local

step "session affinity: one client, one pod"
affinity_ip=$(svc_ip echo-affinity)
retry 60 answers_echo from_pod "$affinity_ip:80"
answers=$(for _ in 1 2 3 4 5 6 7 8 9 10; do from_pod "$affinity_ip:80"; echo; done)
echo "$answers"
[ "$(distinct_lines <<<"$answers")" -eq 1 ] || { echo "kind-e2e: affinity broken" >&2; exit 1; }
persistence=$(ls_service "$affinity_ip:80" | ipvs_persistence)
[ "$persistence" = 10800 ] || { echo "kind-e2e: persistence '$persistence', not 10800" >&2; exit 1; }
# Without affinity, the same client meets more than one pod (rr).
answers=$(for _ in 1 2 3 4 5 6; do from_pod "$cluster_ip:80"; echo; done)
echo "$answers"
[ "$(distinct_lines <<<"$answers")" -gt 1 ] || { echo "kind-e2e: no round robin" >&2; exit 1; }

step "scaling the Deployment changes the real servers"
retry 60 expect_real_servers "$cluster_ip:80" 3
scale_echo 5
retry 60 expect_real_servers "$cluster_ip:80" 5
scale_echo 2
retry 60 expect_real_servers "$cluster_ip:80" 2
ls_service "$cluster_ip:80"

step "per-service scheduler: the ipvsproxy.io/scheduler annotation"
retry 60 expect_scheduler "$cluster_ip:80" rr
sh_ip=$(svc_ip echo-sh)
retry 60 expect_scheduler "$sh_ip:80" sh
kubectl annotate service echo-sh ipvsproxy.io/scheduler=wrr --overwrite
retry 60 expect_scheduler "$sh_ip:80" wrr
ls_service "$sh_ip:80"

step "kind-e2e: all checks passed"
