#!/bin/sh
# In the rxe VM (busybox sh): rdma_rxe on eth0 (10.88.0.2), a virtio NIC on
# the host's tap, against rnic on the host side (10.88.0.1). ibv_rc_pingpong
# runs as the client of rnic's server, then as the server of rnic's client,
# first against `rnic pingpong`, then (with -c, the data checked) against
# ibv_rc_pingpong itself on rnic's drop-in libibverbs. Writes a line
# "NAME RC" per run to /mnt/host/out/results.
ip=/usr/sbin/ip
out=/mnt/host/out
mkdir -p $out
exec >$out/pingpong.log 2>&1
set -x
sysctl -w net.ipv6.conf.all.disable_ipv6=1 net.ipv6.conf.default.disable_ipv6=1
$ip link set eth0 mtu 1500 up
$ip addr add 10.88.0.2/24 dev eth0
ping -c 1 -W 5 10.88.0.1 || exit 2
rdma link add rxe0 type rxe netdev eth0 || exit 2
gid=$(for g in /sys/class/infiniband/rxe0/ports/1/gids/*; do
    case "$(cat "$g")" in 0000:0000:0000:0000:0000:ffff:*) echo "${g##*/}"; break ;; esac
done)
[ -n "$gid" ] || exit 2
iters=$(cat /mnt/host/iters)
: >$out/results
failed=0
# run NAME ARGS...: ibv_rc_pingpong on rxe0, its result in the results.
run() {
    name=$1
    shift
    timeout 60 ibv_rc_pingpong -d rxe0 -g "$gid" -n "$iters" -s 4096 "$@" >$out/$name.txt 2>&1
    rc=$?
    echo "$name $rc" >>$out/results
    [ $rc = 0 ] || failed=1
}
run rxe_client 10.88.0.1
run rxe_server
# The host's next server starts when its client is done: give it time.
sleep 3
run rxe_client_c -c 10.88.0.1
run rxe_server_c -c
for f in /sys/class/infiniband/rxe0/ports/1/hw_counters/*; do
    echo "${f##*/}=$(cat "$f")"
done
exit $failed
