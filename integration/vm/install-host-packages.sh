#!/usr/bin/env bash
# Installs the Debian packages the project needs on the host (and so in the lab guest, which
# shares the host's filesystem). Idempotent: does nothing when every tool is already present.
set -euo pipefail

# tool -> package
declare -A NEED=(
  [qemu-system-x86_64]=qemu-system-x86
  [modprobe]=kmod
  [depmod]=kmod
  [ipvsadm]=ipvsadm
  [ipset]=ipset
  [iptables]=iptables
  [ip]=iproute2
  [busybox]=busybox-static
  [shellcheck]=shellcheck
  [conntrack]=conntrack
  # kube-proxy --proxy-mode=nftables runs nft (the side-by-side bench, bench/peers.py)
  [nft]=nftables
  [socat]=socat
  [curl]=curl
  # tests/unit/test_deploy.py renders deploy/ with `kubectl kustomize`
  [kubectl]=kubernetes-client
  # the e2e node (integration/node/): images built without Docker, a base made here, and the
  # node's runtime (the lab guest runs the host's binaries)
  [buildah]=buildah
  [debootstrap]=debootstrap
  [containerd]=containerd
  [runc]=runc
  [mkfs.ext4]=e2fsprogs
  [openssl]=openssl
)
missing=()
for tool in "${!NEED[@]}"; do
  command -v "$tool" >/dev/null 2>&1 || missing+=("${NEED[$tool]}")
done
# The CNI plugins are no commands on PATH.
[ -x /usr/lib/cni/bridge ] && [ -x /usr/lib/cni/host-local ] || missing+=(containernetworking-plugins)
if [ "${#missing[@]}" -eq 0 ]; then
  exit 0
fi
if [ "$(id -u)" -ne 0 ]; then
  echo "install-host-packages: need root to install: ${missing[*]}" >&2
  exit 1
fi
mapfile -t pkgs < <(printf '%s\n' "${missing[@]}" | sort -u)
echo "install-host-packages: installing ${pkgs[*]}"
apt-get update -qq
DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${pkgs[@]}" >/dev/null
