#!/usr/bin/env bash
# A throwaway Redis Cluster on loopback for the Redis Cluster tests: three masters, no replicas,
# no persistence, each node's files in DIR. Prints the URLs to export as
# BACKSTOP_REDIS_CLUSTER_URLS (comma-separated) on its last line.
#
#   scripts/redis-cluster.sh start DIR [FIRST_PORT]   # ports FIRST_PORT..FIRST_PORT+2 (default 7000)
#   scripts/redis-cluster.sh stop DIR
#
# Needs redis-server and redis-cli (Debian's redis-server and redis-tools).
set -euo pipefail

cmd=${1:?usage: $0 start|stop DIR [FIRST_PORT]}
dir=${2:?usage: $0 start|stop DIR [FIRST_PORT]}
first=${3:-7000}
ports=("$first" "$((first + 1))" "$((first + 2))")

case "$cmd" in
start)
    mkdir -p "$dir"
    for port in "${ports[@]}"; do
        mkdir -p "$dir/$port"
        redis-server --port "$port" --bind 127.0.0.1 --cluster-enabled yes \
            --cluster-config-file "$dir/$port/nodes.conf" --dir "$dir/$port" \
            --save '' --appendonly no --daemonize yes --logfile "$dir/$port/log" \
            --pidfile "$dir/$port/pid"
    done
    for port in "${ports[@]}"; do
        for _ in $(seq 1 50); do
            redis-cli -h 127.0.0.1 -p "$port" ping 2>/dev/null | grep -q PONG && break
            sleep 0.1
        done
        redis-cli -h 127.0.0.1 -p "$port" ping | grep -q PONG ||
            { echo "redis-server on port $port did not start (see $dir/$port/log)" >&2; exit 1; }
    done
    redis-cli --cluster create "${ports[@]/#/127.0.0.1:}" --cluster-replicas 0 --cluster-yes \
        >"$dir/create.log"
    # The cluster is usable once every node agrees that every slot is served.
    for port in "${ports[@]}"; do
        for _ in $(seq 1 100); do
            redis-cli -h 127.0.0.1 -p "$port" cluster info | grep -q 'cluster_state:ok' && break
            sleep 0.1
        done
        redis-cli -h 127.0.0.1 -p "$port" cluster info | grep -q 'cluster_state:ok' ||
            { echo "the cluster is not ok on port $port (see $dir/create.log)" >&2; exit 1; }
    done
    urls=("${ports[@]/#/redis://127.0.0.1:}")
    (IFS=,; echo "${urls[*]}")
    ;;
stop)
    for port in "${ports[@]}"; do
        redis-cli -h 127.0.0.1 -p "$port" shutdown nosave >/dev/null 2>&1 || true
    done
    ;;
*)
    echo "usage: $0 start|stop DIR [FIRST_PORT]" >&2
    exit 2
    ;;
esac
