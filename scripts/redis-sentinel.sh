#!/usr/bin/env bash
# A throwaway Redis primary, one replica and one Sentinel on loopback, for the tests of the Redis
# store through Sentinel: no persistence, files in DIR, the primary named `backstop`. Ports
# FIRST_PORT (primary), FIRST_PORT+1 (replica) and FIRST_PORT+2 (Sentinel). Prints the Sentinel's
# URL to export as BACKSTOP_REDIS_SENTINEL_URLS on its last line.
#
#   scripts/redis-sentinel.sh start DIR [FIRST_PORT]   # default 7100
#   scripts/redis-sentinel.sh stop DIR [FIRST_PORT]
#
# Needs redis-server, redis-sentinel and redis-cli (Debian's redis-server, redis-sentinel and
# redis-tools).
set -euo pipefail

cmd=${1:?usage: $0 start|stop DIR [FIRST_PORT]}
dir=${2:?usage: $0 start|stop DIR [FIRST_PORT]}
first=${3:-7100}
primary=$first
replica=$((first + 1))
sentinel=$((first + 2))

# Waits up to 10 s until `redis-cli -p PORT ARGS…` prints something that holds WANT.
wait_for() {
    local port=$1 want=$2
    shift 2
    for _ in $(seq 1 100); do
        redis-cli -h 127.0.0.1 -p "$port" "$@" 2>/dev/null | grep -q "$want" && return 0
        sleep 0.1
    done
    echo "redis on port $port: '$*' never showed '$want' (see $dir)" >&2
    return 1
}

case "$cmd" in
start)
    mkdir -p "$dir/primary" "$dir/replica"
    redis-server --port "$primary" --bind 127.0.0.1 --dir "$dir/primary" --save '' \
        --appendonly no --daemonize yes --logfile "$dir/primary/log" --pidfile "$dir/primary/pid"
    wait_for "$primary" PONG ping
    redis-server --port "$replica" --bind 127.0.0.1 --dir "$dir/replica" --save '' \
        --appendonly no --daemonize yes --logfile "$dir/replica/log" --pidfile "$dir/replica/pid" \
        --replicaof 127.0.0.1 "$primary"
    wait_for "$replica" master_link_status:up info replication
    cat >"$dir/sentinel.conf" <<CONF
port $sentinel
bind 127.0.0.1
dir $dir
daemonize yes
logfile $dir/sentinel.log
pidfile $dir/sentinel.pid
sentinel monitor backstop 127.0.0.1 $primary 1
sentinel down-after-milliseconds backstop 2000
sentinel failover-timeout backstop 10000
CONF
    redis-sentinel "$dir/sentinel.conf"
    # Usable once the Sentinel knows the primary and has found the replica.
    wait_for "$sentinel" "$replica" sentinel replicas backstop
    echo "redis://127.0.0.1:$sentinel"
    ;;
stop)
    for port in "$sentinel" "$replica" "$primary"; do
        redis-cli -h 127.0.0.1 -p "$port" shutdown nosave >/dev/null 2>&1 || true
    done
    ;;
*)
    echo "usage: $0 start|stop DIR [FIRST_PORT]" >&2
    exit 2
    ;;
esac
