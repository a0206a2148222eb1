#!/bin/sh
# In the rxe VM (busybox sh): two rdma_rxe devices on the two ends of a veth
# pair run unmodified rdma-core and perftest programs against each other,
# each under tcpdump. Writes /mnt/host/out/NAME.pcap, NAME.log and a line
# "NAME CLIENT_RC SERVER_RC" per program to /mnt/host/out/results; exits
# non-zero if any program failed.

# iproute2's, not busybox's applet.
ip=/usr/sbin/ip
out=/mnt/host/out
mkdir -p $out
exec >$out/golden.log 2>&1
set -x
. /mnt/host/rxe-pair.sh
rxe_pair || exit 2
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
