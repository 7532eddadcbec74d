#!/usr/bin/env bash
# The e2e node, at each boot of the lab guest (integration/node/cluster.py, Node.boot):
#   guest.sh FILES OUT PYTHON CHECKOUT
# FILES (shared with the host) holds node.env, the kubelet's kubeconfig, the CA of the API
# server's client certificate and `images` (the names the disk must hold); OUT gets this
# boot's logs.
# It brings up the NIC on the host's tap, mounts the node's disk (/dev/vda, kept across boots),
# starts containerd (Debian's, CRI, runc, cgroup v2, the CNI bridge and host-local plugins),
# checks the images are there, starts the kubelet, and serves the agent
# (agent.py) until the host asks it to shut down; then it stops everything as a reboot would.
set -euo pipefail
files=$1 out=$2 py=$3 checkout=$4
exec >>"$out/guest.log" 2>&1
# shellcheck source=/dev/null
source "$files/node.env"
log() { echo "$(date +%T.%N | cut -c1-12) $*"; }
log "boot: kernel $(uname -r)"

# What a reboot left of the kernel's state: nothing (no module, no link, no rule).
{
    echo "ip_vs module: $(grep -c '^ip_vs ' /proc/modules || true)"
    echo "kube-ipvs0: $(ip -o link show kube-ipvs0 2>/dev/null | wc -l)"
    echo "KUBE chains (nft): $(iptables-nft-save 2>/dev/null | grep -c '^:KUBE-' || true)"
} >"$out/kernel-at-boot.txt"

modprobe -a virtio_net virtio_blk overlay br_netfilter
hostname "$NODE_NAME"
mkdir -p /var/lib/node
for _ in $(seq 50); do [ -b /dev/vda ] && break; sleep 0.1; done
mount /dev/vda /var/lib/node

nic=""
for _ in $(seq 50); do
    for dev in /sys/class/net/*; do
        if [ "$(cat "$dev/address")" = "$NODE_MAC" ]; then nic=$(basename "$dev"); fi
    done
    [ -n "$nic" ] && break
    sleep 0.1
done
[ -n "$nic" ] || { log "no NIC with $NODE_MAC"; exit 1; }
ip addr add "$NODE_IP/$PREFIX" dev "$nic"
ip link set "$nic" up
ip route add default via "$HOST_IP"
# Bridged pod traffic through iptables, as kubeadm's preflight requires of every node.
sysctl -qw net.bridge.bridge-nf-call-iptables=1 net.bridge.bridge-nf-call-ip6tables=1
# The node's name resolves to its address (the guest's /etc/hosts is a throwaway copy).
echo "$NODE_IP $NODE_NAME" >>/etc/hosts

# containerd: state on the disk, runc with cgroupfs (no systemd in the guest), CNI from
# Debian's containernetworking-plugins, the sandbox image built here.
mkdir -p /etc/containerd /etc/cni/net.d /var/lib/node/containerd /var/lib/node/kubelet \
    /var/lib/node/pod-logs /run/containerd
cat >/etc/containerd/config.toml <<EOF
version = 2
root = "/var/lib/node/containerd"
state = "/run/containerd"
[plugins."io.containerd.grpc.v1.cri"]
  sandbox_image = "localhost/ipvsproxy-e2e/pause:1"
  [plugins."io.containerd.grpc.v1.cri".containerd]
    snapshotter = "overlayfs"
    default_runtime_name = "runc"
    [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc]
      runtime_type = "io.containerd.runc.v2"
      [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc.options]
        SystemdCgroup = false
  [plugins."io.containerd.grpc.v1.cri".cni]
    bin_dir = "/usr/lib/cni"
    conf_dir = "/etc/cni/net.d"
EOF
cat >/etc/cni/net.d/10-e2e.conflist <<EOF
{
  "cniVersion": "0.4.0",
  "name": "e2e",
  "plugins": [
    {"type": "bridge", "bridge": "cni0", "isGateway": true, "ipMasq": true,
     "hairpinMode": true,
     "ipam": {"type": "host-local", "ranges": [[{"subnet": "$POD_CIDR"}]],
              "routes": [{"dst": "0.0.0.0/0"}],
              "dataDir": "/var/lib/node/cni"}},
    {"type": "portmap", "capabilities": {"portMappings": true}}
  ]
}
EOF
containerd --config /etc/containerd/config.toml >"$out/containerd.log" 2>&1 &
containerd_pid=$!
for _ in $(seq 300); do ctr version >/dev/null 2>&1 && break; sleep 0.2; done
log "containerd up"
# The images came on the disk (cluster.py, Node.prepare_disk): nothing is pulled or imported.
have=$(ctr -n k8s.io images ls -q)
while read -r name; do
    grep -qxF "$name" <<<"$have" || { log "the disk lacks the image $name"; exit 1; }
done <"$files/images"
log "images: $(wc -l <"$files/images") on the disk"

cat >/var/lib/node/kubelet-config.yaml <<EOF
apiVersion: kubelet.config.k8s.io/v1beta1
kind: KubeletConfiguration
authentication:
  anonymous: {enabled: false}
  webhook: {enabled: true}
  x509: {clientCAFile: $files/kubelet-client-ca.crt}
authorization: {mode: Webhook}
cgroupDriver: cgroupfs
containerRuntimeEndpoint: unix:///run/containerd/containerd.sock
failSwapOn: false
readOnlyPort: 0
podLogsDir: /var/lib/node/pod-logs
# A small disk and memory: no eviction or image GC on their account.
evictionHard: {memory.available: "20Mi", nodefs.available: "1%", imagefs.available: "1%",
               nodefs.inodesFree: "1%"}
imageGCHighThresholdPercent: 100
imageGCLowThresholdPercent: 99
serializeImagePulls: false
maxPods: 30
EOF
"$KUBELET" --config=/var/lib/node/kubelet-config.yaml --kubeconfig="$files/kubelet.kubeconfig" \
    --hostname-override="$NODE_NAME" --node-ip="$NODE_IP" --root-dir=/var/lib/node/kubelet \
    --v=1 >"$out/kubelet.log" 2>&1 &
kubelet_pid=$!
sleep 3
kill -0 "$kubelet_pid" || { log "the kubelet exited: $(tail -5 "$out/kubelet.log")"; exit 1; }
log "kubelet started"

cd "$checkout"
"$py" -m integration.node.agent --listen "$NODE_IP:$AGENT_PORT" || log "agent exit $?"

# Shut down as a reboot does: the kubelet, every container, containerd; the disk unmounted.
log "shutdown"
kill "$kubelet_pid" 2>/dev/null || true
wait "$kubelet_pid" 2>/dev/null || true
for task in $(ctr -n k8s.io tasks ls -q 2>/dev/null); do
    ctr -n k8s.io tasks kill -s SIGKILL "$task" 2>/dev/null || true
done
sleep 2
kill "$containerd_pid" 2>/dev/null || true
wait "$containerd_pid" 2>/dev/null || true
sync
grep ' /var/lib/node' /proc/mounts | awk '{print $2}' | sort -r | while read -r m; do
    umount "$m" 2>/dev/null || umount -l "$m" 2>/dev/null || true
done
sync
log "down"
