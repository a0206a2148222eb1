#!/bin/sh
# In the rxe VM (busybox sh): rdma_rxe on eth0 (10.88.0.2), a virtio NIC on
# the host's tap, against rnic on the host side (10.88.0.1): first
# ibv_rc_pingpong as the client of rnic's server, then as the server of
# rnic's client. Writes a line "NAME RC" per run to /mnt/host/out/results.
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
timeout 60 ibv_rc_pingpong -d rxe0 -g "$gid" -n "$iters" -s 4096 10.88.0.1 >$out/rxe_client.txt 2>&1
echo "rxe_client $?" >>$out/results
timeout 60 ibv_rc_pingpong -d rxe0 -g "$gid" -n "$iters" -s 4096 >$out/rxe_server.txt 2>&1
echo "rxe_server $?" >>$out/results
for f in /sys/class/infiniband/rxe0/ports/1/hw_counters/*; do
    echo "${f##*/}=$(cat "$f")"
done
