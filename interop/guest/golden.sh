#!/bin/sh
# In the rxe VM (busybox sh): two rdma_rxe devices on the two ends of a veth
# pair run unmodified rdma-core and perftest programs against each other,
# each under tcpdump. Writes /mnt/host/out/NAME.pcap, NAME.log and a line
# "NAME CLIENT_RC SERVER_RC" per program to /mnt/host/out/results; exits
# non-zero if any program failed.
#
# rdma_rxe (Linux 6.1) works only in the initial network namespace, so both
# devices live there; policy routing sends what one address sends to the
# other over the veth instead of the loopback device.
# iproute2's, not busybox's applet.
ip=/usr/sbin/ip
out=/mnt/host/out
mkdir -p $out
exec >$out/golden.log 2>&1
set -x
sysctl -w net.ipv6.conf.all.disable_ipv6=1 net.ipv6.conf.default.disable_ipv6=1
$ip link add va type veth peer name vb
$ip link set va address 02:00:00:00:00:0a
$ip link set vb address 02:00:00:00:00:0b
$ip addr add 10.77.0.1/24 dev va
$ip addr add 10.77.0.2/24 dev vb
$ip link set va up
$ip link set vb up
for i in all default va vb; do
    sysctl -w net.ipv4.conf.$i.accept_local=1 net.ipv4.conf.$i.rp_filter=0
done
$ip rule add pref 100 to 10.77.0.2 iif lo lookup 100
$ip rule add pref 101 to 10.77.0.1 iif lo lookup 101
$ip route add 10.77.0.2 dev va src 10.77.0.1 table 100
$ip route add 10.77.0.1 dev vb src 10.77.0.2 table 101
$ip rule add pref 1000 lookup local
$ip rule del pref 0 lookup local
$ip neigh replace 10.77.0.2 lladdr 02:00:00:00:00:0b dev va nud permanent
$ip neigh replace 10.77.0.1 lladdr 02:00:00:00:00:0a dev vb nud permanent
rdma link add rxe0 type rxe netdev va || exit 2
rdma link add rxe1 type rxe netdev vb || exit 2
ibv_devices
# The IPv4-mapped RoCE v2 GID (index 1 on rxe; 0 is the IPv6 link-local).
gid=$(for g in /sys/class/infiniband/rxe0/ports/1/gids/*; do
    case "$(cat "$g")" in 0000:0000:0000:0000:0000:ffff:*) echo "${g##*/}"; break ;; esac
done)
[ -n "$gid" ] || exit 2
set +x
: >$out/results
failed=0

# pair NAME PROGRAM ARGS...: the server on rxe1, the client on rxe0
# (connecting over TCP on 127.0.0.1 to exchange addresses), under tcpdump.
pair() {
    name=$1
    shift
    tcpdump -Z root -U -n -i va -s 0 -w /tmp/$name.pcap udp port 4791 2>/tmp/$name.tcpdump &
    cap=$!
    sleep 1
    timeout 120 "$@" -d rxe1 >$out/$name.server 2>&1 &
    srv=$!
    sleep 2
    timeout 120 "$@" -d rxe0 127.0.0.1 >$out/$name.client 2>&1
    crc=$?
    wait $srv
    src=$?
    sleep 1
    kill -INT $cap
    wait $cap
    cp /tmp/$name.pcap $out/$name.pcap
    echo "$name $crc $src" >>$out/results
    echo "$name: client $crc, server $src"
    [ $crc = 0 ] && [ $src = 0 ] || failed=1
}

pair rc_pingpong ibv_rc_pingpong -g $gid -n 20 -s 4096 -c
pair uc_pingpong ibv_uc_pingpong -g $gid -n 20 -s 4096 -c
pair ud_pingpong ibv_ud_pingpong -g $gid -n 20 -s 1024 -c
pair srq_pingpong ibv_srq_pingpong -g $gid -n 20 -s 4096 -q 4 -c
pair write_bw ib_write_bw -x $gid -F -n 200 -s 65536
pair read_bw ib_read_bw -x $gid -F -n 200 -s 65536
pair send_bw ib_send_bw -x $gid -F -n 200 -s 65536
pair atomic_fa ib_atomic_bw -x $gid -F -n 200 -A FETCH_AND_ADD
pair atomic_cs ib_atomic_bw -x $gid -F -n 200 -A CMP_AND_SWAP
pair write_lat ib_write_lat -x $gid -F -n 100 -s 64
pair read_lat ib_read_lat -x $gid -F -n 100 -s 64
exit $failed
