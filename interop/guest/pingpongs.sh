#!/bin/sh
# In the rxe VM (busybox sh), for tests/tests/rxe_vm.rs: rdma_rxe on eth0
# (10.88.0.2, fd88::2), a virtio NIC on the host's tap, against rnic's Rust
# API on the host side (10.88.0.1, fd88::1). Runs the lines of
# /mnt/host/cases in order: "NAME server|client PORT PROGRAM ARGS...",
# PROGRAM on rxe0 as the server, or as the client of 10.88.0.1, with GID4
# and GID6 in ARGS replaced by rxe's IPv4 and IPv6 GID indices (rping's
# ARGS name the addresses: it finds the device through rdma_cm). Writes
# "NAME RC" per case to /mnt/host/out/results and each program's output to
# /mnt/host/out/NAME.txt; exits 0 if every case did.
ip=/usr/sbin/ip
out=/mnt/host/out
mkdir -p $out
exec >$out/guest.log 2>&1
set -x
. /mnt/host/tap-rxe.sh
tap_up 9000 || exit 2
rxe_on_eth0 || exit 2
: >$out/results
failed=0
# rping connects through rdma_cm (the kernel's CM): each side's server
# says when it listens (/mnt/host/out/NAME.listening), and the other
# side's client starts then.
rdma_cm_device
while read -r name role port prog args; do
    args=$(echo "$args" | sed "s/GID4/$gid4/g; s/GID6/$gid6/g")
    if [ "$prog" = rping ] && [ "$role" = server ]; then
        # shellcheck disable=SC2086
        timeout 180 rping -s $args -p "$port" </dev/null >"$out/$name.txt" 2>&1 &
        pid=$!
        for _ in $(seq 300); do
            cm_listening "$port" && break
            kill -0 $pid 2>/dev/null || break
            sleep 0.1
        done
        : >"$out/$name.listening"
        wait $pid
        rc=$?
    elif [ "$prog" = rping ]; then
        for _ in $(seq 600); do
            [ -e "$out/$name.listening" ] && break
            sleep 0.2
        done
        # shellcheck disable=SC2086
        timeout 180 rping -c $args -p "$port" </dev/null >"$out/$name.txt" 2>&1
        rc=$?
    elif [ "$role" = server ]; then
        # shellcheck disable=SC2086
        timeout 180 $prog -d rxe0 $args -p "$port" </dev/null >"$out/$name.txt" 2>&1
        rc=$?
    else
        # Tried again (for at most 120 s) while rnic's server is not
        # listening yet.
        for _ in $(seq 120); do
            # shellcheck disable=SC2086
            timeout 180 $prog -d rxe0 $args -p "$port" 10.88.0.1 </dev/null >"$out/$name.txt" 2>&1
            rc=$?
            [ $rc != 0 ] && grep -qiE "connect to|connection refused" "$out/$name.txt" || break
            sleep 1
        done
    fi
    echo "$name $rc" >>$out/results
    [ $rc = 0 ] || failed=1
done </mnt/host/cases
for f in /sys/class/infiniband/rxe0/ports/1/hw_counters/*; do
    echo "${f##*/}=$(cat "$f")"
done
dmesg | tail -n 20
exit $failed
