#!/usr/bin/env bash
# The logic of e2e.sh that needs no cluster, as small functions (sourced by e2e.sh, exercised by
# tests/unit/test_deploy_scripts.py). The ipvs_* functions read an ipvsadm -Ln listing on stdin,
# as `ipvsproxy ls -Ln -t VIP:PORT` prints it:
#
#   Prot LocalAddress:Port Scheduler Flags
#     -> RemoteAddress:Port           Forward Weight ActiveConn InActConn
#   TCP  10.96.0.10:80 rr persistent 10800
#     -> 10.244.1.2:8080              Masq    1      0          0

# ADDRESS:PORT of each real server that takes new connections (weight above 0; a removed one
# drains at weight 0 while it has connections), one a line.
ipvs_real_servers() {
    awk '$1 == "->" && $2 != "RemoteAddress:Port" && $4 > 0 { print $2 }'
}

# How many real servers take new connections.
ipvs_count_real_servers() {
    ipvs_real_servers | awk 'END { print NR }'
}

# The scheduler of the first virtual server (service lines: TCP/UDP/SCTP ADDR:PORT SCHED ...,
# FWM MARK SCHED ... or FWM MARK IPv6 SCHED ...).
ipvs_scheduler() {
    awk '$1 ~ /^(TCP|UDP|SCTP|FWM)$/ { print ($3 == "IPv6" ? $4 : $3); exit }'
}

# The persistence timeout in seconds of the first virtual server; nothing when it has none.
ipvs_persistence() {
    awk '$1 ~ /^(TCP|UDP|SCTP|FWM)$/ {
        for (i = 3; i < NF; i++) if ($i == "persistent") { print $(i + 1); break }
        exit
    }'
}

# How many different non-empty lines stdin has.
distinct_lines() {
    awk 'NF && !seen[$0]++ { n++ } END { print n + 0 }'
}

# retry SECONDS COMMAND...: run COMMAND (a program or a function) every RETRY_INTERVAL seconds
# (default 1) until it succeeds, and print its output; after SECONDS, fail with its last output.
retry() {
    local deadline=$((SECONDS + $1)) out
    shift
    until out=$("$@" 2>&1); do
        if [ "$SECONDS" -ge "$deadline" ]; then
            printf 'gave up on: %s\n%s\n' "$*" "$out" >&2
            return 1
        fi
        sleep "${RETRY_INTERVAL:-1}"
    done
    if [ -n "$out" ]; then
        printf '%s\n' "$out"
    fi
}
