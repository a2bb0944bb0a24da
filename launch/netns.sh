#!/usr/bin/env bash
# Several "hosts" on one machine: one network namespace per host, each with its own IP on a veth
# whose other end is plugged into a bridge in a switch namespace; optional bandwidth cap (tc tbf)
# and random packet loss (nftables) on every link. Needs root, iproute2, and nftables for LOSS.
#
# One SeedFlood run, rank r on host r (evaluator on host 0), torn down afterwards:
#   RATE=20mbit LOSS=2 launch/netns.sh run launch/configs/debug.yaml [--set section.field=value ...]
# By hand:
#   launch/netns.sh up 5                      # hosts 0..4 at $NETNS_SUBNET.10 .. .14
#   launch/netns.sh exec 3 ping -c1 10.77.0.10
#   launch/netns.sh down
#
# Environment (defaults in brackets):
#   NETNS_PREFIX [sf]        namespaces are PREFIX-sw (bridge) and PREFIX-h0, PREFIX-h1, ...
#   NETNS_SUBNET [10.77.0]   first three octets of the /24 inside the namespaces; host i = .(10+i)
#   RATE []                  tbf rate per link and direction, e.g. 20mbit; empty = no cap
#   BURST [32kbit]           tbf burst
#   LOSS [0]                 percent of packets dropped per link and direction (0.1 resolution)
#   MASTER_PORT [29500]      rendezvous port on host 0 (run)
#   PYTHON [python]          interpreter with seedflood installed (run)
#   SEEDFLOOD_MODULE [seedflood]  module every process runs (run)
# Loss model: a packet from host a to host b crosses link a->switch (dropped with LOSS% in a's
# output hook) and switch->b (LOSS% in b's input hook), like two lossy cables.
set -euo pipefail

NETNS_PREFIX=${NETNS_PREFIX:-sf}
NETNS_SUBNET=${NETNS_SUBNET:-10.77.0}
RATE=${RATE:-}
BURST=${BURST:-32kbit}
LOSS=${LOSS:-0}
MASTER_PORT=${MASTER_PORT:-29500}
PYTHON=${PYTHON:-python}
SEEDFLOOD_MODULE=${SEEDFLOOD_MODULE:-seedflood}

SW=$NETNS_PREFIX-sw
host_ns() { echo "$NETNS_PREFIX-h$1"; }
host_ip() { echo "$NETNS_SUBNET.$((10 + $1))"; }
die() { echo "netns.sh: $*" >&2; exit 2; }

usage() {
    sed -n '2,13p' "$0" | sed 's/^# \{0,1\}//' >&2
    exit 2
}

namespaces() {  # ours, switch last
    ip netns list | awk '{print $1}' | grep -E "^$NETNS_PREFIX-h[0-9]+$" || true
    ip netns list | awk '{print $1}' | grep -Fx "$SW" || true
}

down() {
    local ns
    for ns in $(namespaces); do
        # Deleting a namespace destroys its veth ends; kill what still runs inside first.
        ip netns pids "$ns" 2>/dev/null | xargs -r kill -9 2>/dev/null || true
        ip netns delete "$ns" 2>/dev/null || true
    done
}

up() {
    local hosts=$1 i ns permille
    [[ $hosts =~ ^[1-9][0-9]*$ && $hosts -le 200 ]] || die "up: HOSTS must be 1..200, got '$hosts'"
    [[ ${#NETNS_PREFIX} -le 12 ]] || die "NETNS_PREFIX must be at most 12 characters"
    [[ $LOSS =~ ^[0-9]+(\.[0-9])?$ ]] || die "LOSS must be a percentage like 2 or 0.5, got '$LOSS'"
    permille=$(awk -v l="$LOSS" 'BEGIN { printf "%d", l * 10 + 0.5 }')
    (( permille <= 1000 )) || die "LOSS must be <= 100"
    if (( permille > 0 )); then command -v nft >/dev/null || die "LOSS needs nftables (nft)"; fi
    down
    ip netns add "$SW"
    ip -n "$SW" link set lo up
    ip -n "$SW" link add br0 type bridge
    ip -n "$SW" link set br0 up
    for ((i = 0; i < hosts; i++)); do
        ns=$(host_ns "$i")
        ip netns add "$ns"
        ip -n "$ns" link set lo up
        # The veth is created inside the switch namespace, its peer straight inside the host's.
        ip -n "$SW" link add "p$i" type veth peer name eth0 netns "$ns"
        ip -n "$SW" link set "p$i" master br0 up
        ip -n "$ns" addr add "$(host_ip "$i")/24" dev eth0
        ip -n "$ns" link set eth0 up
        if [[ -n $RATE ]]; then
            tc -n "$ns" qdisc add dev eth0 root tbf rate "$RATE" burst "$BURST" latency 200ms
            tc -n "$SW" qdisc add dev "p$i" root tbf rate "$RATE" burst "$BURST" latency 200ms
        fi
        if (( permille > 0 )); then
            ip netns exec "$ns" nft -f - <<EOF
table inet seedflood_loss {
    chain output { type filter hook output priority 0; policy accept;
        ip daddr $NETNS_SUBNET.0/24 numgen random mod 1000 < $permille counter drop; }
    chain input { type filter hook input priority 0; policy accept;
        ip saddr $NETNS_SUBNET.0/24 numgen random mod 1000 < $permille counter drop; }
}
EOF
        fi
    done
    echo "netns.sh: $hosts hosts $(host_ip 0)..$(host_ip $((hosts - 1))) (rate ${RATE:-uncapped}, loss ${LOSS}% per link)" >&2
}

run() {
    [[ $# -ge 1 && -f $1 ]] || die "run: CONFIG.yaml must be an existing file"
    local config=$1 world r status=0 pid failed=""
    shift
    world=$("$PYTHON" -m "$SEEDFLOOD_MODULE" world-size --config "$config" "$@")
    [[ $world =~ ^[0-9]+$ ]] || die "world-size printed '$world'"
    trap 'jobs -p | xargs -r kill 2>/dev/null || true; down' EXIT
    trap 'exit 130' INT TERM
    up "$world"
    declare -A rank_of=()
    for ((r = 0; r < world; r++)); do
        # One process per host, explicit rendezvous (as compose does); gloo uses the host's eth0.
        ip netns exec "$(host_ns "$r")" env RANK="$r" WORLD_SIZE="$world" LOCAL_RANK=0 \
            LOCAL_WORLD_SIZE=1 MASTER_ADDR="$(host_ip 0)" MASTER_PORT="$MASTER_PORT" \
            GLOO_SOCKET_IFNAME=eth0 \
            "$PYTHON" -m "$SEEDFLOOD_MODULE" train --config "$config" "$@" &
        rank_of[$!]=$r
    done
    # The first failure ends the run: the others would only wait for their timeouts.
    while (( ${#rank_of[@]} > 0 )); do
        status=0
        wait -n -p pid "${!rank_of[@]}" || status=$?
        [[ -n ${pid:-} ]] || break
        if (( status != 0 )); then
            failed="rank ${rank_of[$pid]} exited $status"
            break
        fi
        unset "rank_of[$pid]"
    done
    if [[ -n $failed ]]; then
        echo "netns.sh: $failed; stopping the others" >&2
        return 1
    fi
    echo "netns.sh: all $world ranks finished" >&2
}

cmd=${1:-}
[[ -n $cmd ]] || usage
shift
case $cmd in
    up) [[ $# -eq 1 ]] || usage; up "$1" ;;
    down) down ;;
    exec)
        [[ $# -ge 2 ]] || usage
        ns=$(host_ns "$1"); shift
        exec ip netns exec "$ns" env GLOO_SOCKET_IFNAME=eth0 "$@" ;;
    run) run "$@" ;;
    *) usage ;;
esac
