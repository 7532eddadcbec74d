#!/usr/bin/env bash
# The demo, run inside the lab guest: show that this kernel has a working IPVS.
set -euo pipefail
echo "== kernel: $(uname -r) (host: ${HOST_KERNEL_RELEASE:-?})"
modprobe -a ip_vs ip_vs_rr ip_vs_wrr ip_vs_sh
echo "== IPVS in this kernel:"
ipvsadm -Ln
echo "== a virtual server with two real servers, programmed and listed:"
ipvsadm -A -t 10.96.0.10:80 -s rr
ipvsadm -a -t 10.96.0.10:80 -r 10.244.0.5:8080 -m
ipvsadm -a -t 10.96.0.10:80 -r 10.244.0.6:8080 -m
ipvsadm -Ln
ipvsadm -C
