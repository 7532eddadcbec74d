#!/usr/bin/env bash
# Pods and an outside client as network namespaces, for `make demo` and the traffic tests.
# Runs inside the lab guest (root).
#
#   pods.sh up POD...   pods on bridge ipvsp-br0 (10.244.1.1/24, this node's pod CIDR): the Nth
#                       pod gets 10.244.1.(10+N). Each serves HTTP on 8080 (/ says its name,
#                       /cgi-bin/who says its name and the client address it sees), UDP on 5353
#                       (answers its name) and a TCP echo on 9000. The namespace "client" is
#                       outside the cluster: 192.168.1.100, routed via the node's 192.168.1.10.
#   pods.sh down        remove them all.
set -euo pipefail
BR=ipvsp-br0
EXT=ipvsp-ext
RUN=/run/ipvsp-pods

down() {
  for ns in $(ip netns list | awk '{print $1}'); do
    if [ -f "$RUN/$ns.pod" ] || [ "$ns" = client ]; then
      ip netns pids "$ns" 2>/dev/null | xargs -r kill 2>/dev/null || true
      ip netns del "$ns"
    fi
  done
  ip link del "$BR" 2>/dev/null || true
  ip link del "$EXT" 2>/dev/null || true
  rm -rf "$RUN"
}

serve() {  # serve NAME: the pod's servers, started inside its namespace
  local name=$1 www="$RUN/$1/www"
  mkdir -p "$www/cgi-bin"
  echo "$name" >"$www/index.html"
  # shellcheck disable=SC2016  # $REMOTE_ADDR is for the CGI script, set by httpd
  printf '#!/bin/sh\nprintf "Content-Type: text/plain\\r\\n\\r\\n%%s %%s\\n" %s "$REMOTE_ADDR"\n' \
    "$name" >"$www/cgi-bin/who"
  chmod +x "$www/cgi-bin/who"
  ip netns exec "$name" busybox httpd -p 8080 -h "$www"
  ip netns exec "$name" setsid socat UDP-RECVFROM:5353,fork SYSTEM:"echo $name" \
    </dev/null >/dev/null 2>&1 &
  ip netns exec "$name" setsid socat TCP-LISTEN:9000,fork,reuseaddr EXEC:cat \
    </dev/null >/dev/null 2>&1 &
}

up() {
  modprobe br_netfilter
  # Pods on one bridge reach each other's service replies only through the host's netfilter
  # (kube-proxy's documented requirement, as on every bridge CNI).
  sysctl -qw net.bridge.bridge-nf-call-iptables=1 net.ipv4.ip_forward=1
  mkdir -p "$RUN"
  ip link add "$BR" type bridge
  ip addr add 10.244.1.1/24 dev "$BR"
  ip link set "$BR" up
  local n=10
  for name in "$@"; do
    n=$((n + 1))
    touch "$RUN/$name.pod"
    ip netns add "$name"
    ip link add "v-$name" type veth peer name eth0 netns "$name"
    ip link set "v-$name" master "$BR" up
    # A pod reaching itself through a service: after the un-NAT of the reply the bridge sends
    # it back out the port it came in on (br_netfilter), as CNI bridge's hairpinMode allows.
    ip link set "v-$name" type bridge_slave hairpin on
    ip -n "$name" addr add "10.244.1.$n/24" dev eth0
    ip -n "$name" link set lo up
    ip -n "$name" link set eth0 up
    ip -n "$name" route add default via 10.244.1.1
    serve "$name"
  done
  ip netns add client
  ip link add "$EXT" type veth peer name eth0 netns client
  ip addr add 192.168.1.10/24 dev "$EXT"
  ip link set "$EXT" up
  ip -n client addr add 192.168.1.100/24 dev eth0
  ip -n client link set lo up
  ip -n client link set eth0 up
  ip -n client route add default via 192.168.1.10
  # wait until every pod answers on its own address
  n=10
  for name in "$@"; do
    n=$((n + 1))
    for _ in $(seq 50); do
      curl -s -m 1 "http://10.244.1.$n:8080/" >/dev/null && break
      sleep 0.2
    done
  done
}

case "${1:-}" in
  up) shift; down; up "$@" ;;
  down) down ;;
  *) echo "usage: $0 up POD... | down" >&2; exit 2 ;;
esac
