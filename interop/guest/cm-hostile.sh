#!/bin/sh
# In the rxe VM (busybox sh), for tests/tests/cm_hostile_vm.rs: hostile CM
# MADs both ways, to compare what the kernel's CM answers with what rnic's
# does. The kernel's side: rdma_rxe on eth0 (10.88.0.2), an `rping -s -P`
# listening on 18900 through the kernel's rdma_cm. The guest also holds
# 10.88.0.4, the address its attacker sends from, so that the answers to
# it are told apart on the wire.
#
# The steps meet the host's through files in /mnt/host/out:
#   kernel-listening  written here when rping listens;
#   rnic-listening    written by the host when rnic's listener is up: the
#                     attacker here (the test binary, /mnt/host/attacker)
#                     then sends every attack to 10.88.0.1;
#   rnic-attacked     written here when it is done;
#   kernel-attacked   written by the host when its attacker (10.88.0.3)
#                     is done with 10.88.0.2.
# Afterwards: the kernel's cm_ids and rdma_rxe's counters, in cm_ids.txt
# and rxe-counters.txt.
ip=/usr/sbin/ip
out=/mnt/host/out
mkdir -p $out
exec >$out/guest.log 2>&1
set -x
. /mnt/host/tap-rxe.sh
tap_up 1500 || exit 2
$ip addr add 10.88.0.4/24 dev eth0
rxe_on_eth0 || exit 2
rdma_cm_device

# wait_for FILE SECONDS
wait_for() {
    for _ in $(seq $(($2 * 5))); do
        [ -e "$out/$1" ] && return 0
        sleep 0.2
    done
    echo "no $1 after $2 s"
    return 1
}

timeout 600 rping -s -P -a 10.88.0.2 -p 18900 </dev/null >"$out/rping.txt" 2>&1 &
rping=$!
for _ in $(seq 300); do
    cm_listening 18900 && break
    sleep 0.1
done
cm_listening 18900 || exit 3
# The kernel's CM answers a MAD through an address handle made from its
# packet, which needs the sender's neighbour entry: the attacker's address
# is resolved first, so that no answer waits on ARP.
ping -c 1 -W 5 10.88.0.3 || exit 3
: >"$out/kernel-listening"

wait_for rnic-listening 300 || exit 4
RNIC_CM_ATTACK="10.88.0.4 10.88.0.1" timeout 120 /mnt/host/attacker \
    --exact cm_hostile_attack --ignored --nocapture --test-threads=1 \
    >"$out/attack-rnic.txt" 2>&1
rc=$?
: >"$out/rnic-attacked"
[ $rc = 0 ] || exit 5

wait_for kernel-attacked 300 || exit 6
# Late answers (the kernel retries a REP it sent) have had their time.
sleep 3
rdma res show cm_id >"$out/cm_ids.txt" 2>&1
# rdma_rxe's counters: what it took in (rcvd_pkts) and answered.
for f in /sys/class/infiniband/rxe0/ports/1/hw_counters/*; do
    echo "${f##*/} $(cat "$f")"
done >"$out/rxe-counters.txt" 2>&1
kill $rping
wait $rping
exit 0
