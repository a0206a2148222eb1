# Sourced by the guest scripts that meet rnic on the host's tap (busybox
# sh; $ip is iproute2's): eth0, the VM's NIC on that tap, at 10.88.0.2 and
# fd88::2 (no duplicate address detection, so both are usable at once).

# tap_up MTU: eth0 up with that MTU and its addresses; the host answers.
tap_up() {
    sysctl -w net.ipv6.conf.all.accept_dad=0 net.ipv6.conf.default.accept_dad=0 net.ipv6.conf.eth0.accept_dad=0
    $ip link set eth0 mtu "$1" up
    $ip addr add 10.88.0.2/24 dev eth0
    $ip addr add fd88::2/64 dev eth0 nodad
    ping -c 1 -W 5 10.88.0.1
}

# rxe_on_eth0: rdma_rxe as rxe0 on eth0; sets $gid4 and $gid6 to its
# IPv4-mapped and IPv6 RoCE v2 GID indices, or returns 2.
rxe_on_eth0() {
    rdma link add rxe0 type rxe netdev eth0 || return 2
    gid4=$(for g in /sys/class/infiniband/rxe0/ports/1/gids/*; do
        case "$(cat "$g")" in 0000:0000:0000:0000:0000:ffff:*) echo "${g##*/}"; break ;; esac
    done)
    gid6=$(for g in /sys/class/infiniband/rxe0/ports/1/gids/*; do
        case "$(cat "$g")" in fd88:*) echo "${g##*/}"; break ;; esac
    done)
    [ -n "$gid4" ] && [ -n "$gid6" ] || return 2
}

# rdma_cm_device: librdmacm's device, the kernel's CM (devtmpfs makes it as
# rdma_ucm loads; made here from sysfs if not).
rdma_cm_device() {
    if [ ! -c /dev/infiniband/rdma_cm ] && [ -f /sys/class/misc/rdma_cm/dev ]; then
        mkdir -p /dev/infiniband
        mm=$(cat /sys/class/misc/rdma_cm/dev)
        mknod /dev/infiniband/rdma_cm c "${mm%%:*}" "${mm##*:}"
    fi
}

# cm_listening PORT: whether the kernel's CM has a listener on PORT.
cm_listening() {
    rdma res show cm_id 2>/dev/null | grep LISTEN | grep -qE ":$1( |\$)"
}
