#!/bin/sh
# In the rxe VM (busybox sh), for interop/rxe-bench: unmodified ib_write_bw
# and ib_write_lat, server and client in this VM, over rnic's drop-in
# library (two NICs on loopback, `rnic exec` from the share), then over
# rdma_rxe (two devices on a veth pair), ROUNDS times each.
# Each run's output goes to /mnt/host/out/NAME.ROUND.{server,client}; a line
# "NAME ROUND CLIENT_RC SERVER_RC" per run to /mnt/host/out/results.
ip=/usr/sbin/ip
out=/mnt/host/out
mkdir -p $out
exec >$out/bench.log 2>&1
set -x
. /mnt/host/rxe-pair.sh
# rdma_rxe holds UDP port 4791 on every address while it is loaded, so
# rnic's rounds run first, without it, and rxe's after it is loaded again.
rxe_ko=$(grep '/rdma_rxe.ko' /etc/modules.order)
[ -n "$rxe_ko" ] || exit 2
rmmod rdma_rxe 2>/dev/null
rounds=$(cat /mnt/host/rounds)
n=$(cat /mnt/host/iterations)
rnic="/mnt/host/rnic exec --"
# rnic and its library need libgcc_s and libm, which the VM image lacks.
export LD_LIBRARY_PATH=/mnt/host/lib
set +x
: >$out/results
failed=0

# run NAME ROUND SERVER CLIENT: the server, then (once it listens) the client.
run() {
    port=$((port + 1))
    timeout 300 $3 -p $port >$out/$1.$2.server 2>&1 &
    srv=$!
    hex=$(printf '%04X' $port)
    for _ in $(seq 300); do
        awk -v p=":$hex" '$4 == "0A" && substr($2, length($2) - 4) == p { f = 1 } END { exit !f }' \
            /proc/net/tcp /proc/net/tcp6 2>/dev/null && break
        sleep 0.1
    done
    timeout 300 $4 -p $port 127.0.0.1 >$out/$1.$2.client 2>&1
    crc=$?
    wait $srv
    src=$?
    echo "$1 $2 $crc $src" >>$out/results
    echo "$1 round $2: client $crc, server $src"
    # A failed round of rnic fails the bench; one of rdma_rxe's own
    # baseline is left out of the comparison (see interop/rxe-bench).
    if [ $crc != 0 ] || [ $src != 0 ]; then
        case $1 in rnic_*) failed=1 ;; esac
    fi
}

port=18700
bw="ib_write_bw -F -s 65536 -n $n --report_gbits"
lat="ib_write_lat -F -s 64 -n $n"
for r in $(seq 1 "$rounds"); do
    run rnic_write_bw "$r" "$rnic $bw" "$rnic $bw"
    run rnic_write_lat "$r" "$rnic $lat" "$rnic $lat"
done
insmod "$rxe_ko" || exit 2
rxe_pair || exit 2
for r in $(seq 1 "$rounds"); do
    run rxe_write_bw "$r" "$bw -d rxe1 -x $gid" "$bw -d rxe0 -x $gid"
    run rxe_write_lat "$r" "$lat -d rxe1 -x $gid" "$lat -d rxe0 -x $gid"
done
exit $failed
