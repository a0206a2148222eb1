#!/bin/sh
# In the rxe VM (busybox sh): rdma_rxe on eth0 (10.88.0.2), a virtio NIC on
# the host's tap, against rnic on the host side (10.88.0.1). Runs the cases
# in /mnt/host/cases (see interop/cases) in order, each twice: as the client
# of rnic's server, then as the server of rnic's client. Writes a line
# "NAME.SERVER RC" per run to /mnt/host/out/results. /mnt/host/mtu is the
# link's MTU; /mnt/host/netem, if not empty, a netem impairment for both
# directions.
ip=/usr/sbin/ip
tc=/usr/sbin/tc
out=/mnt/host/out
mkdir -p $out
exec >$out/guest.log 2>&1
set -x
. /mnt/host/tap-rxe.sh
. /mnt/host/cm.sh
tap_up "$(cat /mnt/host/mtu)" || exit 2
# Impairment, both ways, if asked: netem on eth0 for what rxe sends, and on
# an ifb device that eth0's ingress is redirected through for what it
# receives.
if [ -s /mnt/host/netem ]; then
    netem=$(cat /mnt/host/netem)
    # shellcheck disable=SC2086
    $tc qdisc add dev eth0 root netem $netem || exit 2
    # (loading ifb made ifb0 already)
    $ip link show ifb0 >/dev/null 2>&1 || $ip link add ifb0 type ifb || exit 2
    $ip link set ifb0 up
    $tc qdisc add dev eth0 handle ffff: ingress || exit 2
    $tc filter add dev eth0 parent ffff: matchall action mirred egress redirect dev ifb0 || exit 2
    # shellcheck disable=SC2086
    $tc qdisc add dev ifb0 root netem $netem || exit 2
    $tc qdisc show
fi
rxe_on_eth0 || exit 2
rdma_cm_device
grep . /sys/class/infiniband/rxe0/ports/1/gids/* | grep -v ':0000:0000:0000:0000:0000:0000:0000:0000$'
: >$out/results
failed=0
# attempt NAME ARGS...: one program on rxe0, its exit status in $rc.
attempt() {
    local run=$1
    shift
    timeout 120 "$@" </dev/null >"$out/$run.rxe.txt" 2>&1
    rc=$?
}
record() { # NAME: $rc in the results
    echo "$1 $rc" >>$out/results
    [ "$rc" = 0 ] || failed=1
}
run() { # NAME ARGS...
    attempt "$@"
    record "$1"
}
# client NAME ARGS...: run, tried again (for at most 90 s) while rnic's
# server is not listening yet.
client() {
    for _ in $(seq 90); do
        attempt "$@"
        [ "$rc" != 0 ] && grep -qiE "connect to|socket connection|connection refused" "$out/$1.rxe.txt" || break
        sleep 1
    done
    record "$1"
}
# wait_for FILE: wait (at most 200 s) until the host has made FILE.
wait_for() {
    for _ in $(seq 400); do
        [ -e "$1" ] && return
        sleep 0.5
    done
}
# cm_run NAME CASE-PORT PROG ARGS...: a run through rdma_cm, both ways (see
# cm_run in interop/rxe-interop).
cm_run() {
    name=$1 port=$2 prog=$3 self=10.88.0.2 peer=10.88.0.1 one_way= rest=
    shift 3
    for a in "$@"; do
        if [ "$a" = only:rnic-server ]; then one_way=1; else rest="$rest $a"; fi
    done
    # shellcheck disable=SC2086
    set -- $rest
    case "$name" in *_v6) self=fd88::2 peer=fd88::1 ;; esac
    if [ "$prog" = refused ]; then
        # No server on the port on either side: each client must be
        # refused (REJ 8); rnic's side has its NIC open meanwhile.
        wait_for "$out/$name.rnic-server.listening"
        # shellcheck disable=SC2046
        attempt "$name.rnic-server" $(cm_cmd client $self $peer "$port" refused)
        rc=1
        cm_refused "$out/$name.rnic-server.rxe.txt" && rc=0
        record "$name.rnic-server"
        echo "$name.rxe-server 0" >>"$out/results"
        return
    fi
    wait_for "$out/$name.rnic-server.listening"
    # shellcheck disable=SC2046
    run "$name.rnic-server" $(cm_cmd client $self $peer "$port" "$prog" "$@")
    [ -n "$one_way" ] && return
    # shellcheck disable=SC2046
    timeout 120 $(cm_cmd server $self $peer $((port + 1)) "$prog" "$@") \
        </dev/null >"$out/$name.rxe-server.rxe.txt" 2>&1 &
    pid=$!
    lport=$(cm_port "$prog" $((port + 1)))
    for _ in $(seq 200); do
        cm_listening "$lport" && break
        kill -0 $pid 2>/dev/null || break
        sleep 0.1
    done
    rdma res show cm_id
    : >"$out/$name.rxe-server.listening"
    wait $pid
    rc=$?
    record "$name.rxe-server"
}
while read -r name port prog all; do
    case "$name" in '#'* | '') continue ;; esac
    # shellcheck disable=SC2086
    if cm_case "$prog" $all; then
        # shellcheck disable=SC2086
        cm_run "$name" "$port" "$prog" $all
        continue
    fi
    # (an argument "rnic:ARG" is for rnic's side only)
    args=
    for a in $all; do
        case "$a" in rnic:*) ;; *) args="$args $a" ;; esac
    done
    # (a case named *_v6 runs on the IPv6 GIDs)
    g=$gid4
    case "$name" in *_v6) g=$gid6 ;; esac
    case "$prog" in
    pingpong) cmd="ibv_rc_pingpong -d rxe0 -g $g" ;;
    wire-checks) cmd="/mnt/host/wire-checks -d rxe0 -g $g" ;;
    ibv_*) cmd="$prog -d rxe0 -g $g" ;;
    *) cmd="$prog -d rxe0 -x $g" ;;
    esac
    # shellcheck disable=SC2086
    client "$name.rnic-server" $cmd $args -p "$port" 10.88.0.1
    # shellcheck disable=SC2086
    run "$name.rxe-server" $cmd $args -p $((port + 1))
done </mnt/host/cases
$tc -s qdisc show 2>/dev/null
for f in /sys/class/infiniband/rxe0/ports/1/hw_counters/*; do
    echo "${f##*/}=$(cat "$f")"
done
# ib_cm's own MAD counters (sent, received, retried, duplicates), where any.
for f in /sys/class/infiniband_cm/rxe0/1/*/*; do
    [ -f "$f" ] && [ "$(cat "$f")" != 0 ] && echo "${f#/sys/class/infiniband_cm/rxe0/1/}=$(cat "$f")"
done
# What the kernel said (rdma_rxe warns there of what it drops).
dmesg | tail -n 40
exit $failed
