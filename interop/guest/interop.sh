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
while read -r name port prog all; do
    case "$name" in '#'* | '') continue ;; esac
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
# What the kernel said (rdma_rxe warns there of what it drops).
dmesg | tail -n 40
exit $failed
