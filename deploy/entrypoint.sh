#!/bin/sh
# The image's entrypoint (/usr/local/bin/ipvsproxy-entrypoint): select the iptables backend the
# node uses, then run the command given (the image passes `ipvsproxy ARGS...`).
#
# A node's iptables rules live behind one of two kernel interfaces, legacy xtables or nf_tables,
# and the image has both tools (iptables-legacy and iptables-nft). Rules written through the other
# one would be a second rule set beside the node's, invisible to its tools. kube-proxy's image
# decides with kubernetes-sigs/iptables-wrappers; this is the same decision, made once at start:
# kubelet (1.17 and later) creates the chain KUBE-IPTABLES-HINT or KUBE-KUBELET-CANARY in the
# mangle table through the backend the node uses, so the backend is
#   1. nft, when iptables-nft-save or ip6tables-nft-save shows one of them in mangle;
#   2. else legacy, when iptables-legacy-save or ip6tables-legacy-save shows one (their whole
#      output: asking the legacy tool for the mangle table alone would create that table);
#   3. else nft, the default of current distributions.
# IPTABLES_MODE=nft or IPTABLES_MODE=legacy skips the detection. The choice is made with Debian's
# update-alternatives, so iptables, iptables-save, iptables-restore and the ip6tables ones all
# follow it, for ipvsproxy and for an operator's `kubectl exec ... iptables-save` alike.
# IPTABLES_SBIN (default /usr/sbin) is where the tools are; the unit tests point it elsewhere.
#
# What it says goes to stderr as one JSON object a line, as ipvsproxy's own log does when not on
# a terminal (structlog: event, level, timestamp), so the pod's log is JSON lines from its first
# line and a log shipper parses every one.
set -eu

sbin=${IPTABLES_SBIN:-/usr/sbin}

# log LEVEL EVENT [KEY VALUE]...: one JSON line on stderr.
log() {
    level=$1 event=$2
    shift 2
    line="{\"event\": \"$(json "$event")\""
    while [ "$#" -ge 2 ]; do
        line="$line, \"$1\": \"$(json "$2")\""
        shift 2
    done
    printf '%s, "logger": "ipvsproxy-entrypoint", "level": "%s", "timestamp": "%s"}\n' \
        "$line" "$level" "$(date -u +%Y-%m-%dT%H:%M:%S.%6NZ)" >&2
}

# A JSON string's contents: backslashes and quotes escaped, control characters as spaces.
json() {
    printf '%s' "$1" | tr '\n\r\t' '   ' | sed 's/\\/\\\\/g; s/"/\\"/g'
}

has_kubelet_chain() {
    grep -Eq '^:(KUBE-IPTABLES-HINT|KUBE-KUBELET-CANARY) '
}

detect_mode() {
    for save in iptables-nft-save ip6tables-nft-save; do
        if "$sbin/$save" -t mangle 2>/dev/null | has_kubelet_chain; then
            echo nft
            return
        fi
    done
    for save in iptables-legacy-save ip6tables-legacy-save; do
        if "$sbin/$save" 2>/dev/null | has_kubelet_chain; then
            echo legacy
            return
        fi
    done
    echo nft
}

mode=${IPTABLES_MODE:-auto}
case "$mode" in
    auto) mode=$(detect_mode); how=detected ;;
    nft | legacy) how="from IPTABLES_MODE" ;;
    *)
        log error "IPTABLES_MODE=$mode: expected nft, legacy or auto" IPTABLES_MODE "$mode"
        exit 2
        ;;
esac

# Fail rather than start on the wrong backend: a proxy whose rules the node does not see is worse
# than a crash-looping pod someone will look at.
for tool in iptables ip6tables; do
    if ! out=$(update-alternatives --set "$tool" "$sbin/$tool-$mode" 2>&1); then
        log error "cannot select $tool-$mode: $out" backend "$mode"
        exit 1
    fi
done
log info "iptables backend $mode ($how)" backend "$mode"

exec "$@"
